"""Several documents, one model (issues 13 and 15): a cached sequence per document (Engine.slots)
and the engine thread's turns (core/scheduler.py). Interleaving must not change a single token."""

import dataclasses
import itertools
import threading
import time

import pytest
import torch

import tiny
from completiond.core import slots as slots_mod
from completiond.core.engine import Engine, Request
from completiond.core.forward.runner import CHUNK
from completiond.core import scheduler as scheduler_mod
from completiond.core.scheduler import Scheduler, Work


@pytest.fixture(scope="module")
def target():
    return tiny.loaded(tiny.gemma_config(window=16, layers=4), seed=1, scale=4.0)


def solo(target, prompt, **kw) -> list[int]:
    return Engine(target).complete(Request(prompt=prompt, mode="ar", **kw)).token_ids


def test_each_slot_keeps_its_sequence(target, code_ids):
    a, b = code_ids[:300], code_ids[400:700]
    e = Engine(target)
    for p, slot in ((a, "a"), (b, "b")):
        assert e.complete(Request(prompt=p, mode="ar", max_tokens=4, slot=slot)).reused_tokens == 0
    # back to a: its cache survived b's prefill, and the tokens are those of a fresh engine
    res = e.complete(Request(prompt=a + [5], mode="pld", max_tokens=8, slot="a"))
    assert res.reused_tokens == len(a)
    assert res.token_ids == solo(target, a + [5], max_tokens=8)
    assert e.cached_prefix_len(b, "b") == len(b) and e.cached_prefix_len(b, "a") == 0


def test_least_recently_used_slot_goes_unless_pinned(target, code_ids, monkeypatch):
    monkeypatch.setattr(slots_mod, "MAX_SLOTS", 2)
    e = Engine(target)
    for i, slot in enumerate(("a", "b", "c")):
        with e.turn(slot, pinned={"a"}):
            e.runner.sync(code_ids[i * 10:i * 10 + 20])
    assert e.slots.keys() == ["a", "c"]  # b was the least recently used one that no job holds
    assert e.cached_prefix_len(code_ids[:20], "a") == 20


def test_a_new_request_preempts_a_long_prefill_and_nothing_changes(target, code_ids, monkeypatch):
    monkeypatch.setattr(scheduler_mod, "PREEMPT_MS", 0.0)  # the tiny model's whole prefill is a few ms
    long_p, short_p = code_ids[:4 * CHUNK + 30], code_ids[2000:2040]
    want_long = solo(target, long_p, max_tokens=6)
    want_short = solo(target, short_p, max_tokens=6)
    e = Engine(target)
    sched = Scheduler(e)
    inside, release = threading.Event(), threading.Event()
    gives_way = sched._gives_way

    def held(job):  # between two layers of the long prompt's 2nd chunk: hold once
        if not inside.is_set() and e.runner.length >= CHUNK:
            inside.set()
            assert release.wait(30)
        return gives_way(job)

    sched._gives_way = held
    try:
        order: list[str] = []
        long_req = Request(prompt=long_p, mode="ar", max_tokens=6, slot="long")
        f_long = sched.submit(lambda ctx: e.run(long_req, ctx=ctx), "long", long_req.cancel)
        f_long.add_done_callback(lambda f: order.append("long"))
        assert inside.wait(30)
        short_req = Request(prompt=short_p, mode="pld", max_tokens=6, slot="short")
        f_short = sched.submit(lambda ctx: e.run(short_req, ctx=ctx), "short")
        f_short.add_done_callback(lambda f: order.append("short"))
        release.set()
        short, long_ = f_short.result(60), f_long.result(60)
    finally:
        sched.stop(30)
    assert order == ["short", "long"]
    assert sched.stats["preempted"] >= 1  # the long prefill stopped inside a chunk for it
    assert short.token_ids == want_short and long_.token_ids == want_long
    assert long_.reused_tokens == 0 and not long_.cancelled


def logged(name: str, steps, turns: list[str]):
    """A job's steps, each turn it gets written down."""
    def gen():
        while True:
            turns.append(name)
            try:
                left = next(steps)
            except StopIteration as done:
                return done.value
            yield left
    return gen()


@pytest.mark.parametrize("noise_ms", [0.0, 200.0])
def test_shortest_work_left_goes_first_and_two_long_prefills_do_not_alternate(target, code_ids, noise_ms):
    """noise_ms: every other prefill chunk is measured that much slower (a busy machine), which
    moves the per-token rate the work estimates are priced at between two jobs' turns."""
    e = Engine(target)
    run_pass, chunks = e.runner.run_pass, itertools.count()

    def noisy(ids, *a, **kw):
        out = run_pass(ids, *a, **kw)
        if len(ids) > 1 and next(chunks) % 2:
            out = dataclasses.replace(out, ms=out.ms + noise_ms)
        return out

    e.runner.run_pass = noisy
    sched = Scheduler(e)
    turns: list[str] = []
    hold, held = threading.Event(), threading.Event()
    try:
        # a job that holds the engine thread, so that the three below are queued together
        blocker = sched.submit(lambda ctx: held.set() or hold.wait(30), "block")
        assert held.wait(30)
        reqs = {"a": Request(prompt=code_ids[:3 * CHUNK + 5], mode="ar", max_tokens=4, slot="a"),
                "b": Request(prompt=code_ids[1000:1000 + 3 * CHUNK + 5], mode="ar", max_tokens=4, slot="b"),
                "short": Request(prompt=code_ids[3000:3040], mode="ar", max_tokens=4, slot="short")}
        futs = {k: sched.submit(lambda ctx, r=r, k=k: logged(k, e.run(r, ctx=ctx), turns), k) for k, r in reqs.items()}
        hold.set()
        blocker.result(30)
        results = {k: f.result(60) for k, f in futs.items()}
    finally:
        sched.stop(30)
    # each job's first step (before any pass: it reports its size) comes in arrival order, since a
    # job not started counts as no work; then "short" finishes before either long one, which then
    # run one after the other, not chunk by chunk: a first (equal size, it came first), then b
    assert turns[:3] == ["a", "b", "short"], turns
    rest = turns[3:]
    last_short = max(i for i, t in enumerate(rest) if t == "short")
    assert set(rest[:last_short + 1]) == {"short"}, turns
    long_turns = rest[last_short + 1:]
    assert long_turns == ["a"] * long_turns.count("a") + ["b"] * long_turns.count("b"), turns
    for k, r in reqs.items():
        assert results[k].token_ids == solo(target, r.prompt, max_tokens=4)


def test_same_document_jobs_do_not_interleave_and_a_superseded_one_ends_first(target, code_ids):
    prompt = code_ids[:2 * CHUNK + 10]
    e = Engine(target)
    sched = Scheduler(e)
    inside, release = threading.Event(), threading.Event()
    gives_way = sched._gives_way

    def held(job):  # asked between two layers of a prefill chunk: hold the first time
        if not inside.is_set():
            inside.set()
            assert release.wait(30)
        return gives_way(job)

    sched._gives_way = held
    try:
        old = Request(prompt=prompt, mode="ar", max_tokens=50, slot="doc")
        f_old = sched.submit(lambda ctx: e.run(old, ctx=ctx), "doc", old.cancel)
        assert inside.wait(30)  # inside the first chunk
        new = Request(prompt=prompt + [7], mode="ar", max_tokens=5, slot="doc")
        f_new = sched.submit(lambda ctx: e.run(new, ctx=ctx), "doc")
        old.cancel.set()  # superseded by the next keystroke
        release.set()
        res_old, res_new = f_old.result(60), f_new.result(60)
    finally:
        sched.stop(30)
    assert res_old.cancelled
    assert sched.stats["preempted"] == 0  # the superseded prefill finished the chunk it was in ...
    assert res_new.reused_tokens == CHUNK  # ... which the new request reused
    assert res_new.token_ids == solo(target, prompt + [7], max_tokens=5)


def test_a_failing_job_costs_only_itself(target, code_ids):
    e = Engine(target)
    sched = Scheduler(e)
    try:
        bad = sched.submit(lambda ctx: e.run(Request(prompt=code_ids[:20], mode="nonsense"), ctx=ctx), "x")
        good = sched.submit(lambda ctx: e.run(Request(prompt=code_ids[:20], mode="ar", max_tokens=3), ctx=ctx), "y")
        plain = sched.submit(lambda ctx: 42)
        with pytest.raises(ValueError, match="unknown mode"):
            bad.result(30)
        assert good.result(30).token_ids == solo(target, code_ids[:20], max_tokens=3)
        assert plain.result(30) == 42
    finally:
        sched.stop(30)
    assert sched.submit(lambda ctx: 1).cancelled()  # stopped: nothing more runs


def test_a_prefill_that_ends_before_another_jobs_turn_keeps_its_own_state(target, code_ids):
    """Job a's last chunk runs, job b's first (non-final) chunk runs, then a goes on: a's first token
    and feature come from its own last chunk, not from the runner's latest pass (b's, which had no
    logits: an IndexError in the soak before)."""
    from completiond.models.heads import MedusaHeads
    from completiond.core.forward.runner import drain

    heads = MedusaHeads(target.model.config.hidden_size, 2, torch.arange(target.vocab_size))
    e = Engine(target, heads)
    a = Request(prompt=code_ids[:CHUNK + 40], mode="combined", max_tokens=6, slot="a")
    b = Request(prompt=code_ids[2000:2000 + 2 * CHUNK + 40], mode="combined", max_tokens=6, slot="b")
    ga, gb = e.run(a), e.run(b)
    for _ in range(2):  # a's two chunks
        with e.turn("a"):
            next(ga)
    with e.turn("b"):
        next(gb)  # b's first chunk: no logits, no hidden state
    with e.turn("a"):
        res_a = drain(ga)
    with e.turn("b"):
        res_b = drain(gb)
    assert res_a.token_ids == solo(target, a.prompt, max_tokens=6)
    assert res_b.token_ids == solo(target, b.prompt, max_tokens=6)


def test_a_cancelled_job_between_turns_does_not_hold_back_its_documents_request(target):
    """A warm-up of document A that started, then waited behind B's long prefill and was cancelled by
    a request for A: that request is ready at once (it preempts B's chunk), instead of waiting for B's
    step to end so that the cancelled job can be reaped first. A cancelled job that is running now
    still keeps its document (a superseded request finishes its chunk for the next one)."""
    import time
    from concurrent.futures import Future

    from completiond.core.scheduler import Job

    sched = Scheduler(Engine(target))
    try:
        def job(slot, low, seq, started=True, left=Work(0, 0)):
            j = Job(lambda ctx: None, slot, threading.Event(), low, Future(), seq)
            j.steps = iter(()) if started else None
            j.left = left
            return j

        b = job("B", False, 0, left=Work(5000, 0))  # a long prefill
        warm = job("A", True, 1)
        warm.cancel.set()
        ask = job("A", False, 2, started=False)
        with sched.cond:
            sched.jobs, sched.running = [b, warm, ask], b
            assert sched._pick(time.monotonic(), reap=False) is ask  # what B's chunk is asked to give way to
            warm.cancel.clear()  # not cancelled: A's request waits for A's job
            assert sched._pick(time.monotonic(), reap=False) is b
            warm.cancel.set()
            sched.running = warm  # cancelled but computing now: A stays busy
            assert ask not in [sched._pick(time.monotonic(), reap=False)]
            sched.jobs, sched.running = [], None
    finally:
        sched.stop(30)


def test_freed_heap_goes_back_once_idle_not_between_requests(target, code_ids, monkeypatch):
    """After work, once the engine thread has been idle IDLE_TRIM_S, it trims the heap once (a
    prefill's freed temporaries leave the RSS); requests that follow each other closer than that
    (typing) are not interrupted by trims, and an idle daemon does not trim again."""
    monkeypatch.setattr(scheduler_mod, "IDLE_TRIM_S", 0.3)
    e = Engine(target)
    sched = Scheduler(e)
    trims: list[float] = []
    sched.trim = lambda: trims.append(time.monotonic())
    try:
        time.sleep(0.6)
        assert trims == []  # nothing ran yet: nothing to give back
        ends = []
        for i in range(4):  # back to back, 0.1 s apart
            req = Request(prompt=code_ids[i * 40:i * 40 + 30], mode="ar", max_tokens=3, slot=f"s{i}")
            sched.submit(lambda ctx, req=req: e.run(req, ctx=ctx), req.slot).result(30)
            ends.append(time.monotonic())
            time.sleep(0.1)
        assert trims == []
        time.sleep(1.0)
        assert len(trims) == 1 and trims[0] - ends[-1] >= 0.3
        time.sleep(0.7)
        assert len(trims) == 1 and sched.stats["trims"] == 1
    finally:
        sched.stop(30)
