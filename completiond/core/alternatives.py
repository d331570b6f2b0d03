"""Alternatives: up to n suggestions for one completion, decoded in the same target passes.

The first suggestion is the greedy one, decoded exactly as without alternatives (same proposers, same
acceptance: token-identical). The others start from the runners-up of the first token (the prompt's
last logits already rank them) and are continued greedily. Every pass holds one tree per branch: the
main tree from all proposers, the others from prompt lookup (copying from the prompt is what a
completion mostly does; a draft model keeps one cached sequence, the main one's). On a CPU a pass of a
few dozen nodes costs little more than one of a few, so the alternatives ride along.

The branches share the committed prompt; what each verifies stays uncommitted in the cache (a chain
per branch below the prompt, positions from the prompt's end), and the rejected nodes of every pass
are dropped (`Runner.compact`). When the main branch is done the others get a few more passes
(`EXTRA_PASSES`), then stop; an alternative cut there keeps its whole lines. At the end the main
branch's tokens are committed, so the cache holds what a single completion leaves.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from .speculation.proposers import PromptLookup, Proposer
from .request import Alternative
from .forward.context import Cancelled, PassContext
from .scheduler import Work
from .speculation.tree import TokenTree, truncate
from .prompt.typed import Detokenizer
from .speculation.verify import Sampling, accept

if TYPE_CHECKING:
    import torch

    from .decoding import Decoding
    from .forward.runner import Pass, Runner
    from .speculation.budget import TreeBudget
    from ..models.loaded import LoadedModel

MAX_N = 3
# What the alternatives may add to the single suggestion's cost. The first run on the 0.5B (no cap on
# their trees, 0.25 of the main passes after it; benchmarks/results/alternatives-0.5b-v1.json) cost
# 1.56x the single suggestion's time: 1.24x the passes, and passes dearer for their larger trees.
EXTRA_PASSES = 0.1  # after the main branch is done: at most this share of its passes more (at least 1)
ALT_NODES = 4  # nodes of an alternative's tree below its root at most: a short copy run
# A pass's cost grows with its nodes (on a CPU whose matmuls are compute-bound, nearly in proportion):
# the alternatives' trees (beyond their roots, always run) get the nodes that keep the pass within
# this share of the main tree's own pass cost, by the tree-size budget's cost table.
PASS_SHARE = 1.25
GREEDY = Sampling()


class EngineSteps(Protocol):
    """The steps of `Engine` (core/engine.py) that decode the main branch here: the same proposals,
    verification and work estimates as its own decode loop."""
    target: LoadedModel
    runner: Runner
    budget: TreeBudget
    eos: set[int]

    def work_left(self, st: Decoding, prompt_left: int) -> Work: ...

    def propose(self, root: int, proposers: list[Proposer], remaining: int, ctx: PassContext,
                feature: torch.Tensor | None = None, context: list[int] | None = None
                ) -> tuple[TokenTree, tuple[str, bool] | None]: ...

    def verify(self, st: Decoding, tree: TokenTree, proposers: list[Proposer], ctx: PassContext,
               shared: Pass | None = None, at: int = 0) -> tuple[list[int], int]: ...


@dataclass
class Branch:
    """An alternative being decoded: its detokenizer, and its verified tokens' uncommitted nodes."""
    out: Detokenizer
    token: int  # the last verified token: the root of its next tree (not in the cache yet)
    verified: list[int]
    nodes: list[int] = field(default_factory=list)  # indices among the runner's uncommitted nodes

    @property
    def tail(self) -> int:
        return self.nodes[-1] if self.nodes else -1  # -1: hangs below the committed prompt


def first_tokens(st: Decoding, eos: set[int], n: int) -> list[int]:
    """The n best first tokens after the main one (the target's ranking of the prompt's last logits),
    skipping end-of-sequence tokens and those a heal rules out (-inf)."""
    logits = st.first_logits
    k = min(len(logits), n + len(eos) + 1)
    values, ids = logits.topk(k)
    main = st.verified[0]
    out = [int(t) for v, t in zip(values.tolist(), ids.tolist())
           if t != main and t not in eos and v != float("-inf")]
    return out[:n]


def decode_alternatives(engine: EngineSteps, st: Decoding, proposers: list[Proposer], ctx: PassContext
                        ) -> Generator[Work, None, list[Alternative]]:
    """Decode the main branch to its end (as `Engine._step` would) with up to n - 1 alternatives beside
    it; returns the alternatives (distinct, non-empty texts that differ from the main one). Raises
    Cancelled as a pass does; the main branch's tokens are committed either way."""
    req, runner = st.req, engine.runner
    alts: list[Branch] = []
    for t in first_tokens(st, engine.eos, min(req.n, MAX_N) - 1):
        out = Detokenizer(engine.target.tokenizer, req.prompt, req.stops, engine.eos, req.max_tokens,
                          req.heal.text if req.heal else "")
        out.push([t])
        alts.append(Branch(out, t, [t]))
    lookup = [p for p in proposers if isinstance(p, PromptLookup)]
    main_nodes: list[int] = []
    runner.compact([])  # nothing uncommitted after the prefill; from here every pass appends
    saved = runner.pending()  # restored at each turn: another job's turn in between forgets them
    extra = 0
    try:
        while not st.out.done or any(not b.out.done for b in alts):
            if st.out.done:
                extra += 1
                if extra > max(1, int(st.passes * EXTRA_PASSES)):
                    break
            yield engine.work_left(st, 0)
            ctx.check()
            if req.deadline_ms is not None and st.elapsed_ms() > req.deadline_ms:
                if not st.out.done:
                    st.out.stopped_by = "deadline"
                break
            runner.restore_pending(*saved)
            ids: list[int] = []
            parents: list[int] = []
            first = len(saved[0])
            trees: list[tuple[Branch | None, TokenTree, int]] = []
            if not st.out.done:
                tree, _ = engine.propose(st.token, proposers, req.max_tokens - len(st.out.ids), ctx, st.feature,
                                          context=runner.tokens + st.verified)  # the gate learns from _step only
                trees.append((None, tree, len(ids)))
                _add(ids, parents, tree, main_nodes[-1] if main_nodes else -1, first)
            live_alts = [b for b in alts if not b.out.done]
            main_cost = engine.budget.cost(max(1, len(ids)))
            for k, b in enumerate(live_alts):
                tree, _ = engine.propose(b.token, lookup, req.max_tokens - len(b.out.ids), ctx,
                                          context=runner.tokens + b.verified)
                rest = len(live_alts) - k  # this root and the later ones are run in any case
                room = 0
                while room < min(ALT_NODES, len(tree) - 1) and \
                        engine.budget.cost(len(ids) + rest + room + 1) <= PASS_SHARE * main_cost:
                    room += 1
                tree = truncate(tree, room)
                trees.append((b, tree, len(ids)))
                _add(ids, parents, tree, b.tail, first)
            done = runner.run_pass(ids, parents, range(len(ids)), append=True, ctx=ctx)  # [len(ids), vocab]
            engine.budget.observe_pass(len(ids), done.ms)
            if st.out.done:
                st.passes += 1  # a pass for the alternatives alone: the request's cost all the same
            for b, tree, at in trees:
                if b is None:
                    path, bonus = engine.verify(st, tree, proposers, ctx, done, at)
                    main_nodes += [first + at + i for i in path]
                    st.emit([tree.tokens[i] for i in path[1:]] + [bonus])
                else:
                    path, bonus = accept(tree, done.logits[at:at + len(tree)], GREEDY, None)
                    b.nodes += [first + at + i for i in path]
                    new = [tree.tokens[i] for i in path[1:]] + [bonus]
                    b.verified += new
                    b.token = new[-1]
                    b.out.push(new)
            # only the branches' verified chains stay; rejected nodes are dropped, indices renumbered
            live = sorted(main_nodes + [i for b in alts for i in b.nodes])
            renumber = {old: i for i, old in enumerate(live)}
            runner.compact(live)
            main_nodes = [renumber[i] for i in main_nodes]
            for b in alts:
                b.nodes = [renumber[i] for i in b.nodes]
            saved = runner.pending()
    except Cancelled:  # raised in this job's turn (a closed generator must not touch the runner)
        _commit(runner, saved, main_nodes)
        raise
    _commit(runner, saved, main_nodes)
    return _distinct(st.out.text, alts)


def _commit(runner, saved: tuple[list[int], list[int]], main_nodes: list[int]) -> None:
    """Commit the main branch's verified nodes: the cache then holds what a single completion leaves."""
    runner.restore_pending(*saved)
    runner.compact(main_nodes)
    runner.keep(range(len(main_nodes)))


def _add(ids: list[int], parents: list[int], tree: TokenTree, tail: int, first: int) -> None:
    """Append a branch's tree to the pass: its root below the branch's last node, the rest below theirs."""
    at = first + len(ids)
    ids += tree.tokens
    parents += [tail if p < 0 else at + p for p in tree.parents]


def _distinct(main: str, alts: list[Branch]) -> list[Alternative]:
    out: list[Alternative] = []
    seen = {main}
    for b in alts:
        text, stopped = b.out.text, b.out.stopped_by
        if not stopped:  # cut where the main branch ended: keep its whole lines
            stopped = "alternatives_budget"
            if "\n" in text.rstrip("\n"):
                text = text[:text.rstrip("\n").rfind("\n") + 1]
        text = text.rstrip("\ufffd")
        if text.strip() and text not in seen:
            seen.add(text)
            out.append(Alternative(text, list(b.out.ids), stopped))
    return out
