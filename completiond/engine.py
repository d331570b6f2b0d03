"""The decode loop: prefill, propose, verify, accept; one completion from prompt ids to text.

    prefill   target.extend(prompt)            prefix reuse; logits of the last prompt token -> 1st token
    propose   proposers -> candidates          prompt lookup and/or draft model, in target ids
    tree      build_tree + adaptive.best_size  one trie, cut to the size that pays on this device
    verify    target.forward(tree)             ONE pass: tree mask, positions = length + depth
    accept    verify.accept -> path, bonus     greedy or lossless rejection sampling
              target.keep(path)                rejected nodes are dropped by not advancing

Modes: `ar` (tree = root only: plain decoding through the same path), `pld`, `draft`, `combined`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .adaptive import Adaptive
from .index import TokenIndex
from .device import cpu_name
from .models import LoadedModel
from .paths import cache_root
from .prompt import Heal
from .proposers import DraftModel, Limits, Outcome, PromptLookup, Proposer
from .runner import Cancelled, Runner
from .stops import StopRules
from .tree import TokenTree, build_tree
from .verify import Sampling, accept, sample

MODES = ("ar", "pld", "draft", "combined")


@dataclass
class Request:
    prompt: list[int]
    mode: str = "combined"
    max_tokens: int = 64
    sampling: Sampling = field(default_factory=Sampling)
    seed: int | None = None
    stops: StopRules = field(default_factory=StopRules)
    deadline_ms: float | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    reuse_prefix: bool = True  # False: prefill the whole prompt (benchmarks measure what reuse saves)
    heal: Heal | None = None  # token healing: constrains the first token, hides the text it repeats


@dataclass
class Step:
    """What one target pass added: new token ids and the text they add to the completion."""
    token_ids: list[int]
    text: str


@dataclass
class Result:
    text: str
    token_ids: list[int]
    tokens: list[str]
    mode: str
    target_passes: int
    mean_accepted: float
    ms_first_token: float
    ms_total: float
    stopped_by: str
    cancelled: bool = False
    prompt_tokens: int = 0
    reused_tokens: int = 0
    accepted_by_depth: list[int] = field(default_factory=list)


class Output:
    """Generated ids -> completion text, applying the stop rules token by token."""

    def __init__(self, tokenizer, prompt: list[int], stops: StopRules, eos: set[int], max_tokens: int,
                 hidden: str = ""):
        self.tok = tokenizer
        self.hidden = hidden  # leading text the editor already shows (a healed token's text)
        self.tail = prompt[-4:]  # decoded with the completion so leading spaces survive detokenization
        self.tail_text = self.decode(self.tail)
        self.stops, self.eos, self.max_tokens = stops, eos, max_tokens
        self.ids: list[int] = []
        self.text = ""
        self.emitted = 0
        self.stopped_by = ""

    def decode(self, ids: list[int]) -> str:
        if self.tok is None:
            return "".join(f"<{i}>" for i in ids)
        return self.tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def push(self, ids: list[int]) -> Step:
        """Add accepted tokens in order until a stop rule fires; return the text not yet emitted."""
        added: list[int] = []
        for t in ids:
            if t in self.eos:
                self.stopped_by = "eos"
                break
            self.ids.append(t)
            added.append(t)
            full = self.decode(self.tail + self.ids)
            text = full[len(self.tail_text):] if full.startswith(self.tail_text) else self.decode(self.ids)
            text = text[len(self.hidden):] if text.startswith(self.hidden) else ""
            cut = self.stops.cut(text)
            if cut is not None:
                self.text, self.stopped_by = text[:cut], "stop_rule"
                break
            self.text = text
            if len(self.ids) >= self.max_tokens:
                self.stopped_by = "max_tokens"
                break
        # hold back an incomplete UTF-8 sequence (shown as U+FFFD) until its bytes arrive
        stable = self.text if self.stopped_by else self.text.rstrip("\ufffd")
        delta = stable[self.emitted:] if len(stable) > self.emitted else ""
        self.emitted = max(self.emitted, len(stable))
        return Step(added, delta)

    @property
    def done(self) -> bool:
        return bool(self.stopped_by)


class Engine:
    """Target (+ optional draft) resident, with a token index for prompt lookup. One request at a time."""

    def __init__(self, target: LoadedModel, draft: LoadedModel | None = None, index: TokenIndex | None = None,
                 capacity: int = 4096, max_nodes: int = 64, max_candidate_len: int = 16, always_speculate: bool = False,
                 draft_branch: int = 4, backend: str = "auto"):
        self.target = target
        self.runner = Runner(target, capacity, backend=backend)  # lean where the family allows
        self.index = index or TokenIndex()
        self.prompt_lookup = PromptLookup(self.index)
        self.draft = DraftModel(draft, capacity, branch=draft_branch) if draft is not None else None
        self.adaptive = Adaptive(max_nodes, always=always_speculate)
        self.max_candidate_len = max_candidate_len
        self.eos = target.eos_ids()
        self.lock = threading.Lock()
        self.stats = {"requests": 0, "passes": 0, "accepted": 0}

    # ---- set-up -------------------------------------------------------------------------------
    def calibrate(self, sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64), context: int = 64,
                  rounds: int = 3) -> dict[int, float]:
        """Measure target pass cost by tree size on this device (feeds the adaptive controller).

        Sizes are interleaved over `rounds` (a burst of load elsewhere then hits every size alike)
        and each keeps its fastest pass; a warm-up pass per size pays one-time kernel set-up.
        """
        with self.lock:
            self.runner.reset()
            v = self.target.vocab_size
            self.runner.extend([i * 7919 % v for i in range(context)])
            best = {n: float("inf") for n in sizes}
            for r in range(rounds + 1):
                for n in sizes:
                    self.runner.forward([i * 104729 % v for i in range(n)], [-1] + list(range(n - 1)), range(n))
                    if r:
                        best[n] = min(best[n], self.runner.last_pass_ms)
            self.runner.reset()
            self.adaptive.load_costs(best)
            return self.adaptive.costs()

    def calibrate_cached(self, sizes: tuple[int, ...] = (1, 4, 16, 64)) -> str:
        """Pass costs from the calibration cache of this machine, model and dtype ("cached"), else a
        short measurement that is then cached ("measured"). Real passes keep the costs fresh, and
        `save_calibration` writes them back, so later starts never wait for a full calibration."""
        path = calibration_path(self.target)
        try:
            costs = json.loads(path.read_text())["costs"]
            self.adaptive.load_costs({int(n): float(ms) for n, ms in costs.items()})
            return "cached"
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
        self.calibrate(sizes)
        self.save_calibration()
        return "measured"

    def save_calibration(self) -> None:
        path = calibration_path(self.target)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"costs": self.adaptive.costs()}))
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only cache only costs a calibration next time

    @torch.inference_mode()
    def warm(self, prompt: list[int], cancel: threading.Event | None = None) -> int:
        """Prefill the caches with `prompt` ahead of a request (on open, after edits, in benchmarks);
        a later request with the same prefix reuses it. Returns the tokens now cached."""

        def check() -> None:
            if cancel is not None and cancel.is_set():
                raise Cancelled()

        with self.lock:
            try:
                self.runner.extend(prompt, check=check)
                for p in (self.draft,) if self.draft is not None else ():
                    p.warm(prompt)
            except Cancelled:
                pass
            return self.runner.length

    def lookup(self, context: list[int], max_len: int = 16, n: int = 6) -> list[list[int]]:
        """What prompt lookup proposes after `context` (debugging: `debug/lookup`)."""
        limits = Limits(max_len=max_len, min_value=0.0)
        return [c.tokens for c in self.lookup_proposer(n).propose(context, limits)]

    def lookup_proposer(self, n: int) -> PromptLookup:
        return self.prompt_lookup if n == self.prompt_lookup.max_candidates else PromptLookup(self.index, n)

    def proposers(self, mode: str) -> list[Proposer]:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}: use one of {', '.join(MODES)}")
        if mode in ("draft", "combined") and self.draft is None and mode == "draft":
            raise ValueError("mode 'draft' needs a draft model")
        chosen: list[Proposer] = []
        if mode in ("pld", "combined"):
            chosen.append(self.prompt_lookup)
        if mode in ("draft", "combined") and self.draft is not None:
            chosen.append(self.draft)
        return chosen

    # ---- one completion -----------------------------------------------------------------------
    @torch.inference_mode()
    def complete(self, req: Request, on_step: Callable[[Step], None] | None = None) -> Result:
        proposers = self.proposers(req.mode)
        with self.lock:
            return self._complete(req, proposers, on_step)

    def _complete(self, req: Request, proposers: list[Proposer], on_step) -> Result:
        t0 = time.perf_counter()
        gen = torch.Generator(device="cpu").manual_seed(req.seed) if req.seed is not None else None

        def check() -> None:
            if req.cancel.is_set():
                raise Cancelled()

        if not req.reuse_prefix:
            self.runner.reset()
            if self.draft is not None:
                self.draft.runner.reset()
        out = Output(self.target.tokenizer, req.prompt, req.stops, self.eos, req.max_tokens,
                     req.heal.text if req.heal else "")
        passes = accepted = 0
        by_depth: list[int] = []
        ms_first = 0.0
        reused = min(self.runner.common_prefix(req.prompt), len(req.prompt) - 1)
        cancelled = False
        try:
            logits = self.runner.extend(req.prompt, check=check)  # prefill
            if req.heal is not None:  # only tokens that start with the healed text may come first
                allowed = torch.full_like(logits, float("-inf"))
                allowed[req.heal.allowed] = 0.0
                logits = logits + allowed
            token = sample(logits, req.sampling, gen)
            step = out.push([token])
            ms_first = (time.perf_counter() - t0) * 1000
            if on_step and (step.text or step.token_ids):
                on_step(step)
            while not out.done:
                check()
                if req.deadline_ms is not None and (time.perf_counter() - t0) * 1000 > req.deadline_ms:
                    out.stopped_by = "deadline"
                    break
                tree = self._propose(token, proposers, req.max_tokens - len(out.ids))
                logits = self.runner.forward(tree.tokens, tree.parents, range(len(tree)))  # verify
                self.adaptive.observe_pass(len(tree), self.runner.last_pass_ms)
                path, token = accept(tree, logits, req.sampling, gen)
                self.runner.keep(path)
                self._observe(tree, path, proposers)
                passes += 1
                accepted += len(path) - 1
                by_depth.extend([0] * (len(path) - len(by_depth)))
                for d in range(1, len(path)):
                    by_depth[d - 1] += 1
                step = out.push([tree.tokens[i] for i in path[1:]] + [token])
                if on_step and (step.text or step.token_ids):
                    on_step(step)
        except Cancelled:
            cancelled = True
            out.stopped_by = "cancelled"
        self.stats["requests"] += 1
        self.stats["passes"] += passes
        self.stats["accepted"] += accepted
        tokens = [out.decode([t]) for t in out.ids]
        return Result(text=out.text, token_ids=list(out.ids), tokens=tokens, mode=req.mode, target_passes=passes,
                      mean_accepted=accepted / passes if passes else 0.0, ms_first_token=ms_first,
                      ms_total=(time.perf_counter() - t0) * 1000, stopped_by=out.stopped_by, cancelled=cancelled,
                      prompt_tokens=len(req.prompt), reused_tokens=reused, accepted_by_depth=by_depth)

    def _propose(self, root: int, proposers: list[Proposer], remaining: int) -> TokenTree:
        """Candidates from every proposer that says it pays, merged into one tree and cut to the
        size that pays. Prompt lookup runs first: whether the draft pays depends on what it found."""
        max_len = min(self.max_candidate_len, remaining - 1)
        if max_len <= 0 or not proposers:
            return TokenTree.root_only(root)
        context = self.runner.tokens + [root]
        pass_ms = self.adaptive.cost(1)
        always = self.adaptive.always
        candidates = []
        for p in proposers:
            if not always and not p.pays(candidates, pass_ms):
                continue
            min_value = 0.0 if always else max(0.02, p.min_value(pass_ms))
            candidates += p.propose(context, Limits(max_len=max_len, min_value=min_value))
        tree = build_tree(root, candidates, self.adaptive.max_nodes)
        return _truncate(tree, self.adaptive.best_size(tree.value))

    def _observe(self, tree: TokenTree, path: list[int], proposers: list[Proposer]) -> None:
        on_path = set(path)
        by_source: dict[str, list[Outcome]] = {}
        for i in range(1, len(tree)):
            parent = tree.parents[i]
            if parent in on_path:  # the target tested this node
                cond = tree.value[i] / max(tree.value[parent], 1e-9)
                by_source.setdefault(tree.source[i], []).append(
                    Outcome(depth=len(tree.path_to(i)) - 1, predicted=cond, accepted=i in on_path))
        for p in proposers:
            if p.name in by_source:
                p.observe(by_source[p.name])

    # ---- streaming ----------------------------------------------------------------------------
    async def stream(self, req: Request) -> AsyncIterator[Step | Result]:
        """Yield each pass's Step as it is accepted, then the Result. Model work runs in a thread;
        closing the generator early cancels the request within one forward pass."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        worker = loop.run_in_executor(None, lambda: self.complete(
            req, lambda s: loop.call_soon_threadsafe(queue.put_nowait, s)))
        worker.add_done_callback(lambda f: loop.call_soon_threadsafe(queue.put_nowait, f))
        try:
            while True:
                item = await queue.get()
                if isinstance(item, asyncio.Future):
                    yield item.result()
                    return
                yield item
        finally:
            req.cancel.set()
            await asyncio.wait([worker])


def _truncate(tree: TokenTree, n: int) -> TokenTree:
    """The first 1 + n nodes (best-first order, so parents come first)."""
    if n + 1 >= len(tree):
        return tree
    keep = n + 1
    children = [{t: c for t, c in ch.items() if c < keep} for ch in tree.children[:keep]]
    return TokenTree(tree.tokens[:keep], tree.parents[:keep], tree.value[:keep], tree.source[:keep], children)


def calibration_path(target: LoadedModel) -> Path:
    """One calibration file per (CPU or GPU, model, dtype, threads): costs differ on each."""
    cpu = cpu_name()
    if target.device.type == "cuda":
        cpu = torch.cuda.get_device_name(target.device)
    key = f"{cpu}|{target.name}|{target.dtype}|{target.device}|{torch.get_num_threads()}|{target.meta.get('quant', '')}"
    digest = hashlib.sha1(key.encode()).hexdigest()[:16]
    return cache_root() / "calibration" / f"{digest}.json"
