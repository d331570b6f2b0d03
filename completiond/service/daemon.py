"""`completiond serve`: one resident engine shared by every editor on the machine.

The event loop only reads frames, keeps documents and writes answers; model work runs on one engine
thread, every client's jobs in turns of one prefill chunk or pass (core/scheduler.py), cancellable
between passes. A new `complete` for a document cancels the older one (latest wins); a client that
disconnects has its work cancelled.
Malformed input gets an error answer (or, when the byte stream cannot be resynchronised, that
connection is closed); the daemon itself keeps serving.

Roles: transport.py (sockets, frames), session.py (one connection's documents and jobs),
handlers.py (the methods), upgrade.py (a first start's background switch to the larger default),
this file (dispatch, the engine thread, the daemon's life, swapping engines between jobs).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from . import protocol as P
from .handlers import METHODS, Method
from .plan import EngineJob
from ..core.speculation.index import TokenIndex
from ..core.forward.context import PassContext
from ..core.scheduler import Scheduler
from .documents import IndexView
from .session import InFlight, Session
from .next_edit import Ahead
from .warmup import WARM_AFTER_S, Warmer, cursor_after
from .transport import AUTH_TIMEOUT_S, MAX_PENDING_AUTH, WAITING_GRACE_S, bind_unix, drain, read_frames, remove_own
from .workspace import WorkspaceWatcher

if TYPE_CHECKING:  # torch is imported by the loader, after the socket is up
    from ..core.engine_like import EngineLike
    from .upgrade import Upgrade

log = logging.getLogger("completiond.daemon")


# what initialize says of the models: the target (NAME@FORM for a named one), its weights form and,
# for `--target default`, why this target and form are the default here, and the background upgrade
# to the larger default where one runs (upgrade.py: the editors follow it in `status`)
MODEL_KEYS = ("target", "draft", "device", "state", "quant", "default_reason", "upgrade")
EARLY = {"initialize", "status", "shutdown", "document/open", "document/change"}  # answered while loading
CALIBRATION_SAVE_S = 300.0  # how often the pass costs that real requests measured are written back
Loader = Callable[[TokenIndex, Callable[..., None]], "tuple[EngineLike, dict]"]


class Daemon:
    """`engine` is a loaded engine (`EngineLike`: an Engine or a RemoteEngine), or a loader run on a
    thread of its own once the socket is up: `loader(index, phase)` calls `phase("loading target")`
    etc. as it goes and returns (engine, info to add); until it returns, `status` answers with the
    phase and everything else except EARLY waits (in frame order) for it."""

    def __init__(self, engine: EngineLike | Loader, info: dict, token: str | None = None,
                 default_mode: str = "combined", max_frame_bytes: int = P.MAX_FRAME_BYTES,
                 roots: Iterable[Path] = (), auth_timeout: float = AUTH_TIMEOUT_S, warm: bool = True,
                 quick_prompt_ms: float = P.QUICK_PROMPT_MS, repo_context: bool = False):
        self.info = info  # target, draft, device, dtype, socket
        self.token = token
        self.default_mode = default_mode
        self.max_frame_bytes = max_frame_bytes
        self.auth_timeout = auth_timeout
        # a completion whose full prompt lacks more prefill than this (ms) answers from the quick
        # prompt around the cursor while the full one warms (plan.Lane); < 0: never
        self.quick_prompt_ms = quick_prompt_ms
        # other files in the prompt (core.prompt.context.related_files); off by default: docs/models.md "The prompt"
        self.repo_context = repo_context
        # an engine being replaced (switch): its scheduler's thread still finishes the jobs it had
        self._retiring: tuple[EngineLike, Scheduler] | None = None
        self.engine = None if callable(engine) else engine
        # model work: one engine thread, every client's jobs in turns (core/scheduler.py)
        self.scheduler = Scheduler(self.engine) if self.engine is not None else None
        self._loader = None if self.engine is not None else engine
        self.index = self.engine.index if self.engine is not None else TokenIndex()
        tok = self.engine.target.tokenizer if self.engine is not None else None
        self.watcher = WorkspaceWatcher(self.index, tok)  # indexes once it has a tokenizer
        self.roots = [Path(r).resolve() for r in roots]  # the owner's choice (--workspace): indexed now
        for root in self.roots:
            self.watcher.add_root(root)
        self.ready = asyncio.Event()
        self.phases: list[tuple[str, float]] = [("ready" if self.engine else "starting", time.time())]
        self.progress: float | None = None  # percent done of the phase under way, where known
        self.error: str | None = None  # why loading failed; the daemon then exits
        self._calibration_saved = time.time()
        self.sessions: dict[int, Session] = {}
        self._arrived: dict[int, float] = {}  # TCP session id -> loop time it connected (the waiting room)
        self._trim_timer: asyncio.TimerHandle | None = None
        self._next_session = 0
        self.served = 0
        self.started = time.time()
        self.stopping = asyncio.Event()
        self.servers: list[asyncio.AbstractServer] = []
        self._tasks: set[asyncio.Task] = set()  # complete / rewrite answers in flight
        self.warmer = Warmer(self, enabled=warm)
        self.next_edits = Ahead(self, enabled=warm)  # next edits computed in the pauses (service/next_edit.py)
        self.upgrade: Upgrade | None = None  # a first start's switch to the larger default (upgrade.py)
        if self.engine is not None:
            self.info["state"] = "ready"
            self.ready.set()

    # The engine and the scheduler that new work goes to. On the thread of an engine being replaced
    # (switch), they are that engine and its scheduler: a job it started before the switch (a
    # request, a warm-up that reads `d.engine` as it runs) ends on the engine it began on.
    @property
    def engine(self) -> EngineLike | None:
        old = self._retiring
        return old[0] if old is not None and threading.current_thread() is old[1].thread else self._engine

    @engine.setter
    def engine(self, engine: EngineLike | None) -> None:
        self._engine = engine

    @property
    def scheduler(self) -> Scheduler | None:
        old = self._retiring
        return old[1] if old is not None and threading.current_thread() is old[1].thread else self._scheduler

    @scheduler.setter
    def scheduler(self, scheduler: Scheduler | None) -> None:
        self._scheduler = scheduler

    async def switch(self, engine: EngineLike, info: dict) -> bool:
        """Serve `engine` from now on, losing no request: requests that reached the old engine's
        scheduler finish there (its thread runs until they are done), every new one goes to `engine`.
        Warm-ups and next edits computed ahead on the old engine are cancelled, and every open document
        is warmed again on the new one (the old engine's cached sequences go with it). Then the old
        engine is freed: its scheduler's thread ends, and its memory goes back to the system. `engine`
        shares this daemon's token index (built with it). Returns whether the old engine was released
        (no reference to it left)."""
        old_engine, old = self._engine, self._scheduler
        self._retiring = (old_engine, old)
        self._engine, self._scheduler = engine, Scheduler(engine)
        self.info.update(info)
        self.warmer.warmed.clear()  # what it cached lives in the old engine
        with old.cond:  # work done ahead on the old engine: nobody waits for it
            for job in old.jobs:
                if job.low:
                    job.cancel.set()
        if self.warmer.cancel is not None:
            self.warmer.cancel.set()
        for s in list(self.sessions.values()):  # warmed again on the new engine, at once
            for uri in list(s.docs):
                self.warmer.touched(s, uri, None, 0.0)
        while old.jobs:  # the requests it had finish on it
            await asyncio.sleep(0.02)
        await asyncio.to_thread(old.stop)
        self._retiring = None
        old_engine.save_calibration()
        gone = weakref.ref(old_engine)
        del old_engine, old
        await asyncio.to_thread(_release)
        log.info("switched to %s; the old engine %s", self.info.get("target"),
                 "is released" if gone() is None else "is still referenced")
        return gone() is None

    def model_info(self) -> dict:
        return {k: self.info[k] for k in MODEL_KEYS if k in self.info}

    def loading_status(self) -> dict:
        """`status` before the models are in: the phase, how long it has run, and the ones before it."""
        now = time.time()
        phase, since = self.phases[-1]
        done = [{"phase": a, "s": round(b_t - a_t, 1)} for (a, a_t), (_, b_t) in zip(self.phases, self.phases[1:])]
        return {**self.info, "state": "failed" if self.error else "loading", "phase": phase,
                "phase_s": round(now - since, 1), "phases_done": done, "error": self.error, "progress": self.progress,
                "pid": os.getpid(), "uptime_s": round(now - self.started, 1),
                "clients": len(self.sessions) - 1, "requests_served": 0}

    async def _load(self) -> None:
        def phase(name: str, progress: float | None = None) -> None:  # engine thread; appends are atomic
            self.progress = progress  # percent done of the phase, where known (a conversion's)
            if self.phases[-1][0] == name:
                return
            self.phases.append((name, time.time()))
            log.info("start-up: %s (%.1f s in)", name, time.time() - self.started)

        try:
            # not on the engine thread: decoding on the thread that loaded and calibrated ran up to
            # 10x slower under CPU contention here (2-core EPYC; OpenMP team set up during the load)
            engine, info = await asyncio.to_thread(self._loader, self.index, phase)
        except Exception as e:  # ModelError, OSError...: one line, and the daemon stops
            self.error = str(e) or type(e).__name__
            log.error("start-up failed: %s", self.error)
            # requests that waited for the models get that error first (ready is set below), then stop
            asyncio.get_running_loop().call_later(0.2, self.stopping.set)
        else:
            self.engine = engine
            self.scheduler = Scheduler(engine)
            self.info.update(info, state="ready")
            self.watcher.set_tokenizer(engine.target.tokenizer)
            self.phases.append(("ready", time.time()))
            log.info("start-up: ready after %.1f s", time.time() - self.started)
        finally:
            self.ready.set()

    def configured(self, path: Path) -> bool:
        """Is `path` one of the owner's roots or inside one (symlinks and `..` resolved first)?"""
        try:
            real = path.resolve()
        except (OSError, ValueError, RuntimeError):  # a NUL byte, a symlink loop: not one of ours
            return False
        return any(real == r or r in real.parents for r in self.roots)

    # ---- connections --------------------------------------------------------------------------
    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tcp: bool) -> None:
        self._next_session += 1
        s = Session(self._next_session, writer, authed=not tcp, tcp=tcp)
        self.sessions[s.id] = s
        if tcp:
            self._arrived[s.id] = asyncio.get_running_loop().time()
            self._trim_waiting_room()
        try:
            await read_frames(reader, s, self.dispatch, self.max_frame_bytes, self.auth_timeout)
        except (ConnectionError, OSError, asyncio.CancelledError):  # cancelled: the daemon is stopping
            pass
        finally:
            self.drop(s)
            _close(writer)

    def _trim_waiting_room(self, timer: bool = False) -> None:
        """Over MAX_PENDING_AUTH TCP connections waiting to authenticate: drop the oldest, never the
        newcomer (idle connections must not lock out a client with the token). A connection younger
        than WAITING_GRACE_S is kept a moment longer: its initialize may be read but not yet handled."""
        if timer:
            self._trim_timer = None
        waiting = [c for c in self.sessions.values() if not c.authed and not c.closed]  # oldest first
        excess = len(waiting) - MAX_PENDING_AUTH
        if excess <= 0:
            return
        now = asyncio.get_running_loop().time()
        old = [c for c in waiting if now - self._arrived.get(c.id, now) >= WAITING_GRACE_S][:excess]
        for c in old:
            c.send(P.response(None, P.RpcError(P.INVALID_REQUEST, "too many connections waiting to authenticate: "
                                                                  "dropping the oldest")))
            c.closed = True
            _close(c.writer)
        if len(old) < excess and self._trim_timer is None:  # the young ones, once they are old enough
            self._trim_timer = asyncio.get_running_loop().call_later(WAITING_GRACE_S, self._trim_waiting_room, True)

    def drop(self, s: Session) -> None:
        """A client went away: cancel its work and forget its documents."""
        self._arrived.pop(s.id, None)
        s.cancel_all()
        self.warmer.forget(s)
        self.next_edits.forget(s)
        for uri in s.docs:
            self.index.close(s.index_key(uri))
        self.sessions.pop(s.id, None)

    async def dispatch(self, s: Session, obj) -> None:
        try:
            frame = P.parse_frame(obj)
        except P.RpcError as e:
            s.send(P.response(P.request_id(obj), e))
            return
        method = METHODS.get(frame.method)
        if not self.ready.is_set() and frame.method not in EARLY:
            await self.ready.wait()  # this connection's later frames wait too: their order is kept
        if frame.method == "status" and frame.kind == P.REQUEST and s.authed and not self.engine:
            s.send(P.response(frame.msgid, None, self.loading_status()))
            return
        if self.error and frame.method not in EARLY:
            if frame.kind == P.REQUEST:
                s.send(P.response(frame.msgid, P.RpcError(P.INTERNAL_ERROR, f"models failed to load: {self.error}")))
            return
        if frame.kind == P.NOTIFICATION:  # only document updates make sense without an answer
            if method is not None and frame.method.startswith("document/") and s.authed:
                try:
                    await method.fn(self, s, method.params.parse(frame.params), None)
                    self._edited(s, frame)
                except P.RpcError as e:
                    log.info("notification %s rejected: %s", frame.method, e.message)
                except Exception:  # a bug must cost this notification, not the connection
                    log.exception("notification %s failed", frame.method)
            return
        if method is None:
            s.send(P.response(frame.msgid, P.RpcError(P.METHOD_NOT_FOUND, f"unknown method {frame.method!r}")))
        elif not s.authed and frame.method != "initialize":
            s.send(P.response(frame.msgid, P.RpcError(P.INVALID_REQUEST, "initialize with the token first")))
        elif method.job:
            try:  # prepared now, in frame order; the answer comes from its own task
                params = method.params.parse(frame.params)
                self.warmer.asked(s, params.uri, params)  # a warm-up yields now
                prepared: EngineJob = method.fn(self, s, params)
            except Exception as e:
                self._error(s, frame, e)
                return
            flight = s.start(frame.msgid, prepared.uri)
            task = asyncio.create_task(self._answer(s, frame, lambda: self._run(s, flight, prepared)))
            self._tasks.add(task)  # the loop holds tasks weakly
            task.add_done_callback(self._tasks.discard)
        else:
            await self._answer(s, frame, lambda: self._call(s, frame, method))
            self._edited(s, frame)

    def _edited(self, s: Session, frame: P.Frame) -> None:
        """After document/open|change (request or notification): warm that document when typing pauses."""
        uri = frame.params.get("uri") if isinstance(frame.params, dict) else None
        if frame.method in ("document/open", "document/change") and s.authed and isinstance(uri, str) \
                and uri in s.docs:  # a rejected frame's uri may be any value (a map is unhashable)
            self.warmer.touched(s, uri, cursor_after(frame.params.get("changes"), s.encoding),
                                0.0 if frame.method == "document/open" else WARM_AFTER_S)
            self.next_edits.touched(s, uri, cursor_after(frame.params.get("changes"), s.encoding),
                                    0.0 if frame.method == "document/open" else WARM_AFTER_S)

    async def _call(self, s: Session, frame: P.Frame, method: Method):
        return await method.fn(self, s, method.params.parse(frame.params), frame.msgid)

    async def _answer(self, s: Session, frame: P.Frame, run) -> None:
        try:
            s.send(P.response(frame.msgid, None, await run()))
        except Exception as e:
            self._error(s, frame, e)
        await drain(s.writer)

    @staticmethod
    def _error(s: Session, frame: P.Frame, e: Exception) -> None:
        if isinstance(e, P.RpcError):
            s.send(P.response(frame.msgid, e))
            s.closed = s.closed or e.close
        else:  # a bug must cost one request, not the daemon (a `quiet` error, a remote's failure: one line)
            if getattr(e, "quiet", False):
                log.warning("%s failed: %s", frame.method, e)
            else:
                log.exception("%s failed", frame.method, exc_info=e)
            s.send(P.response(frame.msgid, P.RpcError(P.INTERNAL_ERROR, f"{type(e).__name__}: {e}")))

    async def _run(self, s: Session, flight: InFlight, job: EngineJob) -> dict:
        """Run one request on the engine thread, in turns with other documents' jobs, and stream its
        partial text; the latest per document wins."""
        loop = asyncio.get_running_loop()
        # open buffers feed prompt lookup: their texts now, tokenized on the engine thread
        stale = [(key, d, d.text, d.version) for key, d in s.stale_buffers()]
        tok = self.engine.target.tokenizer

        so_far, shown = [""], [0]  # the engine's text, and how much of its cleaned form was streamed

        def on_step(step) -> None:
            if step.text and not flight.cancel.is_set():
                so_far[0] += step.text
                text = job.shown(so_far[0], False)  # None: held back while it may repeat typed text
                if text and len(text) > shown[0]:
                    delta, shown[0] = text[shown[0]:], len(text)
                    loop.call_soon_threadsafe(s.send, P.notification(job.partial, {"id": flight.msgid, "text": delta}))

        submitted, times = time.perf_counter(), {}

        def work(ctx: PassContext):  # a generator of steps (Engine.run), run by the scheduler
            if flight.cancel.is_set():  # superseded while it waited: no tokenizing, no pass
                return None
            started = time.perf_counter()
            for key, d, text, version in stale:
                self.engine.index.set_open_text(key, text, lambda piece: tok.encode(piece, add_special_tokens=False))
                loop.call_soon_threadsafe(_indexed, d, version)  # the document is the event loop's to write
            built = job.build(self.engine)
            # the keystroke's time before its first pass: waiting for the engine, then indexing + prompt
            times.update(ms_waited=round((started - submitted) * 1000, 1),
                         ms_prepared=round((time.perf_counter() - started) * 1000, 1))
            loop.call_soon_threadsafe(job.learned, built)  # before the answer: the loop runs callbacks in order
            req = built.request
            req.cancel = flight.cancel
            if req.slot is None:
                req.slot = (s.id, job.uri)
            elif req.slot != (s.id, job.uri):  # the quick prompt (plan.Lane): its own cached sequence
                self.scheduler.move(req.slot, built.lane.capacity)
            res = yield from self.engine.run(req, on_step, ctx)
            if time.time() - self._calibration_saved > CALIBRATION_SAVE_S:  # real passes refreshed the costs
                self.engine.save_calibration()
                self._calibration_saved = time.time()
            return res, built

        try:
            ran = await asyncio.wrap_future(self.scheduler.submit(work, (s.id, job.uri), flight.cancel, low=job.low))
        finally:
            s.finish(flight)
        if ran is None:
            return job.superseded()
        self.served += 1
        return {**job.answer(*ran), **times}

    # ---- lifecycle ----------------------------------------------------------------------------
    async def serve(self, sock_path: Path | None, tcp: tuple[str, int] | None = None) -> None:
        ident = None
        if sock_path is not None:
            listener, ident = bind_unix(sock_path)
            self.servers.append(await asyncio.start_unix_server(
                lambda r, w: self.connection(r, w, tcp=False), sock=listener))
        if tcp is not None:
            self.servers.append(await asyncio.start_server(
                lambda r, w: self.connection(r, w, tcp=True), host=tcp[0], port=tcp[1]))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        log.info("serving on %s%s", sock_path, f" and tcp {tcp[0]}:{tcp[1]}" if tcp else "")
        if self._loader is not None:
            loading = asyncio.create_task(self._load())
            self._tasks.add(loading)
            loading.add_done_callback(self._tasks.discard)
        if self.upgrade is not None:  # it waits for the first engine to serve
            upgrading = asyncio.create_task(self.upgrade.run())
            self._tasks.add(upgrading)
            upgrading.add_done_callback(self._tasks.discard)
        try:
            await self.stopping.wait()
        finally:
            if self.upgrade is not None:
                self.upgrade.stop()
            for srv in self.servers:
                srv.close()
            for s in list(self.sessions.values()):
                self.drop(s)
                _close(s.writer)
            self.watcher.stop()
            if self._retiring is not None:  # stopped mid-switch
                self._retiring[1].stop()
            if self._scheduler is not None:
                self._scheduler.stop()
            if self._engine is not None:
                self._engine.save_calibration()  # the next start reads what this run measured
            if sock_path is not None and ident is not None:
                remove_own(sock_path, ident)  # not a newer daemon's socket at the same path


def _release() -> None:
    """After an engine was dropped: collect its cycles, objects a load froze included (gc_pause:
    gc.freeze keeps frozen objects out of collections), and give the freed heap back to the system."""
    from ..models.device import trim_heap

    gc.unfreeze()
    gc.collect()
    gc.freeze()  # what lives now is the new engine's: later collections skip it again
    trim_heap()


def _close(writer: asyncio.StreamWriter) -> None:
    try:
        writer.close()
    except (ConnectionError, OSError, RuntimeError):
        pass


def _indexed(view: IndexView, version: int) -> None:
    """On the event loop: the prompt-lookup index has this version of an open buffer."""
    view.indexed_version = version
