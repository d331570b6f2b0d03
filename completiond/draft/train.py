"""Step 2 of the draft recipe: train a small Gemma-3-style model to agree with the target.

The draft reads and writes a pruned vocabulary: the most frequent ids of the labelled corpus (plus
the special tokens) and one `unk` id for everything else, with an id map back to the target's
262,144 ids. Its embeddings start as a PCA projection of the target's. The loss is cross-entropy
against the target's top-k distribution (renormalised over what the draft can express), so the
draft learns what the *target* would say, not just the text. Checkpoints every `save_every` steps;
a stopped run resumes exactly (same data order, optimizer and RNG state).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm


@dataclass
class TrainConfig:
    vocab: int = 16384  # draft ids, the last one is unk
    hidden: int = 320
    layers: int = 4  # 4 layers: a step costs ~1/10 of a target pass on 2 CPU cores (6 layers: ~1/8)
    heads: int = 5
    kv_heads: int = 1
    head_dim: int = 64
    intermediate: int = 1280
    window: int = 512
    batch: int = 8  # sequences of the corpus window length
    steps: int = 1000
    lr: float = 2e-3
    warmup: int = 50
    weight_decay: float = 0.01
    seed: int = 0
    save_every: int = 25
    bf16_autocast: bool = True


def load_shards(corpus: Path, split: str) -> dict[str, np.ndarray]:
    paths = sorted(corpus.glob(f"{split}_*.npz"))
    if not paths:
        raise FileNotFoundError(f"no {split}_*.npz shards in {corpus}: run `completiond train-draft label` first")
    parts = [np.load(p) for p in paths]
    return {k: np.concatenate([p[k] for p in parts]) for k in ("ids", "lengths", "top_ids", "top_lp")}


def choose_vocab(data: dict[str, np.ndarray], size: int, specials: list[int]) -> np.ndarray:
    """Target ids the draft keeps: specials, then the most frequent inputs and labels (size - 1; +unk)."""
    mask = np.arange(data["ids"].shape[1])[None, :] < data["lengths"][:, None]
    counts = np.bincount(data["ids"][mask], minlength=262144).astype(np.int64)
    counts += np.bincount(data["top_ids"][..., 0][mask], minlength=len(counts))
    order = [i for i in np.argsort(-counts, kind="stable") if counts[i] > 0 and i not in specials]
    keep = list(dict.fromkeys(specials)) + order
    return np.array(keep[: size - 1], dtype=np.int64)


def make_model(cfg: TrainConfig, target_embed: torch.Tensor | None, keep: np.ndarray, bos: int, eos: int):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads, num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.head_dim, query_pre_attn_scalar=cfg.head_dim, sliding_window=cfg.window,
        # every layer sliding: attention distances never exceed what training saw, at any prompt length
        layer_types=["sliding_attention"] * cfg.layers, max_position_embeddings=32768,
        bos_token_id=bos, eos_token_id=eos, pad_token_id=0, tie_word_embeddings=True)
    torch.manual_seed(cfg.seed)
    model = Gemma3ForCausalLM(config)
    if target_embed is not None:
        # PCA of the kept rows of the target's embedding -> the draft's width, at the draft's init scale
        e = target_embed[torch.from_numpy(keep)].float()
        e = e - e.mean(0, keepdim=True)
        _, _, v = torch.linalg.svd(e, full_matrices=False)
        proj = e @ v[: cfg.hidden].T
        proj = proj / proj.std() * config.initializer_range
        with torch.no_grad():
            w = model.get_input_embeddings().weight
            w[: len(keep)] = proj
    return model


def soft_targets(top_ids: torch.Tensor, top_lp: torch.Tensor, from_target: torch.Tensor, unk: int):
    """[B, T, K] target top-k -> draft ids and probabilities renormalised over expressible ids."""
    d = from_target[top_ids]
    p = top_lp.float().exp() * (d != unk)
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-6)
    return d, p


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def batch_order(n: int, cfg: TrainConfig, step: int) -> np.ndarray:
    """Sequence indices of a step: a seeded permutation per epoch, so resuming repeats nothing."""
    per_epoch = n // cfg.batch
    epoch, i = divmod(step, per_epoch)
    perm = np.random.default_rng(cfg.seed + epoch).permutation(n)
    return perm[i * cfg.batch:(i + 1) * cfg.batch]


def loss_on(model, ids, lengths, top_ids, top_lp, from_target, unk, autocast: bool):
    x = from_target[ids]  # [B, T] draft ids
    T = x.shape[1]
    valid = torch.arange(T)[None, :] < lengths[:, None]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=x).logits  # [B, T, V]
    logp = F.log_softmax(logits.float(), -1)
    d, p = soft_targets(top_ids, top_lp, from_target, unk)
    loss = -(logp.gather(-1, d) * p).sum(-1)
    agree = (logits.argmax(-1) == d[..., 0]) & (d[..., 0] != unk)
    n = valid.sum()
    return (loss * valid).sum() / n, (agree & valid).sum().float() / n


CHECKPOINT_KEYS = {"cfg", "keep", "model", "step", "log"}


def load_checkpoint(path: Path) -> dict:
    """A checkpoint written by `train`; ValueError (one line) for anything else. Tensors and plain
    values only (weights_only): a pickle in the file cannot run code."""
    try:
        ck = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:  # torch raises many kinds (pickle, zip, EOF) for a file that is not a checkpoint
        raise ValueError(f"{path}: not a train-draft checkpoint ({type(e).__name__})") from None
    if not isinstance(ck, dict) or not CHECKPOINT_KEYS <= ck.keys():
        missing = sorted(CHECKPOINT_KEYS - ck.keys()) if isinstance(ck, dict) else "everything"
        raise ValueError(f"{path}: not a train-draft checkpoint (missing {missing})")
    ck["keep"] = np.asarray(ck["keep"], dtype=np.int64)  # saved as a tensor (weights_only has no numpy)
    return ck


def train(corpus: Path, out: Path, cfg: TrainConfig, target_embed_fn=None, specials: list[int] | None = None,
          bos: int = 2, eos: int = 1) -> Path:
    """Train (or resume) into out/; returns the checkpoint path. `target_embed_fn()` -> embedding matrix."""
    data = load_shards(corpus, "train")
    held = load_shards(corpus, "heldout")
    out.mkdir(parents=True, exist_ok=True)  # only once the corpus is known to be there
    ckpt_path = out / "checkpoint.pt"
    torch.manual_seed(cfg.seed)
    if ckpt_path.exists():
        ck = load_checkpoint(ckpt_path)
        cfg = replace(TrainConfig(**ck["cfg"]), steps=cfg.steps)  # architecture from the checkpoint
        keep = ck["keep"]
        model = make_model(cfg, None, keep, bos, eos)
        model.load_state_dict(ck["model"])
        step = ck["step"]
        log = ck["log"]
    else:
        vocab_file = corpus / "vocab.npy"  # the ids the labels were computed over (corpus.draft_vocab)
        keep = np.load(vocab_file) if vocab_file.exists() else choose_vocab(data, cfg.vocab, specials or [0, 1, 2, 3])
        model = make_model(cfg, target_embed_fn() if target_embed_fn else None, keep, bos, eos)
        step, log, ck = 0, [], None
    unk = cfg.vocab - 1
    from_target = torch.full((262144,), unk, dtype=torch.long)
    from_target[torch.from_numpy(keep)] = torch.arange(len(keep))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    if ck is not None:
        opt.load_state_dict(ck["opt"])
        torch.set_rng_state(ck["rng"])
    tensors = {k: torch.from_numpy(v.astype(np.int64 if k != "top_lp" else np.float32)) for k, v in data.items()}
    n = len(tensors["ids"])
    model.train()
    bar = tqdm(total=cfg.steps, initial=step, desc="training draft", unit="step")
    t0 = time.time()
    while step < cfg.steps:
        idx = torch.from_numpy(batch_order(n, cfg, step))
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        loss, agree = loss_on(model, *(tensors[k][idx] for k in ("ids", "lengths", "top_ids", "top_lp")),
                              from_target, unk, cfg.bf16_autocast)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        loss_v, agree_v = loss.item(), agree.item()
        log.append({"step": step, "loss": round(loss_v, 4), "agree": round(agree_v, 4)})
        bar.set_postfix(loss=f"{loss_v:.3f}", agree=f"{agree_v:.3f}")
        bar.update(1)
        if step % cfg.save_every == 0 or step == cfg.steps:
            log[-1]["heldout_agree"] = round(evaluate(model, held, from_target, unk, cfg), 4)
            log[-1]["elapsed_s"] = round(time.time() - t0, 1)
            tmp = ckpt_path.with_suffix(".tmp")
            torch.save({"cfg": asdict(cfg), "keep": torch.from_numpy(keep), "model": model.state_dict(), "opt": opt.state_dict(),
                        "step": step, "log": log, "rng": torch.get_rng_state()}, tmp)
            tmp.rename(ckpt_path)
            bar.write(f"step {step}: loss {log[-1]['loss']} heldout top-1 agreement {log[-1]['heldout_agree']}")
    bar.close()
    return ckpt_path


@torch.no_grad()
def evaluate(model, held: dict[str, np.ndarray], from_target, unk, cfg: TrainConfig, max_seqs: int = 32) -> float:
    """Top-1 agreement of draft argmax with the target's argmax on held-out files."""
    model.eval()
    t = {k: torch.from_numpy(v[:max_seqs].astype(np.int64 if k != "top_lp" else np.float32))
         for k, v in held.items()}
    agree_sum, n_sum = 0.0, 0
    for s in range(0, len(t["ids"]), cfg.batch):
        sl = slice(s, s + cfg.batch)
        n = int((torch.arange(t["ids"].shape[1])[None, :] < t["lengths"][sl, None]).sum())
        _, agree = loss_on(model, t["ids"][sl], t["lengths"][sl], t["top_ids"][sl], t["top_lp"][sl],
                           from_target, unk, cfg.bf16_autocast)
        agree_sum += float(agree) * n
        n_sum += n
    model.train()
    return agree_sum / max(1, n_sum)


def export(ckpt: Path | dict, out_dir: Path, card: dict) -> Path:
    """Write the shipped draft: bf16 safetensors, config, vocab map and a model card."""
    ck = load_checkpoint(ckpt) if isinstance(ckpt, Path) else ckpt
    cfg = TrainConfig(**ck["cfg"])
    keep = ck["keep"]
    model = make_model(cfg, None, keep, card.get("bos", 2), card.get("eos", 1))
    model.load_state_dict(ck["model"])
    model = model.to(torch.bfloat16)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    (out_dir / "vocab_map.json").write_text(json.dumps({
        "name": card.get("name", "completiond-draft"), "target": card.get("target", ""),
        "target_vocab_size": 262144, "unk": cfg.vocab - 1, "target_ids": [int(i) for i in keep]}))
    last = ck["log"][-1] if ck["log"] else {}
    evals = [r for r in ck["log"] if "heldout_agree" in r]
    lines = [f"# {card.get('name', 'completiond-draft')}", "",
             "A draft model for completiond's speculative decoding, trained to agree with the target.", "",
             f"- target: {card.get('target', '')}",
             f"- architecture: Gemma 3 text, {cfg.layers} layers, hidden {cfg.hidden}, {cfg.heads} heads "
             f"({cfg.kv_heads} KV), head dim {cfg.head_dim}, MLP {cfg.intermediate}, sliding window {cfg.window} "
             f"on every layer; {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, bf16",
             f"- vocabulary: {cfg.vocab - 1} most frequent target ids of the corpus + 1 unk; id map in vocab_map.json",
             f"- data: {card.get('data', '')}",
             f"- training: {ck['step']} steps x {cfg.batch} sequences, AdamW lr {cfg.lr}, cosine, seed {cfg.seed}; "
             f"loss = cross-entropy against the target's top-k distribution",
             f"- final training loss {last.get('loss')}, top-1 agreement with the target on held-out files "
             f"{evals[-1]['heldout_agree'] if evals else 'n/a'}",
             f"- recipe: {card.get('recipe', '')}",
             "", card.get("extra", ""), ""]
    (out_dir / "MODEL_CARD.md").write_text("\n".join(lines))
    return out_dir
