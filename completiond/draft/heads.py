"""`completiond train-draft heads --kind medusa|eagle`: drafts that read the target's own hidden
states (models/heads.py), distilled from the target on code.

1. features: the target reads code windows (`corpus.windows`, every 20th file held out); its final
   hidden states h_t [N, H], the tokens x_t and its greedy next token g_t (argmax over the whole
   vocabulary: what greedy verification accepts) are kept in OUT/features.pt, read back when there.
2. train (AdamW; the target's output rows and embedding stay frozen; OUT/<kind>/checkpoint.pt is
   written as it goes and resumed):
   - medusa: head k at t learns g_{t+k} (cross-entropy over the sub-vocabulary, weights 0.8^(k-1));
   - eagle: from (h_t, e(x_{t+1})) the next state s_1 ≈ h_{t+1} (smooth L1) whose readout is
     g_{t+1} (cross-entropy, weight --ce-weight: EAGLE's 0.1), unrolled for a second step from
     its own s_1.
   Labels outside the sub-vocabulary (the V' tokens the target predicts most often) are skipped.
3. the heads go to --export (bf16 safetensors), held-out top-1 agreement per step in the metadata.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from ..models.heads import EagleHead, MedusaHeads, save_heads
from ..models.quant import full_weight
from ..models.loaded import LoadedModel
from .corpus import source_files, windows

HOLDOUT_EVERY = 20
EAGLE_UNROLL = 2


@torch.inference_mode()
def features(target: LoadedModel, files: list[Path], max_tokens: int, seq_len: int = 512) -> dict[str, torch.Tensor]:
    """h [N, H] (bf16), ids [N], greedy [N] (the target's next token after each position), window [N]."""
    base = getattr(target.model, target.model.base_model_prefix)
    head = target.model.get_output_embeddings()
    hs, ids_, greedy, window = [], [], [], []
    n = 0
    with tqdm(total=max_tokens, desc="target hidden states", unit="tok") as bar:
        for i, (_, ids) in enumerate(windows(target.tokenizer, files, seq_len)):
            h = base(input_ids=torch.tensor([ids], device=target.device)).last_hidden_state[0]  # [T, H]
            hs.append(h.to(torch.bfloat16).cpu())
            greedy.append(torch.cat([head(part).argmax(-1) for part in h.split(128)]).cpu())  # whole vocabulary
            ids_.append(torch.tensor(ids))
            window.append(torch.full((len(ids),), i))
            n += len(ids)
            bar.update(len(ids))
            if n >= max_tokens:
                break
    return {"h": torch.cat(hs), "ids": torch.cat(ids_), "greedy": torch.cat(greedy), "window": torch.cat(window)}


def load_or_make_features(target: LoadedModel, out: Path, tokens: int, source: str, seed: int) -> dict:
    path = out / "features.pt"
    files = source_files(source, seed)
    split = {"train": [f for i, f in enumerate(files) if i % HOLDOUT_EVERY], "heldout": files[::HOLDOUT_EVERY]}
    if path.exists():
        data = torch.load(path)
        for name, part in data.items():  # written before the ids were kept: the same windows again
            if "ids" not in part:
                it = (torch.tensor(ids) for _, ids in windows(target.tokenizer, split[name], 512))
                got, n = [], 0
                while n < len(part["h"]):
                    got.append(next(it))
                    n += len(got[-1])
                part["ids"] = torch.cat(got)
                assert len(part["ids"]) == len(part["h"]), "features.pt does not match its windows"
        return data
    data = {name: features(target, fs, tokens if name == "train" else max(2048, tokens // HOLDOUT_EVERY))
            for name, fs in split.items()}
    out.mkdir(parents=True, exist_ok=True)
    torch.save(data, path)
    return data


def sub_index(vocab: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """target id -> index in the sub-vocabulary, -100 (ignored by the loss) outside it."""
    index = torch.full((vocab_size,), -100, dtype=torch.int64)
    index[vocab] = torch.arange(len(vocab))
    return index


def labels(part: dict, k: int, vocab: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[K, N]: the sub-vocabulary index of g_{t+j} (j = 1..K), -100 where t+j leaves t's window or
    the token is not in the sub-vocabulary."""
    index = sub_index(vocab, vocab_size)
    g, w = part["greedy"], part["window"]
    out = torch.full((k, len(g)), -100, dtype=torch.int64)
    for j in range(1, k + 1):
        same = w[j:] == w[:-j]
        out[j - 1, :-j] = torch.where(same, index[g[j:]], -100)
    return out


def choose_vocab(greedy: torch.Tensor, size: int, total: int) -> torch.Tensor:
    """Sorted ids: the `size` tokens the target predicts most often on the training text; when it
    predicted fewer distinct ones, the rest are the lowest unseen ids (BPE merges come in order of
    frequency, so low ids are common pieces)."""
    counts = torch.bincount(greedy, minlength=total)
    seen = (counts > 0).nonzero()[:, 0]
    if len(seen) >= size:
        return counts.topk(size).indices.sort().values
    unseen = (counts == 0).nonzero()[:, 0][: size - len(seen)]
    return torch.cat([seen, unseen]).sort().values


class Task:
    """One kind's batches, loss and held-out agreement (per head, or per unrolled step)."""

    def __init__(self, kind: str, part: dict, vocab: torch.Tensor, vocab_size: int, k: int,
                 rows: torch.Tensor, embed: torch.Tensor, ce_weight: float = 0.1):
        self.kind, self.part, self.rows, self.embed, self.ce_weight = kind, part, rows, embed, ce_weight
        self.steps = k if kind == "medusa" else EAGLE_UNROLL
        self.y = labels(part, self.steps, vocab, vocab_size)  # [steps, N]
        w = part["window"]
        ok = torch.ones(len(w), dtype=torch.bool)
        ok[-self.steps:] = False
        ok[:-self.steps] = w[self.steps:] == w[:-self.steps]  # t .. t+steps in one window
        self.whole = ok.nonzero()[:, 0]  # every position with its next `steps` tokens in its window
        self.valid = self.whole if kind == "eagle" else (self.y[0] >= 0).nonzero()[:, 0]

    def logits(self, heads: nn.Module, idx: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Per step: logits [B, V'] over the sub-vocabulary; and the feature loss (eagle; else 0)."""
        h = self.part["h"]
        if self.kind == "medusa":
            return list(heads(h[idx].float()) @ self.rows.T), torch.zeros(())
        s, reg, out = h[idx].float(), torch.zeros(()), []
        for j in range(1, self.steps + 1):
            s = heads(s, self.embed[self.part["ids"][idx + j]].float())  # s_j ≈ h_{t+j}
            reg = reg + F.smooth_l1_loss(s, h[idx + j].float())
            out.append(s @ self.rows.T)
        return out, reg

    def loss(self, heads: nn.Module, idx: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits, reg = self.logits(heads, idx)
        ce = [torch.nan_to_num(F.cross_entropy(lg.float(), self.y[j, idx], ignore_index=-100))  # nan: no label
              for j, lg in enumerate(logits)]
        if self.kind == "medusa":
            weights = [0.8 ** j for j in range(len(ce))]
            return sum(w * c for w, c in zip(weights, ce)) / sum(weights)
        return reg + self.ce_weight * sum(ce)

    @torch.no_grad()
    def agreement(self, heads: nn.Module) -> dict:
        """top1_agreement: over the positions whose label the sub-vocabulary holds; top1_all: over
        every position (a label outside it is a miss), what compares sub-vocabularies of two sizes."""
        idx = self.whole
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits, _ = self.logits(heads, idx)
        top1, top1_all = [], []
        for j, lg in enumerate(logits):
            ok = self.y[j, idx] >= 0
            hit = lg.float().argmax(-1)[ok] == self.y[j, idx][ok]
            top1.append(round(float(hit.float().mean()), 4))
            top1_all.append(round(float(hit.sum()) / len(idx), 4))
        return {"top1_agreement": top1, "top1_all": top1_all, "positions": len(idx),
                "label_in_vocab": round(float((self.y[0, idx] >= 0).float().mean()), 4)}


def warmup_cosine(step: int, steps: int, peak: float) -> float:
    """The learning rate at `step` of `steps`: linear warm-up over the first 5%, then cosine decay."""
    return peak * min(1.0, (step + 1) / max(1, steps // 20)) * 0.5 * (1 + math.cos(math.pi * step / steps))


def train_heads(target: LoadedModel, out: Path, kind: str = "eagle", tokens: int = 60_000, k: int = 3,
                vocab_size: int = 16384, steps: int = 800, batch: int = 256, lr: float = 1e-3, seed: int = 0,
                source: str = "stdlib", inner: int = 1024, ce_weight: float = 0.1) -> tuple[nn.Module, dict]:
    data = load_or_make_features(target, out, tokens, source, seed)
    ckpt_path = out / kind / "checkpoint.pt"
    ckpt = torch.load(ckpt_path) if ckpt_path.exists() else None
    vocab = ckpt["vocab"] if ckpt else choose_vocab(data["train"]["greedy"], vocab_size, target.vocab_size)
    hidden = data["train"]["h"].shape[1]
    torch.manual_seed(seed)
    heads = MedusaHeads(hidden, k, vocab) if kind == "medusa" else EagleHead(hidden, inner, vocab)
    rows = full_weight(target.model.get_output_embeddings()).detach()[vocab].to(torch.bfloat16).cpu()  # [V', H]
    embed = target.model.get_input_embeddings().weight.detach().to(torch.bfloat16).cpu()
    train, held = (Task(kind, data[s], vocab, target.vocab_size, k, rows, embed, ce_weight) for s in ("train", "heldout"))
    opt = torch.optim.AdamW(heads.parameters(), lr=lr, weight_decay=0.0)
    step = 0
    if ckpt:
        heads.load_state_dict(ckpt["heads"])
        opt.load_state_dict(ckpt["opt"])
        step = ckpt["step"]
    gen = torch.Generator().manual_seed(seed + step)
    with tqdm(total=steps, initial=step, desc=f"{kind} heads", unit="step") as bar:
        while step < steps:
            for group in opt.param_groups:
                group["lr"] = warmup_cosine(step, steps, lr)
            idx = train.valid[torch.randint(0, len(train.valid), (batch,), generator=gen)]
            loss = train.loss(heads, idx)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
            if step % 200 == 0 or step == steps:
                ckpt_path.parent.mkdir(parents=True, exist_ok=True)
                torch.save({"heads": heads.state_dict(), "opt": opt.state_dict(), "step": step, "vocab": vocab},
                           ckpt_path)
    report = {"kind": kind, **held.agreement(heads), "train_positions": len(train.valid), "steps": steps,
              "vocab": len(vocab), **({"ce_weight": ce_weight} if kind == "eagle" else {})}
    (out / kind / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    return heads, report


def export(heads: nn.Module, path: Path, target: LoadedModel, report: dict) -> Path:
    save_heads(heads, path, {"target": target.name, "report": json.dumps(report)})
    return path
