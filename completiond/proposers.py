"""Proposers: cheap guesses at the target's continuation, all behind one interface.

`propose(context, limits)` returns candidates in the target's ids, each token with an estimated
probability that the target accepts it; `observe(outcomes)` reports, for every proposed node the
target actually tested, whether it was accepted, and each proposer calibrates its estimates on that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from .adaptive import Ewma
from .index import TokenIndex, continuations
from .models import LoadedModel
from .runner import Runner
from .tree import Candidate


@dataclass
class Limits:
    max_len: int  # tokens per candidate
    min_value: float  # stop extending a candidate once P(whole path accepted) falls below this


@dataclass
class Outcome:
    depth: int  # 1 = first token after the root
    predicted: float  # the probability the proposer gave (conditional on the parent accepted)
    accepted: bool


class Proposer(Protocol):
    name: str

    def propose(self, context: list[int], limits: Limits) -> list[Candidate]: ...

    def observe(self, outcomes: list[Outcome]) -> None: ...


class PromptLookup:
    """Continuations of the context's suffix found in the prompt, open buffers and workspace files."""

    name = "pld"

    def __init__(self, index: TokenIndex | None = None, max_candidates: int = 6):
        self.index = index or TokenIndex()
        self.max_candidates = max_candidates
        # Acceptance of the first token by backward-match length bucket, and of later tokens.
        self.first = {b: Ewma(p, 0.05) for b, p in ((2, 0.3), (4, 0.5), (8, 0.7), (16, 0.8))}
        self.next = Ewma(0.8, 0.05)
        self._last_match: dict[int, int] = {}

    @staticmethod
    def _bucket(match: int) -> int:
        return 2 if match < 4 else 4 if match < 8 else 8 if match < 16 else 16

    def propose(self, context: list[int], limits: Limits) -> list[Candidate]:
        found = continuations(np.asarray(context, dtype=np.int64), self.index.segments(),
                              limits.max_len, self.max_candidates)
        out = []
        for tokens, match in found:
            p0 = self.first[self._bucket(match)].value
            probs = [p0] + [self.next.value] * (len(tokens) - 1)
            out.append(Candidate(tokens, probs, self.name))
        return out

    def observe(self, outcomes: list[Outcome]) -> None:
        for o in outcomes:
            if o.depth > 1:
                self.next.add(float(o.accepted))
            else:
                bucket = min(self.first, key=lambda b: abs(self.first[b].value - o.predicted))
                self.first[bucket].add(float(o.accepted))


class DraftModel:
    """A small model's greedy chain (and its runner-up token at each step as a one-token branch)."""

    name = "draft"

    def __init__(self, lm: LoadedModel, capacity: int = 4096):
        self.lm = lm
        self.runner = Runner(lm, capacity)
        # Calibration: draft probabilities times accepted.value / raw.value match observed acceptance.
        self.accepted = Ewma(0.5, 0.05)
        self.raw = Ewma(0.5, 0.05)
        self._c_used = 1.0
        self.first_accept = Ewma(0.6, 0.1)  # measured acceptance of the first draft token
        self.step_ms = Ewma(0.0, 0.2)

    def _to_model(self, ids: list[int]) -> list[int]:
        if self.lm.from_target is None:
            return ids
        return self.lm.from_target[torch.tensor(ids, device=self.lm.device)].tolist()

    def _to_target(self, ids: torch.Tensor) -> list[int]:
        return (self.lm.to_target[ids] if self.lm.to_target is not None else ids).tolist()

    @torch.inference_mode()
    def propose(self, context: list[int], limits: Limits) -> list[Candidate]:
        logits = self.runner.extend(self._to_model(context))
        unk = self.lm.meta.get("unk") if self.lm.to_target is not None else None
        chain: list[int] = []
        probs: list[float] = []
        out: list[Candidate] = []
        value = 1.0
        c = self._c_used = self.accepted.value / max(self.raw.value, 1e-3)
        for _ in range(limits.max_len):
            p = torch.softmax(logits.float(), -1)
            if unk is not None:
                p[unk] = 0.0
            q, ids = p.topk(2)
            tok, alt = self._to_target(ids)
            q1, q2 = min(1.0, c * float(q[0])), min(1.0, c * float(q[1]))
            if value * q2 >= limits.min_value:
                out.append(Candidate(chain + [alt], probs + [q2], self.name))
            chain.append(tok)  # the first token is always proposed: calibration needs outcomes
            probs.append(q1)
            value *= q1
            if len(chain) == limits.max_len or value < limits.min_value:
                break  # another draft step would not pay for itself
            logits = self.runner.forward([int(ids[0])], [-1], [0])[0]
            self.runner.keep([0])
            self.step_ms.add(self.runner.last_pass_ms)
        if chain:
            out.insert(0, Candidate(chain, probs, self.name))
        return out

    def observe(self, outcomes: list[Outcome]) -> None:
        for o in outcomes:
            self.accepted.add(float(o.accepted))
            self.raw.add(min(1.0, o.predicted / self._c_used))
            if o.depth == 1:
                self.first_accept.add(float(o.accepted))
