"""Would attention over earlier features lift the EAGLE-style head (issue 16)? A probe, not a draft:
one decoder layer that sees, at position t, every (h_j, e(x_{j+1})) of its window with j <= t
(EAGLE's input), trained on the same `features.pt` as the shipped residual-MLP head, scored on the
same held-out positions by the same measure (step 1: the target's greedy token after x_{t+1}, top-1
over the shipped head's sub-vocabulary). Teacher-forced, step 1 only: it measures the ceiling the
architecture buys before anyone builds the cache of head states the engine would need for it.

    z_t = W_in [h_t; e(x_{t+1})]                                     [T, H]
    a_t = z_t + Attn(RMSNorm(z))_t   (causal over the window, RoPE)   [T, H]
    s_t = a_t + MLP(RMSNorm(a_t))                                    [T, H]  ≈ h_{t+1}
    loss = smooth_l1(s_t, h_{t+1}) + 0.1 CE(E[vocab] s_t, g_{t+1})   (CE on a sample of positions)

    python benchmarks/eagle_attention_probe.py --features /tmp/heads-400k/features.pt \\
        --json benchmarks/results/heads/eagle-attention-probe.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from completiond.core.heads import load_heads, shipped_path
from completiond.core.quant import full_weight
from completiond.draft.heads import sub_index, warmup_cosine
from completiond.models import load
from completiond.models.device import cpu_name


def rope(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """x [B, heads, T, d] rotated by position (half-split, as Qwen2)."""
    t, d = x.shape[-2], x.shape[-1]
    freq = base ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = torch.arange(t, dtype=torch.float32)[:, None] * freq  # [T, d/2]
    cos, sin = torch.cat([ang.cos()] * 2, -1).to(x.dtype), torch.cat([ang.sin()] * 2, -1).to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class AttentionHead(nn.Module):
    def __init__(self, hidden: int, heads: int = 7, head_dim: int = 64, inner: int = 2048, attend: bool = True):
        super().__init__()
        self.heads, self.head_dim, self.attend = heads, head_dim, attend
        self.inp = nn.Linear(2 * hidden, hidden, bias=False)
        self.n1, self.n2 = nn.RMSNorm(hidden), nn.RMSNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * heads * head_dim, bias=True)
        self.o = nn.Linear(heads * head_dim, hidden, bias=False)
        self.up = nn.Linear(hidden, inner)
        self.down = nn.Linear(inner, hidden)
        nn.init.zeros_(self.o.weight)
        nn.init.zeros_(self.down.weight)
        nn.init.zeros_(self.down.bias)
        with torch.no_grad():  # z_t = h_t at first: the identity on the feature half
            self.inp.weight.zero_()
            self.inp.weight[:, :hidden] = torch.eye(hidden)

    def forward(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """h, e: [B, T, H] -> s [B, T, H]."""
        b, t, _ = h.shape
        z = self.inp(torch.cat([h, e], -1))
        if not self.attend:  # the ablation: the same layer without its attention block
            return z + self.down(F.silu(self.up(self.n2(z))))
        q, k, v = self.qkv(self.n1(z)).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)  # [B, heads, T, d]
        z = z + self.o(a.transpose(1, 2).reshape(b, t, -1))
        return z + self.down(F.silu(self.up(self.n2(z))))


def used_params(head: AttentionHead) -> int:
    unused = (head.qkv, head.o, head.n1) if not head.attend else ()
    return sum(p.numel() for p in head.parameters()) - sum(p.numel() for m in unused for p in m.parameters())


def window_batches(part: dict, index: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per window: inputs at t = 0..T-2 (h_t, x_{t+1}), targets h_{t+1}, labels g_{t+1} (sub-vocab index)."""
    out = []
    w = part["window"]
    starts = torch.cat([torch.tensor([0]), (w[1:] != w[:-1]).nonzero()[:, 0] + 1, torch.tensor([len(w)])])
    for a, b in zip(starts[:-1].tolist(), starts[1:].tolist()):
        if b - a >= 2:
            out.append((torch.arange(a, b - 1), part["ids"][a + 1:b], index[part["greedy"][a + 1:b]]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--features", type=Path, required=True)
    ap.add_argument("--target", default="qwen2.5-coder-0.5b")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--windows", type=int, default=4, help="windows per step")
    ap.add_argument("--ce-positions", type=int, default=512, help="positions per step scored by the token loss")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-attention", action="store_true", help="the ablation: drop the attention block")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    target = load(a.target, "target", "cpu", "auto", "auto")
    shipped, _ = load_heads(shipped_path(target.name, "eagle"))
    vocab = shipped.vocab  # the shipped head's sub-vocabulary: the same labels as its held-out score
    rows = full_weight(target.model.get_output_embeddings()).detach()[vocab].to(torch.bfloat16)  # [V', H]
    embed = target.model.get_input_embeddings().weight.detach().to(torch.bfloat16)
    index = sub_index(vocab, target.vocab_size)
    data = torch.load(a.features)
    train, held = (window_batches(data[s], index) for s in ("train", "heldout"))
    head = AttentionHead(rows.shape[1], attend=not a.no_attention)
    opt = torch.optim.AdamW(head.parameters(), lr=a.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(a.seed)

    def run(part: dict, batch: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        t = min(len(p) for p, _, _ in batch)  # windows of one step cut to the shortest (most are 511)
        pos = torch.stack([p[:t] for p, _, _ in batch])  # [B, T]
        nxt = torch.stack([x[:t] for _, x, _ in batch])
        y = torch.stack([g[:t] for _, _, g in batch])
        s = head(part["h"][pos].float(), embed[nxt].float())
        return s, part["h"][pos + 1].float(), y

    t0 = time.time()
    with tqdm(total=a.steps, desc="attention head", unit="step") as bar:
        for step in range(a.steps):
            for group in opt.param_groups:
                group["lr"] = warmup_cosine(step, a.steps, a.lr)  # as train-draft heads
            pick = torch.randint(0, len(train), (a.windows,), generator=gen).tolist()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                s, h_next, y = run(data["train"], [train[i] for i in pick])
                reg = F.smooth_l1_loss(s.float(), h_next)
                flat, yf = s.reshape(-1, s.shape[-1]), y.reshape(-1)
                some = torch.randperm(len(yf), generator=gen)[:a.ce_positions]
                ce = F.cross_entropy((flat[some] @ rows.T).float(), yf[some], ignore_index=-100)
            loss = reg + 0.1 * torch.nan_to_num(ce)
            opt.zero_grad()
            loss.backward()
            opt.step()
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")

    @torch.no_grad()
    def score(part: dict, batches: list) -> dict:
        hit = ok = n = 0
        for batch in batches:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                s, _, y = run(part, [batch])
                guess = (s[0] @ rows.T).float().argmax(-1)
            inside = y[0] >= 0
            hit += int((guess[inside] == y[0][inside]).sum())
            ok += int(inside.sum())
            n += len(y[0])
        return {"top1_agreement": round(hit / ok, 4), "top1_all": round(hit / n, 4), "positions": n}

    result = {"date": datetime.date.today().isoformat(), "command": " ".join(["python"] + sys.argv),
              "cpu": cpu_name(), "target": target.name, "train_minutes": round((time.time() - t0) / 60, 1),
              "attention": head.attend, "params": used_params(head), "vocab": len(vocab),
              "heldout_step1": score(data["heldout"], held),
              "train_step1_first_80_windows": score(data["train"], train[:80]),
              "shipped_mlp_head": "held-out step 1: top1_agreement 0.4034, top1_all 0.3864 (fit-400k.json)"}
    print(json.dumps(result, indent=2))
    if a.json:
        a.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
