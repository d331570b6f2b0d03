"""Warm before asked: prefill the prompt a document's next completion needs while the engine is idle.

After `document/open` and after edits (once they pause for WARM_AFTER_S), the daemon queues a
warm-up for that document on the engine thread: the prompt a completion at the document's last
completion position (else its end) would send, prefilled into the target's KV cache. It is the
lowest priority: a request preempts it within one decoder layer (`Engine.preempt_warm`) and
reuses every prefill chunk it finished. `status` reports per document whether its prompt is cached.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import protocol as P
from .handlers import complete

if TYPE_CHECKING:
    from .daemon import Daemon
    from .session import Session

log = logging.getLogger(__name__)
WARM_AFTER_S = 0.3  # typing pauses this long before a warm-up is queued


@dataclass
class Warmed:
    version: int
    prompt: list[int]


def end_position(text: str, encoding: str) -> P.Position:
    """The position after the document's last character, in the session's position encoding."""
    line = text.count("\n")
    last = text[text.rfind("\n") + 1:]
    width = {"utf-8": len(last.encode("utf-8")), "utf-16": len(last.encode("utf-16-le")) // 2}.get(encoding, len(last))
    return P.Position(line, width)


class Warmer:
    def __init__(self, daemon: Daemon, enabled: bool = True):
        self.d = daemon
        self.enabled = enabled
        self.timers: dict[tuple[int, str], asyncio.TimerHandle] = {}
        self.positions: dict[tuple[int, str], P.Position] = {}  # last completion position per document
        self.warmed: dict[tuple[int, str], Warmed] = {}
        self.cancel: threading.Event | None = None  # the warm-up queued or running

    def touched(self, s: Session, uri: str) -> None:
        """A document was opened or edited: warm it once the edits pause."""
        if not self.enabled:
            return
        key = (s.id, uri)
        if (t := self.timers.pop(key, None)) is not None:
            t.cancel()
        self.timers[key] = asyncio.get_running_loop().call_later(WARM_AFTER_S, self._start, s, uri)

    def asked(self, s: Session, uri: str, position: P.Position | None) -> None:
        """A request arrived: stop any warm-up now; remember where completions happen in this document."""
        if position is not None:
            self.positions[(s.id, uri)] = position
        self.preempt()

    def preempt(self) -> None:
        if self.cancel is not None:
            self.cancel.set()
        if self.d.engine is not None:
            self.d.engine.preempt_warm()

    def forget(self, s: Session) -> None:
        for key in [k for k in self.timers if k[0] == s.id]:
            self.timers.pop(key).cancel()
        for table in (self.positions, self.warmed):
            for key in [k for k in table if k[0] == s.id]:
                del table[key]

    def status(self, s: Session) -> dict[str, dict]:
        """Per open document of `s`: is the prompt of its next completion cached (warm)?"""
        out = {}
        for uri, doc in s.docs.items():
            w = self.warmed.get((s.id, uri))
            cached = self.d.engine.cached_prefix_len(w.prompt) if w and self.d.engine else 0
            out[uri] = {"warm": bool(w and w.version == doc.version and cached == len(w.prompt)),
                        "cached_tokens": cached, "prompt_tokens": len(w.prompt) if w else None}
        return out

    def _start(self, s: Session, uri: str) -> None:
        self.timers.pop((s.id, uri), None)
        d = self.d
        busy = any(c.jobs for c in d.sessions.values())
        if d.engine is None or s.closed or uri not in s.docs or busy:
            return  # a request is running or queued: it fills the cache itself
        doc = s.docs[uri]
        pos = self.positions.get((s.id, uri))
        try:
            prepared = complete(d, s, P.Complete(uri=uri, position=pos or end_position(doc.text, s.encoding)))
        except P.RpcError:  # the remembered position fell off the edited document
            prepared = complete(d, s, P.Complete(uri=uri, position=end_position(doc.text, s.encoding)))
        if self.cancel is not None:
            self.cancel.set()  # one warm-up at a time: the newest document wins
        cancel = self.cancel = threading.Event()
        version = doc.version

        def work() -> list[int] | None:
            if cancel.is_set():
                return None
            prompt = prepared.make().prompt
            d.engine.warm(prompt, cancel)
            return prompt

        def done(fut: asyncio.Future) -> None:
            if self.cancel is cancel:
                self.cancel = None
            if not fut.cancelled() and fut.exception() is None and fut.result() is not None:
                self.warmed[(s.id, uri)] = Warmed(version, fut.result())
            elif not fut.cancelled() and fut.exception() is not None:
                log.warning("warm-up of %s failed: %s", uri, fut.exception())

        asyncio.get_running_loop().run_in_executor(d.executor, work).add_done_callback(done)
