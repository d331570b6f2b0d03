"""The draft's training corpus: Python source every machine has, labelled with the target's predictions.

Step 1 of the draft recipe (`completiond train-draft label --source stdlib|site-packages`). Files
come from the running interpreter's standard library or its installed packages (minus the
repositories the benchmarks use), in a seeded order; each file is tokenized
with the target's tokenizer and cut into windows of `seq_len` tokens that start with BOS. The target
runs one prefill per window and we keep, for every position, its top-k next-token ids and
log-probabilities. Shards are written one at a time, so a stopped run resumes at the next shard.
"""

from __future__ import annotations

import json
import random
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

SKIP_PARTS = {"site-packages", "dist-packages", "idlelib", "turtledemo", "__pycache__", "lib2to3"}
# Never train on what the benchmarks measure (they download these from PyPI).
BENCHMARK_PACKAGES = {"toolz", "cytoolz", "tlz", "boltons", "completiond", "completiond_lsp"}


def source_files(source: str = "stdlib", seed: int = 0) -> list[Path]:
    """Every .py file of the standard library or of the installed packages, in a seeded order."""
    key = {"stdlib": "stdlib", "site-packages": "purelib"}[source]
    root = Path(sysconfig.get_paths()[key])
    skip = SKIP_PARTS | BENCHMARK_PACKAGES  # parts below root: purelib's own name is not among them
    files = sorted(p for p in root.rglob("*.py") if not (skip & set(p.relative_to(root).parts))
                   and p.stat().st_size < 512 * 1024)
    random.Random(seed).shuffle(files)
    return files


def windows(tokenizer, files: list[Path], seq_len: int) -> Iterator[tuple[str, list[int]]]:
    """(file, ids) windows of at most seq_len tokens, each starting with BOS; tails < 32 tokens dropped."""
    bos = tokenizer.bos_token_id
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        ids = tokenizer.encode(text, add_special_tokens=False)
        for start in range(0, len(ids), seq_len - 1):
            chunk = ids[start:start + seq_len - 1]
            if len(chunk) >= 32:
                yield str(path), [bos] + chunk


@torch.inference_mode()
def label(target, out_dir: Path, max_tokens: int, seq_len: int = 512, shard_tokens: int = 65536,
          top_k: int = 8, seed: int = 0, holdout_every: int = 20, vocab_size: int = 16384,
          source: str = "stdlib") -> None:
    """Label windows with the target's top-k predictions; one .npz per shard, resumable.

    Every `holdout_every`-th file goes to the held-out split (shards named heldout_*), never trained on.
    The target's output layer is evaluated only over the draft's vocabulary (the ids the draft can
    express; what it is trained on is renormalised over them anyway): 16k of 262k rows of a layer
    that costs more than the rest of the target, so labelling runs ~2x faster.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    files = source_files(source, seed)
    splits = {"train": [f for i, f in enumerate(files) if i % holdout_every], "heldout": files[::holdout_every]}
    infix = "" if source == "stdlib" else f"{source}_"  # shards: train_00000.npz, train_site-packages_00000.npz
    (out_dir / ("files.json" if source == "stdlib" else f"files_{source}.json")).write_text(
        json.dumps({k: [str(f) for f in v] for k, v in splits.items()}, indent=0))
    # the vocabulary comes from the first source labelled (stdlib in the recipe) and is then kept
    vocab = draft_vocab(target.tokenizer, splits["train"], out_dir / "vocab.npy", vocab_size - 1)
    budgets = {"train": max_tokens, "heldout": max(shard_tokens, max_tokens // holdout_every)}
    for split, split_files in splits.items():
        _label_split(target, out_dir, f"{split}_{infix}", split_files, budgets[split], seq_len, shard_tokens,
                     top_k, vocab)


def draft_vocab(tokenizer, files: list[Path], path: Path, size: int, specials=(0, 1, 2, 3)) -> np.ndarray:
    """The target ids the draft can express: specials, then the most frequent ids of the training files."""
    if path.exists():
        return np.load(path)
    counts = np.zeros(len(tokenizer), dtype=np.int64)
    for f in tqdm(files, desc="counting token ids", unit="file"):
        try:
            ids = tokenizer.encode(f.read_text(encoding="utf-8"), add_special_tokens=False)
        except (UnicodeDecodeError, OSError):
            continue
        counts += np.bincount(ids, minlength=len(counts))
    order = [int(i) for i in np.argsort(-counts, kind="stable") if counts[i] > 0 and i not in specials]
    vocab = np.array((list(specials) + order)[:size], dtype=np.int64)
    np.save(path, vocab)
    return vocab


def _label_split(target, out_dir, split, files, max_tokens, seq_len, shard_tokens, top_k, vocab) -> None:
    model, tok = target.model, target.tokenizer
    bar = tqdm(total=max_tokens, desc=f"labelling {split.rstrip('_')}", unit="tok", smoothing=0.05)
    shard, buf, n_total = 0, [], 0
    for path, ids in windows(tok, files, seq_len):
        buf.append((path, ids))
        n = sum(len(b[1]) for b in buf)
        if n < shard_tokens:
            continue
        n_total += n
        _write_shard(model, out_dir / f"{split}{shard:05d}.npz", buf, top_k, seq_len, target.device, vocab)
        bar.update(n)
        shard, buf = shard + 1, []
        if n_total >= max_tokens:
            break
    bar.close()


@torch.inference_mode()
def _write_shard(model, path: Path, buf, top_k: int, seq_len: int, device, vocab: np.ndarray | None = None
                 ) -> None:
    if path.exists():
        return  # resumed run: this shard is done
    n = len(buf)
    ids = np.zeros((n, seq_len), dtype=np.int32)
    lengths = np.zeros(n, dtype=np.int32)
    top_ids = np.zeros((n, seq_len, top_k), dtype=np.int32)
    top_lp = np.zeros((n, seq_len, top_k), dtype=np.float16)
    rows = torch.as_tensor(vocab, device=device) if vocab is not None else None
    head = model.get_output_embeddings().weight
    for i, (_, seq) in enumerate(buf):
        x = torch.tensor([seq], device=device)
        hidden = model.model(input_ids=x).last_hidden_state[0]  # [T, H]
        logits = (hidden @ (head if rows is None else head[rows]).T).float()  # [T, V or len(vocab)]
        cap = getattr(model.config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        lp = torch.log_softmax(logits, -1)
        v, j = lp.topk(top_k, -1)
        if rows is not None:
            j = rows[j]
        ids[i, :len(seq)] = seq
        lengths[i] = len(seq)
        top_ids[i, :len(seq)] = j.cpu().numpy()
        top_lp[i, :len(seq)] = v.cpu().numpy()
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, ids=ids, lengths=lengths, top_ids=top_ids, top_lp=top_lp,
             files=np.array([b[0] for b in buf]))
    tmp.rename(path)
