"""Drafts that read the target's own hidden states (issue 16): Medusa heads and an EAGLE-style
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

import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .budget import Ewma
from .proposers import Limits, Outcome
from .tree import Candidate

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


class _HeadProposer:
    """What both proposers share: the readout rows, the feature the engine sets, calibration by depth."""

    def __init__(self, heads: nn.Module, rows: torch.Tensor, depth: int):
        self.heads = heads.to(device=rows.device, dtype=rows.dtype).eval()  # the target's device
        self.rows = rows  # [V', H] the target's output layer rows for heads.vocab
        self.feature: torch.Tensor | None = None  # [H] set by the engine before each propose
        self.accepted = [Ewma(0.3, 0.05) for _ in range(depth)]  # per depth: tested nodes accepted ...
        self.raw = [Ewma(0.3, 0.05) for _ in range(depth)]  # ... and their uncalibrated probability
        self.scale = [1.0] * depth  # what the last proposal used
        self.step_ms = Ewma(0.0, 0.2)

    def pays(self, found: list[Candidate], pass_ms: float) -> bool:
        return self.feature is not None

    def min_value(self, pass_ms: float) -> float:
        return self.step_ms.value / pass_ms if pass_ms > 0 else 0.0

    def warm(self, context: list[int]) -> None:
        pass

    def _scales(self) -> list[float]:
        self.scale = [a.value / max(r.value, 1e-3) for a, r in zip(self.accepted, self.raw)]
        return self.scale

    def _readout(self, z: torch.Tensor) -> torch.Tensor:
        """[n, H] states -> [n, V'] float32 probabilities."""
        return torch.softmax((z.to(self.rows.dtype) @ self.rows.T).float(), -1)

    def observe(self, outcomes: list[Outcome]) -> None:
        for o in outcomes:  # the first node of depth 1 is always proposed: outcomes keep coming
            d = o.depth - 1
            if d < len(self.accepted):
                self.accepted[d].add(float(o.accepted))
                self.raw[d].add(min(1.0, o.predicted / max(self.scale[d], 1e-3)))


class MedusaProposer(_HeadProposer):
    name = "medusa"

    def __init__(self, heads: MedusaHeads, rows: torch.Tensor, top: tuple[int, ...] = (4, 2, 2)):
        super().__init__(heads, rows, heads.k)
        self.top = top[:heads.k]

    @torch.inference_mode()
    def propose(self, context: list[int], limits: Limits) -> list[Candidate]:
        if self.feature is None:
            return []
        t0 = time.perf_counter()
        depth = min(len(self.top), limits.max_len)
        p = self._readout(self.heads(self.feature[None].to(self.rows.dtype))[:depth, 0])  # [depth, V']
        q, ids = p.topk(max(self.top[:depth]), dim=-1)
        q, ids = q.tolist(), self.heads.vocab[ids].tolist()
        scale = self._scales()
        paths: list[tuple[list[int], list[float], float]] = [([], [], 1.0)]
        out = []  # every path at every depth: build_tree merges shared prefixes
        for d in range(depth):
            paths = [(tokens + [ids[d][j]], probs + [pj], value * pj)
                     for tokens, probs, value in paths for j in range(self.top[d])
                     if (pj := min(1.0, scale[d] * q[d][j])) * value >= limits.min_value or (d == 0 and j == 0)]
            out += [Candidate(t, pr, self.name) for t, pr, _ in paths]
        self.step_ms.add((time.perf_counter() - t0) * 1000)
        return out


class EagleProposer(_HeadProposer):
    """Grows a tree best-first: each step feeds the `branch` most probable unexpanded nodes (one
    batch) and adds the `top` most likely tokens below each, up to `depth` tokens past the root."""

    name = "eagle"

    def __init__(self, heads: EagleHead, rows: torch.Tensor, embed: torch.Tensor, depth: int = 3,
                 branch: int = 2, top: int = 2):
        super().__init__(heads, rows, depth)
        self.embed = embed  # the target's input embedding [V, H]
        self.depth, self.branch, self.top = depth, branch, top

    @torch.inference_mode()
    def propose(self, context: list[int], limits: Limits) -> list[Candidate]:
        if self.feature is None:
            return []
        t0 = time.perf_counter()
        scale = self._scales()
        depth = min(self.depth, limits.max_len)
        # node i: token, parent (-1: the root), calibrated probability, path value, depth, state (once fed)
        tok, parent, prob, value, dep = [context[-1]], [-1], [1.0], [1.0], [0]
        state: dict[int, torch.Tensor] = {}
        fed_state = {0: self.feature.to(self.rows.dtype)}  # the state each fed node came from
        for _ in range(depth):
            open_nodes = [i for i in range(len(tok)) if i not in state and i in fed_state
                          and dep[i] < depth and (value[i] >= limits.min_value or i == 0)]
            pick = sorted(open_nodes, key=lambda i: -value[i])[:self.branch]
            if not pick:
                break
            s = self.heads(torch.stack([fed_state[i] for i in pick]),
                           self.embed[torch.tensor([tok[i] for i in pick])].to(self.rows.dtype))  # [b, H]
            q, ids = self._readout(s).topk(self.top, dim=-1)
            for row, i in enumerate(pick):
                state[i] = s[row]
                for j, (qj, tj) in enumerate(zip(q[row].tolist(), self.heads.vocab[ids[row]].tolist())):
                    pj = min(1.0, scale[dep[i]] * qj)
                    if value[i] * pj < limits.min_value and not (i == 0 and j == 0):
                        break
                    tok.append(tj)
                    parent.append(i)
                    prob.append(pj)
                    value.append(value[i] * pj)
                    dep.append(dep[i] + 1)
                    fed_state[len(tok) - 1] = s[row]
        out = []
        inner = set(parent)
        for leaf in (i for i in range(1, len(tok)) if i not in inner):
            path = []
            while leaf > 0:
                path.append(leaf)
                leaf = parent[leaf]
            path.reverse()
            out.append(Candidate([tok[i] for i in path], [prob[i] for i in path], self.name))
        self.step_ms.add((time.perf_counter() - t0) * 1000)
        return out


def head_proposer(heads: nn.Module, target_model: nn.Module, dtype: torch.dtype) -> _HeadProposer:
    """The proposer for these heads over the target's output rows for their vocabulary (full precision)."""
    from .quant import full_weight

    weight = full_weight(target_model.get_output_embeddings())
    rows = weight[heads.vocab.to(weight.device)].to(dtype).contiguous()
    if isinstance(heads, EagleHead):
        return EagleProposer(heads, rows, target_model.get_input_embeddings().weight)
    return MedusaProposer(heads, rows)
