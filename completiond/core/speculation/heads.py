"""Proposers over the target's own hidden states: Medusa heads and the EAGLE-style feature draft
(the modules and their weights: models/heads.py). The engine hands each the feature of the verify
pass that just ran, in the proposal's PassContext; each judges by depth what the target accepted."""

from __future__ import annotations

import time

import torch
from torch import nn

from ...models.heads import EagleHead, MedusaHeads
from ...models.quant import full_weight
from ..forward.context import NO_CONTEXT, PassContext
from .gate import Ewma
from .proposers import Limits, Outcome
from .tree import Candidate


class _HeadProposer:
    """What both proposers share: the readout rows, calibration by depth."""

    costly = True

    def __init__(self, heads: nn.Module, rows: torch.Tensor, depth: int):
        self.heads = heads.to(device=rows.device, dtype=rows.dtype).eval()  # the target's device
        self.rows = rows  # [V', H] the target's output layer rows for heads.vocab
        self.accepted = [Ewma(0.3, 0.05) for _ in range(depth)]  # per depth: tested nodes accepted ...
        self.raw = [Ewma(0.3, 0.05) for _ in range(depth)]  # ... and their uncalibrated probability
        self.scale = [1.0] * depth  # what the last proposal used
        self.step_ms = Ewma(0.0, 0.2)

    def pays(self, found: list[Candidate], pass_ms: float, ctx: PassContext = NO_CONTEXT) -> bool:
        return ctx.feature is not None

    def min_value(self, pass_ms: float) -> float:
        return self.step_ms.value / pass_ms if pass_ms > 0 else 0.0

    def warm(self, context: list[int], ctx: PassContext = NO_CONTEXT) -> None:
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
    def propose(self, context: list[int], limits: Limits, ctx: PassContext = NO_CONTEXT) -> list[Candidate]:
        if ctx.feature is None:
            return []
        t0 = time.perf_counter()
        depth = min(len(self.top), limits.max_len)
        p = self._readout(self.heads(ctx.feature[None].to(self.rows.dtype))[:depth, 0])  # [depth, V']
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
    def propose(self, context: list[int], limits: Limits, ctx: PassContext = NO_CONTEXT) -> list[Candidate]:
        if ctx.feature is None:
            return []
        t0 = time.perf_counter()
        scale = self._scales()
        depth = min(self.depth, limits.max_len, limits.max_nodes)
        # node i: token, parent (-1: the root), calibrated probability, path value, depth, state (once fed)
        tok, parent, prob, value, dep = [context[-1]], [-1], [1.0], [1.0], [0]
        state: dict[int, torch.Tensor] = {}
        fed_state = {0: ctx.feature.to(self.rows.dtype)}  # the state each fed node came from
        for _ in range(depth):
            if len(tok) - 1 >= limits.max_nodes:
                break  # the verify pass would cut what more steps grow
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
    weight = full_weight(target_model.get_output_embeddings())
    rows = weight[heads.vocab.to(weight.device)].to(dtype).contiguous()
    if isinstance(heads, EagleHead):
        return EagleProposer(heads, rows, target_model.get_input_embeddings().weight)
    return MedusaProposer(heads, rows)
