"""Drafts that read the target's own hidden states: Medusa heads and an EAGLE-style
feature draft. Both read out through the target's own output layer over a fixed sub-vocabulary
(E[vocab], V' rows), and need no extra target pass: their input h is a row of the verify pass that
just ran (`Runner.last_hidden`: the final hidden state, after the final norm, that gave the root).

Medusa (`MedusaHeads`): K residual blocks, head k guesses the token k places after the root.

    z_k      [H]      h + SiLU(W_k h + b_k), k = 1..K   (W_k = 0 at first: z_k = h)
    logits_k [V']     E[vocab] z_k
    candidates: the tree of top-k products (top[0] tokens of head 1, below each top[1] of head 2 ...)

EAGLE-style (`EagleHead`): the next hidden state from this one and the next token's embedding,
drafted autoregressively (fed its own guesses), grown as a tree best-first. One residual MLP, no
attention: EAGLE's decoder layer also attends to earlier features; here h carries the context.

    s_0 = h                                       the state that gave the root y_1
    s_i = s_{i-1} + W_2 SiLU(W_1 [s_{i-1}; e(y_i)] + b_1)      [H]   (e: the target's embedding)
    p_i = softmax(E[vocab] s_i)                   [V']  guesses y_{i+1}

Each node's probability is its softmax, scaled per depth by what the target accepted.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


KINDS = ("medusa", "eagle")
SHIPPED = Path(__file__).resolve().parent.parent / "draft" / "head_weights"  # <target>.<kind>.safetensors


class MedusaHeads(nn.Module):
    kind = "medusa"
    name = "medusa"  # models.load_heads names loaded heads after their file

    def __init__(self, hidden: int, k: int, vocab: torch.Tensor):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(k, hidden, hidden))  # [K, H, H]
        self.b = nn.Parameter(torch.zeros(k, hidden))  # [K, H]
        self.register_buffer("vocab", vocab.to(torch.int64))  # [V'] target ids the heads can say

    @property
    def k(self) -> int:
        return self.w.shape[0]

    @property
    def hidden(self) -> int:
        return self.w.shape[1]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h: [n, H] -> z: [K, n, H]."""
        return h[None] + F.silu(torch.einsum("kij,nj->kni", self.w, h) + self.b[:, None])


class EagleHead(nn.Module):
    kind = "eagle"
    name = "eagle"

    def __init__(self, hidden: int, inner: int, vocab: torch.Tensor):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(inner, 2 * hidden) / (2 * hidden) ** 0.5)  # [I, 2H]
        self.b1 = nn.Parameter(torch.zeros(inner))
        self.w2 = nn.Parameter(torch.zeros(hidden, inner))  # [H, I]: s_1 = s_0 at first
        self.register_buffer("vocab", vocab.to(torch.int64))

    @property
    def hidden(self) -> int:
        return self.w2.shape[0]

    def forward(self, s: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """s: [n, H] states, e: [n, H] embeddings of the tokens they produced -> next states [n, H]."""
        return s + F.silu(torch.cat([s, e], -1) @ self.w1.T + self.b1) @ self.w2.T


def save_heads(heads: nn.Module, path: Path, meta: dict[str, str]) -> None:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {n: p.detach().to(torch.bfloat16).contiguous() for n, p in heads.named_parameters()}
    tensors["vocab"] = heads.vocab.to(torch.int32)
    save_file(tensors, str(path), metadata={**meta, "kind": heads.kind})


def load_heads(path: Path) -> tuple[nn.Module, dict[str, str]]:
    """MedusaHeads or EagleHead from a file `save_heads` wrote."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        t = {n: f.get_tensor(n) for n in f.keys()}
    if meta.get("kind", "medusa") == "eagle":
        heads = EagleHead(t["w2"].shape[0], t["w2"].shape[1], t["vocab"])
    else:
        heads = MedusaHeads(t["w"].shape[1], t["w"].shape[0], t["vocab"])
    with torch.no_grad():
        for n, p in heads.named_parameters():
            p.copy_(t[n].float())
    return heads, meta


def shipped_path(target_name: str, kind: str) -> Path:
    return SHIPPED / f"{target_name}.{kind}.safetensors"
