"""The decode loop: prefill, propose, verify, accept; one completion from prompt ids to text.

    prefill   target.extend(prompt)            prefix reuse; logits of the last prompt token -> 1st token
    propose   proposers -> candidates          prompt lookup and/or draft model, in target ids
    tree      build_tree + budget.best_size    one trie, cut to the size that pays on this device
    verify    target.forward(tree)             ONE pass: tree mask, positions = length + depth
    accept    verify.accept -> path, bonus     greedy or lossless rejection sampling
              target.keep(path)                rejected nodes are dropped by not advancing

Modes: `ar` (tree = root only: plain decoding through the same path), `pld`, `draft`, `combined`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Collection, Generator, Hashable, Iterator

import torch

from .speculation.budget import CALIBRATION_SIZES, QUICK_SIZES, TreeBudget
from .speculation.calibration import MAX_AGE_S, calibration_path, load_table, measure_costs, save_costs, stale_reason
from .speculation.gate import StepGate, could_pay, gates_path, load_gates, save_gates, slower_draft
from .speculation.index import TokenIndex
from ..models.heads import EagleHead, MedusaHeads
from .speculation.heads import head_proposer
from ..models.loaded import LoadedModel
from ..models.device import LOADED, OthersBusy, loadavg, quiet_now
from .prompt import Heal, fim_tokens, special_ids
from .speculation.proposers import DraftModel, Limits, Outcome, PromptLookup, Proposer
from .forward.context import Cancelled, PassContext
from .forward.runner import Pass, Runner, drain
from .scheduler import Work
from .slots import Slots
from .speculation.tree import TokenTree, build_tree, truncate
from .request import Alternative, Request, Result  # part of this module's API (defined apart to keep it short)
from .prompt.typed import Detokenizer, Step, TypedThrough, typed_prompt  # Step: part of this module's API
from .speculation.verify import accept, sample
from .alternatives import decode_alternatives
from .decoding import Decoding

MODES = ("ar", "pld", "draft", "combined")


def draft_id(draft: LoadedModel | MedusaHeads | EagleHead | None) -> str | None:
    """What a draft's measured gates belong to (None: no draft)."""
    if draft is None:
        return None
    if isinstance(draft, (MedusaHeads, EagleHead)):
        return f"{type(draft).__name__}|{draft.vocab.numel()}"
    return f"{draft.name}|{draft.dtype}|{draft.meta.get('quant', '')}"


def draft_for(spec: str | None, target: LoadedModel) -> tuple[LoadedModel | MedusaHeads | EagleHead | None, str | None]:
    """`load_draft(spec, target)`, except that the default draft stays unloaded where an earlier
    daemon on this machine measured it slower than prompt lookup alone (`gate.slower_draft`):
    then (None, why). A draft named by the user is always loaded."""
    from ..models.loader import default_draft, load_draft

    name = default_draft(target) if spec == "default" else None
    why = slower_draft(gates_path(target), name) if name not in (None, "none", "default") else None
    return (None, why) if why else (load_draft(spec, target), None)


def weight_share(draft: LoadedModel, target: LoadedModel) -> float:
    """The weights a draft pass reads over those a target pass reads (decoder layers and output
    layer, from the configs; a pass reads them all): about its cost in target passes."""
    def read(lm: LoadedModel) -> float:
        c = lm.model.config
        h, n = c.hidden_size, getattr(c, "num_attention_heads", 1)
        kv = getattr(c, "num_key_value_heads", n) * (getattr(c, "head_dim", None) or h // n)  # K or V width
        layer = h * (2 * h + 2 * kv) + 3 * h * c.intermediate_size
        return c.num_hidden_layers * layer + c.vocab_size * h
    return read(draft) / max(read(target), 1.0)


class Engine:
    """Target (+ optional draft) resident, with a token index for prompt lookup. One request at a time."""

    def __init__(self, target: LoadedModel, draft: LoadedModel | MedusaHeads | EagleHead | None = None,
                 index: TokenIndex | None = None,
                 capacity: int = 4096, max_nodes: int = 64, max_candidate_len: int = 16, always_speculate: bool = False,
                 draft_branch: int = 4, backend: str = "auto"):
        self.target = target
        self.runner = Runner(target, capacity, backend=backend)  # lean where the family allows
        self.index = index or TokenIndex()
        fim = fim_tokens(target.tokenizer) if target.tokenizer is not None else None
        self.fim = (fim.prefix, fim.suffix, fim.middle) if fim is not None else None
        self.prompt_lookup = PromptLookup(self.index, fim=self.fim)
        # the draft: a small model, or heads on the target's own hidden states (Medusa, EAGLE-style)
        self.heads = head_proposer(draft, target.model, target.dtype) \
            if isinstance(draft, (MedusaHeads, EagleHead)) else None
        self.draft = DraftModel(draft, capacity, branch=draft_branch, cost_share=weight_share(draft, target)) \
            if draft is not None and self.heads is None else None
        self.budget = TreeBudget(max_nodes, always=always_speculate)
        self.gates: dict[str, StepGate] = {}  # by proposer name: does a costly proposer pay, measured
        self.draft_id = draft_id(draft)  # whose gates the calibration cache keeps
        self.max_candidate_len = max_candidate_len
        self.eos = target.eos_ids() | special_ids(target.tokenizer)  # any special token ends the text
        self.lock = threading.Lock()
        # stale work: wall ms of requests that were cancelled, of warm-ups, of those preempted
        self.stats = {"requests": 0, "passes": 0, "accepted": 0, "served_tokens": 0, "cancelled": 0,
                      "cancelled_ms": 0.0, "warms": 0, "warms_preempted": 0, "warm_ms": 0.0}
        self.typed = TypedThrough()
        self.slots = Slots([self.runner] + ([self.draft.runner] if self.draft else []))  # by Request.slot

    # ---- set-up -------------------------------------------------------------------------------
    def calibrate(self, sizes: tuple[int, ...] = CALIBRATION_SIZES, context: int = 64,
                  rounds: int = 3, origin: str = "calibrated") -> dict[int, float]:
        """Measure target pass cost by tree size on this device (feeds the tree-size budget), with
        the load it ran under (others' share of the CPUs, and the load average)."""
        with self.lock:
            busy = OthersBusy()
            costs = measure_costs(self.runner, sizes, context, rounds)
            self.budget.load_costs(costs, "calibrated")
            self.budget.table = {"origin": origin, "measured_at": time.time(), "loadavg": loadavg(),
                                 "others_busy": busy.share()}
            return self.budget.costs()

    def calibrate_cached(self, sizes: tuple[int, ...] = QUICK_SIZES) -> str:
        """Pass costs from the calibration cache of this machine, model and dtype ("cached"), else a
        short measurement that is then cached ("measured"). A cached table that is old, or was
        measured under load while the machine is quiet now, is measured again ("re-measured";
        COMPLETIOND_RECALIBRATE=0 keeps it). Either way the table is only a starting point: real
        passes and probes correct every size the controller may use, and `save_calibration`
        writes them back."""
        got = load_table(calibration_path(self.target))
        if got is None:
            self.calibrate(sizes, origin="measured")
            self.save_calibration()
            return "measured"
        costs, meta = got
        suspect = (meta["measured_at"] is None or time.time() - meta["measured_at"] > MAX_AGE_S
                   or (meta["others_busy"] or 0.0) >= LOADED)
        reason = None
        if suspect and os.environ.get("COMPLETIOND_RECALIBRATE", "1") != "0":
            reason = stale_reason(meta, quiet_now())
        if reason is not None:
            self.calibrate(sizes, origin=f"re-measured: {reason}")
            self.save_calibration()
            return "re-measured"
        self.budget.load_costs(costs, "cached")
        self.budget.table = {"origin": "cached", **meta}
        # the gates measured with these costs: a returning daemon does not warm up and probe again a
        # draft that an earlier one found slower (the 0.5B for the 1.5B on 2 cores: 2-3x per token)
        if self.draft_id is not None:
            self.gates = load_gates(gates_path(self.target), self.draft_id)
        return "cached"

    def save_calibration(self) -> None:
        b = self.budget
        if self.draft_id is not None and self.gates:
            save_gates(gates_path(self.target), self.draft_id, self.gates)
        save_costs(calibration_path(self.target), b.costs(), b.table,
                   {str(n): e["source"] for n, e in b.table_status()["sizes"].items()})

    @torch.inference_mode()
    def warm(self, prompt: list[int], cancel: threading.Event | None = None, slot: Hashable = None) -> int:
        """Prefill the caches with `prompt` ahead of a request (on open, after edits, in benchmarks);
        a later request with the same prefix reuses it. Returns the tokens now cached. It stops within
        one decoder layer when `cancel` is set; every prefill chunk that finished stays cached. (The
        daemon runs `warming` as a low-priority job of its scheduler: any request goes first.)"""
        with self.turn(slot):
            return drain(self.warming(prompt, PassContext(cancel)))

    def warming(self, prompt: list[int], ctx: PassContext, draft_ctx: PassContext | None = None, *,
                target: bool = True, draft: bool = True) -> Generator[None, None, int]:
        """`warm` as steps (one per prefill chunk, then the draft's prefill), run in turns
        (core/scheduler.py); ctx's cancel stops it between layers, its preempt policy stops a chunk
        for another job. draft_ctx (default ctx) is the draft prefill's: its cancel may stop that
        alone (a request that needs the target's chunks, not the draft's, is waiting). `target` /
        `draft` False leave that model's cache as it is (the warm-up computes between the two)."""
        t0 = time.perf_counter()
        try:
            ctx.check()  # cancelled before it starts: the cache stays as it is (no rollback)
            if target:
                yield from self.runner.sync_chunks(prompt, ctx=ctx)
            if draft and self.draft is not None:  # a step of its own (sync_chunks yields after its last chunk)
                self.draft.warm(prompt, draft_ctx or ctx)
        except Cancelled:
            self.stats["warms_preempted"] += 1
        finally:
            self.stats["warms"] += 1
            self.stats["warm_ms"] += (time.perf_counter() - t0) * 1000
        return self.runner.length

    @contextlib.contextmanager
    def turn(self, slot: Hashable = None, *, pinned: Collection[Hashable] = ()) -> Iterator[None]:
        """The engine for one job's step: its slot's caches held. Slots of `pinned` keys (jobs that
        are between turns) are never evicted. The job's cancel and preempt policy are not the turn's:
        they travel with its steps, in the PassContext `run`/`warming` got."""
        with self.lock:
            self.slots.hold(slot, pinned)
            yield

    def cached_prefix_len(self, prompt: list[int], slot: Hashable = None) -> int:
        """How many leading tokens of `prompt` the target's cache of `slot` holds now (warm/cold per
        document in `status`). Thread-safe: reads a snapshot, so it may be one pass out of date."""
        held = self.slots.tokens(slot)  # one atomic copy: the engine thread may change it
        n = min(len(held), len(prompt))
        i = 0
        while i < n and held[i] == prompt[i]:
            i += 1
        return i

    def prefill_ms_per_token(self) -> float:
        """What one more prompt token costs to prefill on this device, in ms: measured on long prefill
        chunks, else a prior from the one-node pass (a chunk costs about 16 tokens per pass)."""
        return self.runner.bulk_ms_per_token or self.budget.cost(1) / 16

    def typed_prompt(self, prompt: list[int], typed: str) -> tuple[list[int], Heal | None] | None:
        """After a greedy completion for `prompt`, the user typed `typed` at its cursor: the prompt
        and heal whose continuation is the rest of that completion (served with no pass), or None
        when it is not remembered or `typed` left it. Call on the engine thread (see typed.py)."""
        entry = self.typed.find(prompt)
        return typed_prompt(self.target.tokenizer, entry, typed) if entry is not None else None

    def lookup(self, context: list[int], max_len: int = 16, n: int = 6) -> list[list[int]]:
        """What prompt lookup proposes after `context` (debugging: `debug/lookup`)."""
        limits = Limits(max_len=max_len, min_value=0.0)
        return [c.tokens for c in self.lookup_proposer(n).propose(context, limits)]

    def lookup_proposer(self, n: int) -> PromptLookup:
        return self.prompt_lookup if n == self.prompt_lookup.max_candidates else PromptLookup(self.index, n, self.fim)

    def proposers(self, mode: str) -> list[Proposer]:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}: use one of {', '.join(MODES)}")
        drafted = self.draft or self.heads
        if mode == "draft" and drafted is None:
            raise ValueError("mode 'draft' needs a draft model")
        chosen: list[Proposer] = []
        if mode in ("pld", "combined"):
            chosen.append(self.prompt_lookup)
        if mode in ("draft", "combined") and drafted is not None:
            chosen.append(drafted)
        return chosen

    # ---- one completion -----------------------------------------------------------------------
    @torch.inference_mode()
    def complete(self, req: Request, on_step: Callable[[Step], None] | None = None) -> Result:
        with self.turn(req.slot):
            return drain(self.run(req, on_step))

    def run(self, req: Request, on_step: Callable[[Step], None] | None = None,
            ctx: PassContext | None = None) -> Generator[Work, None, Result]:
        """`complete` as steps: it yields after every prefill chunk and every target pass, where a
        scheduler may give the model to another job (each step inside `turn(req.slot)`). Each
        yield is the work left (the scheduler runs the shortest first, see `work_ms`).
        ctx: the job's (the scheduler's: its cancel and preempt policy); None: the request's own
        cancel, nothing preempts it."""
        ctx = PassContext(req.cancel) if ctx is None else ctx
        proposers = self.proposers(req.mode)
        if not req.reuse_prefix:
            self.runner.reset()
            if self.draft is not None:
                self.draft.runner.reset()
        st = Decoding(req, Detokenizer(self.target.tokenizer, req.prompt, req.stops, self.eos, req.max_tokens,
                                  req.heal.text if req.heal else ""), on_step)
        st.reused = min(self.runner.common_prefix(req.prompt), len(req.prompt) - 1)
        # typed-through: the prompt extends an earlier greedy prompt by a prefix of what the target
        # verified after it, so the rest of those tokens is the greedy continuation: no pass for them
        hit = (self.typed.lookup(req.prompt, req.heal)
               if req.sampling.greedy and req.typed_through and req.reuse_prefix else None)
        served = hit[0].tokens[hit[1]:] if hit else []
        branched = req.n > 1 and not served  # served from memory: no first logits, no alternatives
        try:
            # a first step before any pass: the scheduler learns this request's size before its prefill
            # runs, so a long one can already give way inside its first chunk
            yield self.work_left(st, len(req.prompt) - st.reused)
            yield from self._prefill(st, served, ctx)
            if branched and not st.out.done:
                st.alternatives = yield from decode_alternatives(self, st, proposers, ctx)
            while not st.out.done:
                yield self.work_left(st, 0)
                ctx.check()
                if req.deadline_ms is not None and st.elapsed_ms() > req.deadline_ms:
                    st.out.stopped_by = "deadline"
                    break
                self._step(st, proposers, ctx)
        except Cancelled:
            st.cancelled = True
            st.out.stopped_by = "cancelled"
        self._account(st, len(served))
        if hit:  # tokens past a stop or a cancel were verified all the same
            self.typed.extend(*hit, st.verified)
        elif req.sampling.greedy:
            self.typed.record(req.prompt, st.verified, req.heal)
        return st.result(len(served))

    def work_left(self, st: Decoding, prompt_left: int) -> Work:
        """Work left, roughly: the prompt tokens still to prefill, and a pass per token still allowed."""
        return Work(prompt_left, st.req.max_tokens - len(st.out.ids))

    def work_ms(self, work: Work) -> float:
        """`work` in ms at today's rates. Jobs are compared at one moment's rates, not at those of the
        moment each one last ran: a per-chunk measurement's noise would otherwise make two long
        prefills look alternately shorter and run chunk by chunk."""
        return work.prompt * self.prefill_ms_per_token() + work.passes * self.budget.cost(1)

    def _prefill(self, st: Decoding, served: list[int], ctx: PassContext) -> Generator[float, None, None]:
        """The first token(s): served from memory (then the cache is brought up to them), or one pass
        over the prompt tokens the cache lacks, whose last logits give the first token."""
        req = st.req
        if served:
            st.emit(served, first=True)
            if not st.out.done:  # speculate on from the served end: the cache must hold all before it
                st.reused = min(self.runner.common_prefix(req.prompt + served), len(req.prompt))
                for _ in self.runner.sync_chunks(req.prompt + served[:-1], ctx=ctx):
                    yield self.work_left(st, len(req.prompt) + len(served) - 1 - self.runner.length)
            return
        chunks = self.runner.extend_chunks(req.prompt, ctx=ctx, whole_chunks=True)
        while True:
            try:
                next(chunks)
            except StopIteration as done:
                logits, st.feature = done.value  # [vocab], [H]
                break
            yield self.work_left(st, len(req.prompt) - self.runner.length)
        if req.heal is not None:  # only tokens that start with the healed text may come first
            allowed = torch.full_like(logits, float("-inf"))
            allowed[req.heal.allowed_ids()] = 0.0
            logits = logits + allowed
        st.first_logits = logits
        st.emit([sample(logits, req.sampling, st.gen)], first=True)

    def _step(self, st: Decoding, proposers: list[Proposer], ctx: PassContext) -> None:
        """propose -> tree -> verify (one target pass) -> accept -> keep the path, emit its tokens."""
        t0 = time.perf_counter()
        tree, gated = self.propose(st.token, proposers, st.req.max_tokens - len(st.out.ids), ctx, st.feature,
                                   max_len=st.req.max_draft_len)
        path, bonus = self.verify(st, tree, proposers, ctx)
        before = len(st.out.ids)
        st.emit([tree.tokens[i] for i in path[1:]] + [bonus])
        if gated is not None:  # the step's wall time, for the tokens the completion kept (none past its end)
            name, ran = gated
            self.gates[name].record(ran, (time.perf_counter() - t0) * 1000, max(1, len(st.out.ids) - before))

    def verify(self, st: Decoding, tree: TokenTree, proposers: list[Proposer], ctx: PassContext,
                shared: Pass | None = None, at: int = 0) -> tuple[list[int], int]:
        """Verify the main tree, accept a path and count it (`_step`). alternatives.py passes a pass
        that held other branches too (the main tree's rows start at `at`); the path is then left
        uncommitted, as that pass's other nodes are."""
        done = shared
        if done is None:
            done = self.runner.run_pass(tree.tokens, tree.parents, range(len(tree)), ctx=ctx)  # [nodes, vocab]
            self.budget.observe_pass(len(tree), done.ms)
        path, bonus = accept(tree, done.logits[at:at + len(tree)], st.req.sampling, st.gen)
        st.feature = done.hidden[at + path[-1]]  # the state the bonus token came from
        if shared is None:
            self.runner.keep(path)
        self._observe(tree, path, proposers)
        st.passes += 1
        st.accepted += len(path) - 1
        st.by_depth.extend([0] * (len(path) - len(st.by_depth)))
        for d in range(1, len(path)):
            st.by_depth[d - 1] += 1
        return path, bonus

    def _account(self, st: Decoding, served: int) -> None:
        self.stats["requests"] += 1
        self.stats["passes"] += st.passes
        self.stats["accepted"] += st.accepted
        self.stats["served_tokens"] += served
        if st.cancelled:
            self.stats["cancelled"] += 1
            self.stats["cancelled_ms"] += st.elapsed_ms()

    def propose(self, root: int, proposers: list[Proposer], remaining: int, ctx: PassContext,
                 feature: torch.Tensor | None = None, context: list[int] | None = None,
                 max_len: int | None = None) -> tuple[TokenTree, tuple[str, bool] | None]:
        """Candidates from every proposer that says it pays, merged into one tree and cut to the
        size that pays, and the gate's decision (a costly proposer's name, whether it ran; None: no
        gate asked). Prompt lookup runs first: whether the draft pays depends on what it found.
        feature: the target's hidden state `root` came from (heads read it in the proposal's ctx).
        max_len: tokens per candidate (None: max_candidate_len; a request's `max_draft_len`)."""
        max_len = min(self.max_candidate_len if max_len is None else max_len, remaining - 1)
        if max_len <= 0 or not proposers:
            return TokenTree.root_only(root), None
        context = self.runner.tokens + [root] if context is None else context  # ends with root
        ctx = dataclasses.replace(ctx, feature=feature)
        gated = None
        pass_ms = self.budget.cost(1)
        always = self.budget.always
        candidates = []
        for p in proposers:
            # a costly proposer's node must also pay for its place in the verify pass
            node_ms = (self.budget.cost(8) - pass_ms) / 7 if p.costly else 0.0
            useful = self.budget.useful_nodes() if p.costly else self.budget.max_nodes
            gate = self.gates.setdefault(p.name, StepGate()) if p.costly and not always else None
            if gate is not None and not could_pay(candidates, min(max_len, useful),
                                                                 gate.level_ms.value, pass_ms, node_ms):
                gate.excluded += 1  # not even a probe: it cannot pay here
                continue
            if not always and not p.pays(candidates, pass_ms, ctx):
                continue
            if gate is not None:  # it says it pays: the measured gate has the last word
                ran = gate.allows()
                gated = (p.name, ran)
                if not ran:
                    continue
            min_value = 0.0 if always else max(0.02, p.min_value(pass_ms) + max(node_ms, 0.0) / pass_ms)
            # and stop growing where even a certain tree would be cut (pld's lookups cost nothing)
            limits = Limits(max_len=max_len, min_value=min_value, max_nodes=useful)
            t0 = time.perf_counter()
            found = p.propose(context, limits, ctx)
            if gate is not None and found:  # what a level of its proposals costs, all included
                gate.observe_level((time.perf_counter() - t0) * 1000 / max(len(c.tokens) for c in found))
            candidates += found
        tree = build_tree(root, candidates, self.budget.max_nodes)
        return truncate(tree, self.budget.best_size(tree.value)), gated

    def _observe(self, tree: TokenTree, path: list[int], proposers: list[Proposer]) -> None:
        on_path = set(path)
        by_source: dict[str, list[Outcome]] = {}
        for i in range(1, len(tree)):
            parent = tree.parents[i]
            if parent in on_path:  # the target tested this node
                cond = tree.value[i] / max(tree.value[parent], 1e-9)
                below = tree.path_to(i)[1:]
                by_source.setdefault(tree.source[i], []).append(
                    Outcome(depth=len(below), predicted=cond, accepted=i in on_path,
                            tokens=tuple(tree.tokens[j] for j in below)))
        for p in proposers:
            if p.name in by_source:
                p.observe(by_source[p.name])
