"""Proposers: cheap guesses at the target's continuation, all behind one interface.

`propose(context, limits, ctx)` returns candidates in the target's ids, each token with an estimated
probability that the target accepts it (ctx: the job's PassContext, its cancel for a draft's
passes and the feature for heads); `observe(outcomes)` reports, for every proposed node the
target actually tested, whether it was accepted, and each proposer calibrates its estimates on that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from .gate import Ewma
from .index import TokenIndex, continuations
from ...models.loaded import LoadedModel
from ..forward.context import NO_CONTEXT, PassContext
from ..forward.runner import Runner
from .tree import Candidate


@dataclass
class Limits:
    max_len: int  # tokens per candidate
    min_value: float  # stop extending a candidate once P(whole path accepted) falls below this
    max_nodes: int = 64  # nodes worth growing in all: the verify pass would cut more (TreeBudget.useful_nodes)


@dataclass
class Outcome:
    depth: int  # 1 = first token after the root
    predicted: float  # the probability the proposer gave (conditional on the parent accepted)
    accepted: bool
    tokens: tuple[int, ...] = ()  # the node's path below the root (its last token is the node's)


class Proposer(Protocol):
    """A source of candidates. It judges itself: whether running it now pays (`pays`) and which
    candidate nodes are worth its own cost (`min_value`), from its measured cost and acceptance."""

    name: str
    costly: bool  # its proposals take measurable time: the engine's StepGate checks that they pay

    def pays(self, found: list[Candidate], pass_ms: float, ctx: PassContext = NO_CONTEXT) -> bool:
        """Run now? `found`: candidates of the proposers that ran before; pass_ms: a target pass."""
        ...

    def min_value(self, pass_ms: float) -> float:
        """Stop extending below this P(path accepted): a node must save more than it costs."""
        ...

    def propose(self, context: list[int], limits: Limits, ctx: PassContext = NO_CONTEXT) -> list[Candidate]: ...

    def observe(self, outcomes: list[Outcome]) -> None: ...

    def warm(self, context: list[int], ctx: PassContext = NO_CONTEXT) -> None:
        """Prepare for proposing after `context` (e.g. prefill a model's cache), off the hot path."""
        ...


class PromptLookup:
    """Continuations of the context's suffix found in the prompt, open buffers and workspace files.

    A FIM context ([head] <fim_prefix> P <fim_suffix> S <fim_middle> G) is looked up as the document
    reads at the cursor: P + G, the code before the cursor and what came after <fim_middle> (typed,
    then verified). Keyed on the raw context, the first steps of every completion would look up
    "<fim_middle> g1 g2", which occurs nowhere, and propose nothing. S stays in the context (moved
    ahead of P) for its own search; a continuation that repeats S's start is the cursor's own spot
    in the open buffer (the text after the cursor), not a guess at what goes there, and is dropped."""

    name = "pld"
    costly = False
    NEXT, ALT, RUN = 0, -1, -2  # kinds of node besides a leading first token (whose kind is its match bucket)

    def __init__(self, index: TokenIndex | None = None, max_candidates: int = 6,
                 fim: tuple[int, int, int] | None = None):
        self.index = index or TokenIndex()
        self.max_candidates = max_candidates
        self.fim = fim  # the target's (<fim_prefix>, <fim_suffix>, <fim_middle>) ids; None: no FIM
        # Acceptance of a leading candidate's first token by backward-match length bucket, of later
        # tokens, and of an alternative: a token beside an earlier-ranked candidate's at the same
        # place. Only one of them can be the target's token, so the alternatives are worth far less
        # (on toolz / boltons, 0.5B: 0.74-0.77 for the leading first token, 0.12-0.14 for the next
        # distinct one, 0.05-0.10 after); valued by their own match length they filled the tree.
        self.first = {b: Ewma(p, 0.05) for b, p in ((2, 0.3), (4, 0.5), (8, 0.7), (16, 0.8))}
        self.next = Ewma(0.8, 0.05)
        # A later token of a candidate whose backward match is 16+ tokens: the answer has been copying
        # its source for a while (a next edit rewriting its region), and a copy run goes on until the
        # next change, so its tokens are accepted far more often than `next`'s mix (0.997 vs 0.665 after
        # 16 next-edit renames with the 0.5B). Valued alike, runs of 32-64 tokens never paid.
        self.run = Ewma(0.9, 0.05)
        self.alt = Ewma(0.1, 0.05)
        self._kinds: dict[tuple[int, ...], int] = {}  # proposed node path -> its bucket, NEXT or ALT

    def pays(self, found: list[Candidate], pass_ms: float, ctx: PassContext = NO_CONTEXT) -> bool:
        return True  # an index lookup costs microseconds

    def min_value(self, pass_ms: float) -> float:
        return 0.0

    def warm(self, context: list[int], ctx: PassContext = NO_CONTEXT) -> None:
        pass

    @staticmethod
    def _bucket(match: int) -> int:
        return 2 if match < 4 else 4 if match < 8 else 8 if match < 16 else 16

    def document_view(self, context: list[int]) -> tuple[np.ndarray, list[int]]:
        """(the context as looked up, the tokens after the cursor): see the class."""
        ids = np.asarray(context, dtype=np.int64)
        if self.fim is None:
            return ids, []
        prefix, suffix, middle = self.fim
        m = np.flatnonzero(ids == middle)
        if not len(m):
            return ids, []
        m = int(m[-1])
        s = np.flatnonzero(ids[:m] == suffix)
        p = np.flatnonzero(ids[:m] == prefix)
        if not len(s) or not len(p) or p[-1] > s[-1]:
            return ids, []
        s, p = int(s[-1]), int(p[-1])
        after = ids[s + 1:m]
        return np.concatenate([ids[:p], ids[s:m], ids[p:s], ids[m + 1:]]), after.tolist()

    def ranked(self, context: list[int], max_len: int) -> list[tuple[list[int], int]]:
        """The continuations to propose after `context`, best first: (tokens, backward match length)."""
        view, after = self.document_view(context)
        found = continuations(view, self.index.segments(), max_len, self.max_candidates + bool(after))
        if after:
            found = [(t, m) for t, m in found if t[:4] != after[:len(t[:4])]][:self.max_candidates]
        return found

    def propose(self, context: list[int], limits: Limits, ctx: PassContext = NO_CONTEXT) -> list[Candidate]:
        return self.value(self.ranked(context, limits.max_len))

    def value(self, found: list[tuple[list[int], int]]) -> list[Candidate]:
        """`ranked`'s continuations with each token's estimated acceptance (see __init__)."""
        out = []
        parents: set[tuple[int, ...]] = set()  # paths that have a child already
        kinds = self._kinds = {}  # node path -> its kind, set by the best-ranked candidate through it
        for tokens, match in found:
            probs = []
            for i in range(len(tokens)):
                path = tuple(tokens[:i + 1])
                if path not in kinds:  # new here: beside an earlier candidate's token, or not
                    kinds[path] = (self.ALT if path[:i] in parents else self._bucket(match) if i == 0
                                   else self.RUN if self._bucket(match) == 16 else self.NEXT)
                    parents.add(path[:i])
                probs.append(self._ewma(kinds[path]).value)
            out.append(Candidate(tokens, probs, self.name))
        return out

    def _ewma(self, kind: int) -> Ewma:
        return (self.next if kind == self.NEXT else self.alt if kind == self.ALT else self.run if kind == self.RUN
                else self.first[kind])

    def observe(self, outcomes: list[Outcome]) -> None:
        for o in outcomes:
            kind = self._kinds.get(o.tokens)
            if kind is None:  # not from the last proposal (a branch's): judged by depth and value
                kind = (self.NEXT if o.depth > 1
                        else min(self.first, key=lambda b: abs(self.first[b].value - o.predicted)))
            self._ewma(kind).add(float(o.accepted))


class DraftModel:
    """A small model's guesses as a tree, grown best-first: each draft pass feeds the `branch` most
    probable unexpanded nodes (in one batch: the pass costs about as much as one token) and adds the
    `top` most likely next tokens below each; at most max_len - 1 passes after the context's.
    branch=1 grows only the greedy chain (with the runner-ups as one-token branches)."""

    name = "draft"
    costly = True

    def __init__(self, lm: LoadedModel, capacity: int = 4096, branch: int = 4, top: int = 2,
                 cost_share: float = 0.0):
        self.lm = lm
        # a draft pass's cost in target passes until one is measured: its weights' share of the
        # target's (a pass reads them all); 0 = unknown (then its first proposal sets no bound)
        self.cost_share = cost_share
        self.runner = Runner(lm, capacity, lean=True)  # lean forward, no fp32 refinement: it only ranks
        self.branch, self.top = branch, top
        # Calibration: draft probabilities times accepted.value / raw.value match observed acceptance.
        self.accepted = Ewma(0.5, 0.05)
        self.raw = Ewma(0.5, 0.05)
        self._c_used = 1.0
        self.first_accept = Ewma(0.6, 0.1)  # measured acceptance of the first draft token
        self.step_ms = Ewma(0.0, 0.2)
        self._skips = 0

    def pays(self, found: list[Candidate], pass_ms: float, ctx: PassContext = NO_CONTEXT) -> bool:
        """Run when what the draft should add beats what it costs.

        Its tokens matter where the candidates already found fail at their first token (1 - p);
        there it brings about a / (1 - a) accepted tokens (a: its measured first-token acceptance),
        each saving about one target pass, for about as many draft steps plus one. A skipped draft
        is still probed every 8th time so that its estimate can recover.
        """
        step_ms = self._step_ms(pass_ms)
        if step_ms == 0:
            return True  # not measured yet
        p = max((c.probs[0] for c in found), default=0.0)
        a = min(self.first_accept.value, 0.9)
        expected = a / (1 - a)
        if (1 - p) * expected * pass_ms > (1 + expected) * step_ms:
            return True
        self._skips += 1
        return self._skips % 8 == 0

    def min_value(self, pass_ms: float) -> float:
        return self._step_ms(pass_ms) / pass_ms if pass_ms > 0 else 0.0

    def _step_ms(self, pass_ms: float) -> float:
        return self.step_ms.value or self.cost_share * pass_ms

    @torch.inference_mode()
    def warm(self, context: list[int], ctx: PassContext = NO_CONTEXT) -> None:
        self.runner.extend(self._to_model(context), ctx=ctx)

    def _to_model(self, ids: list[int]) -> list[int]:
        if self.lm.from_target is None:
            return ids
        return self.lm.from_target[torch.tensor(ids, device=self.lm.device)].tolist()

    def _to_target(self, ids: list[int]) -> list[int]:
        if self.lm.to_target is None:
            return ids
        return self.lm.to_target[torch.tensor(ids, device=self.lm.device)].tolist()

    @torch.inference_mode()
    def propose(self, context: list[int], limits: Limits, ctx: PassContext = NO_CONTEXT) -> list[Candidate]:
        logits = self.runner.extend(self._to_model(context), ctx=ctx)[None]  # [1, V]: after the root
        unk = self.lm.meta.get("unk") if self.lm.to_target is not None else None
        c = self._c_used = self.accepted.value / max(self.raw.value, 1e-3)
        # The draft's tree; node i: its id (draft vocabulary), parent (-1: the root), calibrated
        # P(accepted | parent accepted), P(path accepted), depth, and its index in the draft's
        # uncommitted passes once fed.
        ids: list[int] = []
        parent: list[int] = []
        prob: list[float] = []
        value: list[float] = []
        depth: list[int] = []
        greedy: list[bool] = []  # the top token below its parent, and its parent greedy too
        fed: dict[int, int] = {}

        def add_children(rows: torch.Tensor, below: list[int]) -> None:
            p = torch.softmax(rows.float(), -1)  # [len(below), V]
            if unk is not None:
                p[:, unk] = 0.0
            q, top = p.topk(self.top, dim=-1)
            for node, qs, ts in zip(below, q.tolist(), top.tolist()):
                base = value[node] if node >= 0 else 1.0
                for j, (qj, tj) in enumerate(zip(qs, ts)):
                    qj = min(1.0, c * qj)
                    if base * qj < limits.min_value and not (node < 0 and j == 0):
                        break  # the root's first child always: calibration needs outcomes
                    ids.append(tj)
                    parent.append(node)
                    prob.append(qj)
                    value.append(base * qj)
                    depth.append(1 if node < 0 else depth[node] + 1)
                    greedy.append(j == 0 and (node < 0 or greedy[node]))

        add_children(logits, [-1])
        deepest = min(limits.max_len, limits.max_nodes)
        for _ in range(deepest - 1):  # as many draft passes as a chain of max_len tokens needs
            if len(ids) >= limits.max_nodes:
                break  # a bigger tree would not be verified whole: more passes would be wasted
            open_nodes = [i for i in range(len(ids)) if i not in fed and depth[i] < deepest
                          and value[i] >= limits.min_value and (self.branch > 1 or greedy[i])]
            pick = sorted(open_nodes, key=lambda i: -value[i])[:self.branch]
            if not pick:
                break  # nothing left whose children would pay for another draft pass
            step = self.runner.run_pass([ids[i] for i in pick], [fed.get(parent[i], -1) for i in pick],
                                        range(len(pick)), append=bool(fed), ctx=ctx)
            self.step_ms.add(step.ms)
            for i in pick:
                fed[i] = len(fed)
            add_children(step.logits, pick)
        target_ids = self._to_target(ids)
        has_child = set(parent)
        out = []
        for leaf in (i for i in range(len(ids)) if i not in has_child):
            path = []
            while leaf >= 0:
                path.append(leaf)
                leaf = parent[leaf]
            path.reverse()
            out.append(Candidate([target_ids[i] for i in path], [prob[i] for i in path], self.name))
        return out

    def observe(self, outcomes: list[Outcome]) -> None:
        for o in outcomes:
            self.accepted.add(float(o.accepted))
            self.raw.add(min(1.0, o.predicted / self._c_used))
        first = [o.accepted for o in outcomes if o.depth == 1]
        if first:  # a tree has several first tokens: did the target take one of them
            self.first_accept.add(float(any(first)))
