"""Warm before asked: prefill the prompt a document's next completion needs while the engine is idle.

After `document/open` and after edits (once they pause for WARM_AFTER_S), the daemon queues a
warm-up for that document on the engine thread at the cursor (after the last edit, else the last
request's position, else the end). Where the cursor is known (an edit, a request, or the editor
saying where it rests), the next completion is computed ahead, so a request at that cursor (after
accepting a suggestion, or Enter at the end of the line: typed through the suggestion) is served
from the engine's memory of verified tokens (llama.vim's speculative follow-up); elsewhere (an
opened file, the cursor unknown) the prompt is prefilled. While a document's full prompt is cold (a freshly opened file),
the quick prompt around the cursor is warmed first (with a known cursor, the completion's first
QUICK_AHEAD_TOKENS computed on it before the draft reads it), then the full one (plan.Lane). It is the
lowest priority: every request goes first (it waits for one layer), and one for the same document
stops it and reuses every prefill chunk it finished: within one layer, except in the quick prompt's
target chunk, which the request needs and which ends first (the draft's prefill of it stops within
a layer: the request's first token does not need it). Closing a document stops its warm-up.
Each document keeps its own cached sequence (Engine.slots), so a warm-up of one document survives
requests in another. `status` reports per document whether its prompt is cached.

One warm-up runs at a time, and the document the user is in (the focus: the last one asked for a
completion, or edited or rested in with a known cursor) is never stopped for another one's: a
context buffer that changes (llama.vim's ring of chunks, other files opened in the background) is
warmed after it, not instead of it. Context-only documents (the HTTP bridge's input_extra buffer:
prompt lookup reads it, nobody completes in it) are never warmed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import protocol as P
from ..core.forward.context import PassContext
from .handlers import complete

if TYPE_CHECKING:
    from .serving import Serving
    from .session import Session

log = logging.getLogger(__name__)
WARM_AFTER_S = 0.3  # typing pauses this long before a warm-up is queued
QUICK_AHEAD_TOKENS = 16  # computed ahead on a cold document's quick prompt: about a second of the 1.5B's passes


@dataclass
class Warmed:
    version: int
    prompt: list[int]


def _width(text: str, encoding: str) -> int:
    return {"utf-8": len(text.encode("utf-8")), "utf-16": len(text.encode("utf-16-le")) // 2}.get(encoding, len(text))


def end_position(text: str, encoding: str) -> P.Position:
    """The position after the document's last character, in the session's position encoding."""
    return P.Position(text.count("\n"), _width(text[text.rfind("\n") + 1:], encoding))


def cursor_after(changes: list, encoding: str) -> P.Position | None:
    """Where the cursor is after an editor's incremental change: the end of the last inserted text
    (typing, or accepting a suggestion); None for a whole-document replacement."""
    last = changes[-1] if isinstance(changes, list) and changes else None
    if not isinstance(last, dict) or not isinstance(last.get("range"), dict) or not isinstance(last.get("text"), str):
        return None
    start, text = last["range"].get("start") or {}, last["text"]
    line, char = start.get("line"), start.get("character")
    if not isinstance(line, int) or not isinstance(char, int):
        return None
    if "\n" in text:
        return P.Position(line + text.count("\n"), _width(text[text.rfind("\n") + 1:], encoding))
    return P.Position(line, char + _width(text, encoding))


class Warmer:
    def __init__(self, daemon: Serving, enabled: bool = True):
        self.d = daemon
        self.enabled = enabled
        self.timers: dict[tuple[int, str], asyncio.TimerHandle] = {}
        self.positions: dict[tuple[int, str], P.Position] = {}  # where to warm: the cursor as last seen
        self.asks: dict[tuple[int, str], P.Complete] = {}  # the document's last greedy completion request
        self.warmed: dict[tuple[int, str], Warmed] = {}
        self.cancel: threading.Event | None = None  # the warm-up queued or running
        self.cancel_key: tuple[int, str] | None = None  # and its document
        # the warm-up's soft stop, and whether it is computing a quick-prompt step (plan.Lane) right
        # now: a request for its document then lets it finish the target's chunk (the request needs
        # it) and end; set with every cancel too (it also stops the quick prompt's draft prefill)
        self.finish: tuple[threading.Event, list[bool]] | None = None
        self.focus: tuple[int, str] | None = None  # the document the user is in (module doc)
        self.context: set[tuple[int, str]] = set()  # context-only documents: never warmed

    def touched(self, s: Session, uri: str, cursor: P.Position | None = None, after_s: float = WARM_AFTER_S) -> None:
        """A document was opened (after_s 0: at once) or edited (the cursor now at `cursor`, if known):
        warm it once the edits pause."""
        key = (s.id, uri)
        if not self.enabled or key in self.context:
            return
        if cursor is not None:
            self.positions[key] = cursor
            self.focus = key  # an edit (or a resting cursor) says where the user is
        if (t := self.timers.pop(key, None)) is not None:
            t.cancel()
        self.timers[key] = asyncio.get_running_loop().call_later(after_s, self._start, s, uri)

    def asked(self, s: Session, uri: str, params: P.Params) -> None:
        """A request arrived: a warm-up of its document stops now (one of another document only waits:
        the scheduler runs requests first); remember this document's greedy completion request (a
        warm-up after the next pause computes the same kind of completion ahead)."""
        if isinstance(params, P.Complete):
            self.positions[(s.id, uri)] = params.position
            self.focus = (s.id, uri)
            if params.temperature < P.MIN_TEMPERATURE and params.reuse_prefix:
                self.asks[(s.id, uri)] = params
        if self.cancel is not None and self.cancel_key == (s.id, uri):
            finish, active = self.finish or (None, [False])
            if active[0]:
                finish.set()  # mid-step of the quick prompt: end after the target's chunk
            else:
                self._stop()
            # and once the request is done, warm on from what it finished (nothing else re-arms it when
            # no edit follows: the full prompt stayed cold)
            self.touched(s, uri, None, WARM_AFTER_S)

    def closed(self, s: Session, uri: str) -> None:
        """`uri` was closed: its warm-up stops (nobody completes there now) and its state goes."""
        key = (s.id, uri)
        if self.cancel is not None and self.cancel_key == key:
            self._stop()
        if (t := self.timers.pop(key, None)) is not None:
            t.cancel()
        for table in (self.positions, self.warmed, self.asks):
            table.pop(key, None)
        self.context.discard(key)
        if self.focus == key:
            self.focus = None

    def _stop(self) -> None:
        """Stop the warm-up queued or running, within one layer."""
        self.cancel.set()
        if self.finish is not None:
            self.finish[0].set()

    def context_only(self, s: Session, uri: str) -> None:
        """`uri` holds context for other documents' prompts (read by prompt lookup): never warm it."""
        self.context.add((s.id, uri))

    def forget(self, s: Session) -> None:
        if self.cancel is not None and self.cancel_key and self.cancel_key[0] == s.id:
            self._stop()
        for key in [k for k in self.timers if k[0] == s.id]:
            self.timers.pop(key).cancel()
        for table in (self.positions, self.warmed, self.asks):
            for key in [k for k in table if k[0] == s.id]:
                del table[key]
        self.context = {k for k in self.context if k[0] != s.id}
        if self.focus is not None and self.focus[0] == s.id:
            self.focus = None

    def status(self, s: Session) -> dict[str, dict]:
        """Per open document of `s`: is the prompt of its next completion cached (warm)?"""
        out = {}
        for uri, doc in s.docs.items():
            w = self.warmed.get((s.id, uri))
            cached = self.d.engine.cached_prefix_len(w.prompt, (s.id, uri)) if w and self.d.engine else 0
            out[uri] = {"warm": bool(w and w.version == doc.version and cached == len(w.prompt)),
                        "cached_tokens": cached, "prompt_tokens": len(w.prompt) if w else None}
        return out

    def _start(self, s: Session, uri: str) -> None:
        self.timers.pop((s.id, uri), None)
        d = self.d
        if d.engine is None or s.closed or uri not in s.docs:
            return
        key = (s.id, uri)
        busy = any(c.jobs for c in d.sessions.values())  # a request runs or waits: it may fill the quick prompt only
        focus_warming = self.cancel is not None and self.cancel_key == self.focus != key
        if busy or focus_warming:  # try again after it; the focus document's warm-up is never stopped for this one
            self.timers[key] = asyncio.get_running_loop().call_later(WARM_AFTER_S, self._start, s, uri)
            return
        doc = s.docs[uri]
        pos = self.positions.get(key) or end_position(doc.text, s.encoding)
        # where the cursor is known: compute the next completion ahead (a request at this cursor is then
        # served from the engine's memory), as the last one asked here, else greedy and multi-line as
        # editors ask; else only prefill its prompt
        ask = self.asks.get(key)  # (asked, which records it, records the cursor too)
        ahead = key in self.positions
        params = dataclasses.replace(ask, position=pos, version=None) if ask else P.Complete(uri=uri, position=pos)
        try:
            prepared = complete(d, s, params)
        except P.RpcError:  # the remembered position fell off the edited document
            params = dataclasses.replace(params, position=end_position(doc.text, s.encoding))
            prepared = complete(d, s, params)
        if self.cancel is not None:
            self._stop()  # one warm-up at a time: the focus document's, else the newest one
        cancel = self.cancel = threading.Event()
        finish, active = threading.Event(), [False]
        self.finish = (finish, active)  # replaced with cancel: they always belong to the same warm-up
        self.cancel_key = (s.id, uri)
        version = doc.version
        loop = asyncio.get_running_loop()

        def work(ctx: PassContext):  # a generator of steps, run by the scheduler after every request
            if cancel.is_set():
                return None
            built = prepared.build(d.engine)
            loop.call_soon_threadsafe(prepared.learned, built)  # the new anchor: the event loop keeps it
            req, chosen, full = built.request, built.lane, built.full
            cold = chosen is not full  # the full prompt is cold: the quick one first, in its own sequence
            if cold:
                d.scheduler.move(chosen.slot, chosen.capacity)
                # the draft's prefill stops within a layer for a request (finish), the target's chunk ends first
                draft_ctx = dataclasses.replace(ctx, cancel=finish)
                yield from _until(d.engine.warming(chosen.ids, ctx, draft=False), finish, active)
                if ahead and not finish.is_set():
                    # the completion's first tokens from the quick prompt, before the draft reads it (prompt
                    # lookup only): a key typed through them before the full prompt is warm (Enter at the
                    # line's end after a 2 s pause on the 1.5B) is served with no pass
                    first = dataclasses.replace(req, mode="pld", max_tokens=min(req.max_tokens, QUICK_AHEAD_TOKENS),
                                                cancel=cancel)
                    yield from d.engine.run(first, ctx=ctx)
                if not finish.is_set():
                    yield from _until(d.engine.warming(chosen.ids, ctx, draft_ctx, target=False), finish, active)
                if finish.is_set():  # a request for this document came: it goes on from here
                    return None
                d.scheduler.move(full.slot)  # then the full prompt, which later completions move to
                yield from d.engine.warming(full.ids, ctx)
            if cancel.is_set():  # a request came (warming ends quietly when cancelled): it goes now, not
                return None  # after the follow-up's first prefill chunk, which runs whole once begun
            if ahead:  # llama.vim's speculative follow-up: the whole completion, preemptible;
                # on the full prompt, the one a request picks once it is warm (its memory is per prompt:
                # computed on the quick one, it went unused as soon as the full one was warm)
                req = dataclasses.replace(req, prompt=full.ids, heal=full.heal, slot=full.slot, cancel=cancel)
                yield from d.engine.run(req, ctx=ctx)
            elif not cold:
                yield from d.engine.warming(req.prompt, ctx)  # ctx checks `cancel`
            return full.ids

        def done(fut: asyncio.Future) -> None:
            if self.cancel is cancel:
                self.cancel = None
            if not fut.cancelled() and fut.exception() is None and fut.result() is not None:
                self.warmed[(s.id, uri)] = Warmed(version, fut.result())
            elif not fut.cancelled() and fut.exception() is not None:
                log.warning("warm-up of %s failed: %s", uri, fut.exception())

        d.scheduler.submit(work, (s.id, uri), cancel, low=True).add_done_callback(
            lambda fut: loop.call_soon_threadsafe(done, fut))


def _until(steps: Generator, stop: threading.Event, active: list[bool]) -> Generator:
    """The steps of `steps` (prefill chunks) until `stop` is set, checked after each, in the same turn
    (the job then ends without waiting for another turn); active[0] is True while a step computes."""
    while True:
        active[0] = True
        try:
            next(steps)
        except StopIteration:
            return
        finally:
            active[0] = False
        if stop.is_set():
            steps.close()
            return
        yield
