"""Medusa heads (issue 16): K residual blocks on the target's last hidden state, each guessing one
token further ahead, read out through the target's own output layer over a fixed sub-vocabulary.

    h        [H]      the target's final hidden state (after its final norm) at the token before
                      the root; the target's head turned it into the root itself
    z_k      [H]      h + SiLU(W_k h + b_k), k = 1..K   (W_k = 0 at first: z_k = h)
    logits_k [V']     E[vocab] z_k   (E: the target's output layer, V' of its rows)
    head k guesses the token k places after the root.

No extra target pass: h is a row of the verify pass that just ran (`Runner.last_hidden`). The
candidates are the tree of top-k products (top[0] tokens of head 1, below each the top[1] of head 2,
...), each node's probability its head's softmax, scaled per depth by what the target accepted.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .budget import Ewma
from .proposers import Limits, Outcome
from .tree import Candidate

SHIPPED = Path(__file__).resolve().parent.parent / "draft" / "medusa"  # <target name>.safetensors


class MedusaHeads(nn.Module):
    name = "medusa"  # models.load_medusa names loaded heads after their file

    def __init__(self, hidden: int, k: int, vocab: torch.Tensor):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(k, hidden, hidden))  # [K, H, H]
        self.b = nn.Parameter(torch.zeros(k, hidden))  # [K, H]
        self.register_buffer("vocab", vocab.to(torch.int64))  # [V'] target ids the heads can say

    @property
    def k(self) -> int:
        return self.w.shape[0]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h: [n, H] -> z: [K, n, H] (read out with the target's output rows E[vocab])."""
        return h[None] + F.silu(torch.einsum("kij,nj->kni", self.w, h) + self.b[:, None])

    def save(self, path: Path, meta: dict[str, str]) -> None:
        from safetensors.torch import save_file

        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {"w": self.w.detach().to(torch.bfloat16).contiguous(),
                   "b": self.b.detach().to(torch.bfloat16).contiguous(), "vocab": self.vocab.to(torch.int32)}
        save_file(tensors, str(path), metadata=meta)

    @classmethod
    def load(cls, path: Path) -> tuple["MedusaHeads", dict[str, str]]:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            w, b, vocab = (f.get_tensor(n) for n in ("w", "b", "vocab"))
        heads = cls(w.shape[1], w.shape[0], vocab)
        with torch.no_grad():
            heads.w.copy_(w.float())
            heads.b.copy_(b.float())
        return heads, meta


def shipped_path(target_name: str) -> Path:
    return SHIPPED / f"{target_name}.safetensors"


class MedusaProposer:
    """A `Proposer`. The engine sets `feature` (h above) before each `propose`; None: no guess."""

    name = "medusa"

    def __init__(self, heads: MedusaHeads, head_rows: torch.Tensor, top: tuple[int, ...] = (4, 2, 2)):
        self.heads = heads.to(head_rows.dtype).eval()
        self.rows = head_rows  # [V', H] the target's output layer rows for heads.vocab
        self.top = top[:heads.k]
        self.feature: torch.Tensor | None = None
        # per depth: acceptance of the nodes the target tested, and their uncalibrated probability
        self.accepted = [Ewma(0.3, 0.05) for _ in range(heads.k)]
        self.raw = [Ewma(0.3, 0.05) for _ in range(heads.k)]
        self.step_ms = Ewma(0.0, 0.2)
        self._scale = [1.0] * heads.k  # the per-depth scale the last proposal used

    def pays(self, found: list[Candidate], pass_ms: float) -> bool:
        return self.feature is not None

    def min_value(self, pass_ms: float) -> float:
        return self.step_ms.value / pass_ms if pass_ms > 0 else 0.0

    def warm(self, context: list[int]) -> None:
        pass

    @torch.inference_mode()
    def propose(self, context: list[int], limits: Limits) -> list[Candidate]:
        if self.feature is None:
            return []
        t0 = time.perf_counter()
        z = self.heads(self.feature[None].to(self.rows.dtype))[:, 0]  # [K, H]
        p = torch.softmax((z @ self.rows.T).float(), -1)  # [K, V']
        depth = min(len(self.top), limits.max_len)
        q, ids = p[:depth].topk(max(self.top[:depth]), dim=-1)
        q, ids = q.tolist(), self.heads.vocab[ids].tolist()
        scale = self._scale = [a.value / max(r.value, 1e-3) for a, r in zip(self.accepted, self.raw)]
        paths: list[tuple[list[int], list[float], float]] = [([], [], 1.0)]
        out = []  # every path at every depth: build_tree merges shared prefixes
        for d in range(depth):
            paths = [(tokens + [ids[d][j]], probs + [pj], value * pj)
                     for tokens, probs, value in paths for j in range(self.top[d])
                     if (pj := min(1.0, scale[d] * q[d][j])) * value >= limits.min_value or (d == 0 and j == 0)]
            out += [Candidate(t, pr, self.name) for t, pr, _ in paths]
        self.step_ms.add((time.perf_counter() - t0) * 1000)
        return out

    def observe(self, outcomes: list[Outcome]) -> None:
        for o in outcomes:
            d = o.depth - 1
            if d < len(self.accepted):  # (the first node of depth 1 is always proposed: outcomes keep coming)
                self.accepted[d].add(float(o.accepted))
                self.raw[d].add(min(1.0, o.predicted / max(self._scale[d], 1e-3)))


def medusa_proposer(heads: MedusaHeads, target_head: nn.Module, dtype: torch.dtype) -> MedusaProposer:
    """The proposer over the target's output layer rows for the heads' vocabulary (full precision)."""
    from .quant import full_weight

    rows = full_weight(target_head)[heads.vocab.to(full_weight(target_head).device)].to(dtype)
    return MedusaProposer(heads, rows.contiguous())
