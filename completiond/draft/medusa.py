"""`completiond train-draft medusa`: Medusa heads (core/medusa.py) distilled from a target's own
hidden states on code.

1. features: the target reads code windows (`corpus.windows`, every 20th file held out); its final
   hidden states h_t [N, H] and its greedy next token g_t (argmax over the whole vocabulary) are
   kept in OUT/features.pt (read back when there: the slow part runs once).
2. train: AdamW on the heads' blocks only; the target's output rows stay frozen. Head k at position
   t learns g_{t+k}: what greedy verification accepts after k tokens that matched the text. Loss
   weights 0.8^(k-1); labels outside the sub-vocabulary are skipped. OUT/checkpoint.pt is written as
   it goes and resumed.
3. the heads go to --export (bf16 safetensors), with held-out top-1 agreement per head in its metadata.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..core.medusa import MedusaHeads
from ..core.quant import full_weight
from ..models import LoadedModel
from .corpus import source_files, windows

HOLDOUT_EVERY = 20


@torch.inference_mode()
def features(target: LoadedModel, files: list[Path], max_tokens: int, seq_len: int = 512) -> dict[str, torch.Tensor]:
    """h [N, H] (bf16), greedy [N] (the target's next token after each position), window [N]."""
    base = getattr(target.model, target.model.base_model_prefix)
    head = target.model.get_output_embeddings()
    hs, greedy, window = [], [], []
    n = 0
    with tqdm(total=max_tokens, desc="target hidden states", unit="tok") as bar:
        for i, (_, ids) in enumerate(windows(target.tokenizer, files, seq_len)):
            h = base(input_ids=torch.tensor([ids], device=target.device)).last_hidden_state[0]  # [T, H]
            g = torch.cat([head(part).argmax(-1) for part in h.split(128)])  # [T] full vocabulary
            hs.append(h.to(torch.bfloat16).cpu())
            greedy.append(g.cpu())
            window.append(torch.full((len(ids),), i))
            n += len(ids)
            bar.update(len(ids))
            if n >= max_tokens:
                break
    return {"h": torch.cat(hs), "greedy": torch.cat(greedy), "window": torch.cat(window)}


def load_or_make_features(target: LoadedModel, out: Path, tokens: int, source: str, seed: int) -> dict:
    path = out / "features.pt"
    if path.exists():
        return torch.load(path)
    files = source_files(source, seed)
    split = {"train": [f for i, f in enumerate(files) if i % HOLDOUT_EVERY], "heldout": files[::HOLDOUT_EVERY]}
    data = {name: features(target, fs, tokens if name == "train" else max(2048, tokens // HOLDOUT_EVERY))
            for name, fs in split.items()}
    out.mkdir(parents=True, exist_ok=True)
    torch.save(data, path)
    return data


def labels(part: dict, k: int, vocab: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[K, N] index into the sub-vocabulary of g_{t+k} for head k, -100 where it is not in the same
    window or not in the sub-vocabulary."""
    index = torch.full((vocab_size,), -100, dtype=torch.int64)
    index[vocab] = torch.arange(len(vocab))
    g, w = part["greedy"], part["window"]
    out = torch.full((k, len(g)), -100, dtype=torch.int64)
    for j in range(1, k + 1):
        same = w[j:] == w[:-j]
        out[j - 1, :-j] = torch.where(same, index[g[j:]], -100)
    return out


def choose_vocab(greedy: torch.Tensor, size: int) -> torch.Tensor:
    """The `size` tokens the target predicts most often on the training text (sorted ids)."""
    counts = torch.bincount(greedy)
    return counts.topk(min(size, int((counts > 0).sum()))).indices.sort().values


def train_medusa(target: LoadedModel, out: Path, tokens: int = 60_000, k: int = 3, vocab_size: int = 16384,
                 steps: int = 800, batch: int = 256, lr: float = 1e-3, seed: int = 0,
                 source: str = "stdlib") -> tuple[MedusaHeads, dict]:
    data = load_or_make_features(target, out, tokens, source, seed)
    train, held = data["train"], data["heldout"]
    ckpt_path = out / "checkpoint.pt"
    ckpt = torch.load(ckpt_path) if ckpt_path.exists() else None
    vocab = ckpt["vocab"] if ckpt else choose_vocab(train["greedy"], vocab_size)
    hidden = train["h"].shape[1]
    heads = MedusaHeads(hidden, k, vocab)
    rows = full_weight(target.model.get_output_embeddings()).detach()[vocab].to(torch.bfloat16).cpu()  # [V', H]
    opt = torch.optim.AdamW([heads.w, heads.b], lr=lr, weight_decay=0.0)
    step = 0
    if ckpt:
        heads.load_state_dict(ckpt["heads"])
        opt.load_state_dict(ckpt["opt"])
        step = ckpt["step"]
    y = labels(train, k, vocab, target.vocab_size)
    weights = torch.tensor([0.8 ** j for j in range(k)])
    gen = torch.Generator().manual_seed(seed + step)
    with tqdm(total=steps, initial=step, desc="medusa heads", unit="step") as bar:
        while step < steps:
            for group in opt.param_groups:  # cosine decay after 5% warm-up
                group["lr"] = lr * min(1.0, (step + 1) / max(1, steps // 20)) * 0.5 * (1 + math.cos(math.pi * step / steps))
            idx = torch.randint(0, len(y[0]), (batch,), generator=gen)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                z = heads(train["h"][idx].float())  # [K, B, H]
                logits = z @ rows.T  # [K, B, V']
            loss = sum(weights[j] * F.cross_entropy(logits[j].float(), y[j, idx], ignore_index=-100)
                       for j in range(k)) / weights.sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
            if step % 200 == 0 or step == steps:
                torch.save({"heads": heads.state_dict(), "opt": opt.state_dict(), "step": step, "vocab": vocab},
                           ckpt_path)
    report = evaluate(heads, rows, held, vocab, target.vocab_size)
    report.update(train_positions=len(train["greedy"]), heldout_positions=len(held["greedy"]), steps=steps,
                  vocab=len(vocab), heads=k)
    (out / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    return heads, report


@torch.no_grad()
def evaluate(heads: MedusaHeads, rows: torch.Tensor, held: dict, vocab: torch.Tensor, vocab_size: int) -> dict:
    """Held-out agreement of each head's top-1 / top-4 with the target's greedy token k places on
    (over positions whose label is in the sub-vocabulary; `coverage` says how many are)."""
    y = labels(held, heads.k, vocab, vocab_size)
    top1, top4, coverage = [], [], []
    for j in range(heads.k):
        ok = y[j] >= 0
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = heads(held["h"][ok].float())[j] @ rows.T
        top = logits.float().topk(4, -1).indices
        top1.append(round(float((top[:, 0] == y[j, ok]).float().mean()), 4))
        top4.append(round(float((top == y[j, ok][:, None]).any(-1).float().mean()), 4))
        valid = (held["window"][j + 1:] == held["window"][:-(j + 1)]).sum()
        coverage.append(round(float(ok.sum() / max(int(valid), 1)), 4))
    return {"top1_agreement": top1, "top4_agreement": top4, "label_in_vocab": coverage}


def export(heads: MedusaHeads, path: Path, target: LoadedModel, report: dict) -> Path:
    heads.save(path, {"target": target.name, "report": json.dumps(report)})
    return path
