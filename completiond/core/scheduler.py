"""The engine thread: every client's requests share one model, in turns.

A job is a generator of steps (`Engine.run`, `Engine.warming`): one step is one prefill chunk or one
target pass. It starts with its PassContext (its cancel, and `_gives_way` as its preempt policy),
which its steps pass down to every pass. The thread runs one step of one job at a time, inside
`Engine.turn` (the job's own cached sequence), then picks the next job:

- a started job that was cancelled goes first: it ends at its next check and frees its slot;
- requests go before warm-ups;
- a job that has made no progress for MAX_WAIT_S goes next (nothing starves), else the job with
  the least work left (shortest remaining first: each step of `Engine.run` yields its `Work`:
  prompt tokens still to prefill, a pass per token still allowed, priced in ms at the engine's
  rates of the moment, the same for all jobs compared). A request that has not
  started counts as none: most are a keystroke's completion, so it goes before a long rewrite's
  prefill, and after its first step its own estimate places it. Two cold prefills run one after the
  other (the first done as early as FIFO would finish it), not chunk by chunk; equals go first come,
  first served.

A request that has not started yet is served within one layer: a job with more than PREEMPT_MS of
work left that is in a prefill chunk gives way between two layers (a warm-up gives way to any
request), and the chunk runs again on its next turn. So another client's completion waits for one
layer of a long prefill, or for the rest of one target pass, not for the whole request. Only new
requests preempt a chunk: two jobs that both preempted could stop each other's chunks forever. Jobs
of the same document never interleave (a superseded request finishes the chunk it is in, which the
next request reuses).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Generator, Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field
from contextlib import AbstractContextManager
from typing import Any, NamedTuple, Protocol

from .forward.context import PassContext

log = logging.getLogger(__name__)
MAX_WAIT_S = 5.0  # a job that waited this long for a turn gets the next one, and is not preempted in it
PREEMPT_MS = 1000.0  # a prefill chunk stops for a new request only when its job has more work left than this
# Idle this long after work, the engine thread hands freed heap back to the system (malloc_trim):
# a prefill's temporaries otherwise stay in the daemon's RSS (~130 MB after a cancelled rewrite in
# the soak). Not between keystrokes: the next prefill would fault those pages in again.
IDLE_TRIM_S = 1.0
ENGINE_THREAD = "engine"  # the thread's name: the service checks it writes no session state


class Work(NamedTuple):
    """What a job's step says it has left: prompt tokens still to prefill, target passes at most."""
    prompt: int
    passes: int


@dataclass(eq=False)
class Job:
    start: Callable[[PassContext], Any]  # called on the engine thread: a generator of steps, or the answer
    slot: Hashable  # its document: jobs of one document never interleave
    cancel: threading.Event
    low: bool  # a warm-up: only when no request waits
    future: Future
    seq: int
    steps: Generator | None = None
    left: Work = Work(0, 0)  # work left, as its last step said (none before it starts)
    waiting_since: float = field(default_factory=time.monotonic)  # since it came, or its last whole step
    aged: bool = False  # this turn came from waiting MAX_WAIT_S: it is not preempted
    gave_way: bool = False  # its step in this turn was preempted
    held: Hashable = None  # the cached sequence it works on, when not its document's own (Scheduler.move)

    @property
    def sequence(self) -> Hashable:
        return self.slot if self.held is None else self.held


class Turns(Protocol):
    """What the scheduler needs of an engine (the local `Engine` or the remote target): a turn
    for one job's step, its slots, and the price of work left. A protocol, so that the engine,
    which yields `Work`, imports this module and not the other way round."""
    slots: Any

    def turn(self, slot: Hashable = None, *, pinned: Any = ()) -> AbstractContextManager[None]: ...

    def work_ms(self, work: Work) -> float: ...


class Scheduler:
    def __init__(self, engine: Turns):
        self.engine = engine
        self.jobs: list[Job] = []
        self.cond = threading.Condition()
        self.running: Job | None = None
        self._seq = itertools.count()
        self._stopping = False
        self._worked = False  # turns ran since the last trim (IDLE_TRIM_S)
        self.trim: Callable[[], None] = _trim_heap
        self.stats = {"jobs": 0, "turns": 0, "preempted": 0, "trims": 0}
        self.thread = threading.Thread(target=self._loop, name=ENGINE_THREAD, daemon=True)
        self.thread.start()

    def submit(self, start: Callable[[PassContext], Any], slot: Hashable = None,
               cancel: threading.Event | None = None, low: bool = False) -> Future:
        """Queue a job; the future gets what `start` returns (or its generator's return value).
        `start` gets the job's PassContext: `cancel`, and this scheduler's preempt policy."""
        fut: Future = Future()
        job = Job(start, slot, cancel or threading.Event(), low, fut, next(self._seq))
        with self.cond:
            if self._stopping:
                fut.cancel()
                return fut
            self.jobs.append(job)
            self.stats["jobs"] += 1
            self.cond.notify()
        return fut

    def move(self, slot: Hashable, capacity: int | None = None) -> None:
        """Called by the running job on the engine thread, inside its turn: the job works on `slot`'s
        cached sequence from now on, in this turn and the later ones (a completion picks its prompt,
        and so its sequence, only once it runs: service/plan.Lane). It stays its document's job."""
        job = self.running
        if job is None:
            raise RuntimeError("Scheduler.move is for the job whose turn it is")
        with self.cond:
            pinned = {j.sequence for j in self.jobs if j.steps is not None and j is not job}
            job.held = slot
        self.engine.slots.hold(slot, pinned, capacity)

    def stop(self, timeout: float | None = None) -> None:
        """Cancel every job (started ones end at their next check) and end the thread."""
        with self.cond:
            self._stopping = True
            for j in self.jobs:
                j.cancel.set()
            self.cond.notify()
        self.thread.join(timeout)

    # ---- the engine thread --------------------------------------------------------------------
    def _loop(self) -> None:
        import torch  # the daemon imports this module before torch is loaded

        with torch.inference_mode():
            while True:
                if self._idle_after_work():
                    self.trim()  # outside the lock: a request arriving meanwhile is queued at once
                    continue
                with self.cond:
                    if self._stopping:
                        for j in [j for j in self.jobs if j.steps is None]:
                            self.jobs.remove(j)
                            j.future.cancel()
                        if not self.jobs:
                            return
                    job = self._pick(time.monotonic())
                    job.aged = time.monotonic() - job.waiting_since > MAX_WAIT_S
                    self.running = job
                    pinned = {j.sequence for j in self.jobs if j.steps is not None and j is not job}
                self._turn(job, pinned)

    def _idle_after_work(self) -> bool:
        """Wait for a job or a stop; True instead once the thread has sat IDLE_TRIM_S without one
        after doing work (time to trim the heap)."""
        with self.cond:
            while not self.jobs and not self._stopping:
                if not self._worked:
                    self.cond.wait()
                elif not self.cond.wait(IDLE_TRIM_S) and not self.jobs:
                    self._worked = False
                    self.stats["trims"] += 1
                    return True
            return False

    def _turn(self, job: Job, pinned: set) -> None:
        done, value, error = False, None, None
        try:
            with self.engine.turn(job.sequence, pinned=pinned):
                if job.steps is None:
                    if not job.future.set_running_or_notify_cancel():
                        done = True  # its asker gave up before it started
                    else:
                        first = job.start(PassContext(job.cancel, preempt=lambda: self._gives_way(job)))
                        if isinstance(first, Generator):
                            job.steps = first
                        else:
                            done, value = True, first
                if job.steps is not None:
                    left = next(job.steps)
                    if isinstance(left, Work):  # a warm-up's steps say nothing: it counts as none
                        job.left = left
        except StopIteration as stop:
            done, value = True, stop.value
        except Exception as e:  # a bug must cost this job, not the thread every client shares
            done, error = True, e
        now = time.monotonic()
        with self.cond:
            if not job.gave_way:  # a preempted step is no progress: it still ages
                job.waiting_since = now
            job.gave_way = False
            self.running = None
            self._worked = True
            self.stats["turns"] += 1
            if done:
                self.jobs.remove(job)
        if done and job.future.running():
            if error is not None:
                job.future.set_exception(error)
            else:
                job.future.set_result(value)

    def _pick(self, now: float, reap: bool = True) -> Job:
        """The job for the next turn (called with the lock held; jobs is not empty)."""
        # documents with a started job; not a cancelled one between turns (it ends at its next check,
        # computing nothing): a request for its document must not wait behind it for other jobs' steps
        busy = {j.slot for j in self.jobs if j.steps is not None and (j is self.running or not j.cancel.is_set())}
        ready = [j for j in self.jobs if j.steps is not None or j.slot not in busy]
        for j in ready if reap else ():
            if j.steps is not None and j.cancel.is_set():
                return j
        pool = [j for j in ready if not j.low] or ready
        waited = [j for j in pool if now - j.waiting_since > MAX_WAIT_S and j is not self.running]
        if waited:
            return min(waited, key=lambda j: j.waiting_since)
        return min(pool, key=lambda j: (self._left_ms(j), j.seq))

    def _left_ms(self, job: Job) -> float:
        """A job's work left in ms, at the engine's rates now (the same for every job compared)."""
        return self.engine.work_ms(job.left)

    def _gives_way(self, job: Job) -> bool:
        """Asked between the layers of a prefill chunk: should `job` stop it for another job?"""
        if job.aged or job.cancel.is_set():  # a superseded request finishes its chunk for the next one
            return False
        with self.cond:
            nxt = self._pick(time.monotonic(), reap=False)  # not worth a chunk: a cancelled job ends after
            if nxt is job or nxt.slot == job.slot or (nxt.low and not job.low):
                return False
            if not job.low and (nxt.steps is not None or self._left_ms(job) <= PREEMPT_MS):
                return False  # only a request that has not started preempts, and not a nearly done job
            self.stats["preempted"] += 1
            job.gave_way = True
            return True


def _trim_heap() -> None:
    from ..models.device import trim_heap  # here: device imports torch, which the daemon loads later

    trim_heap()
