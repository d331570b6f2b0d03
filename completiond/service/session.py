"""Per-connection state: how the client speaks, its open documents and its requests in flight.

A session lives on the event loop; only `InFlight.cancel` is read by the engine thread. The latest
`complete`/`rewrite` for a document supersedes the older one at the moment it arrives, so a request
is never judged against a document version that a later keystroke produced.
"""

from __future__ import annotations

import asyncio
import heapq
import threading
from dataclasses import dataclass, field
from typing import Any

from . import protocol as P
from .documents import Document, IndexView
from .history import History
from .plan import LoopOwned
from ..core.prompt import PositionError

MAX_INDEXED_BUFFERS = 16  # stale open buffers re-tokenized for prompt lookup per request, most recent first


@dataclass
class InFlight:
    msgid: int
    uri: str
    cancel: threading.Event = field(default_factory=threading.Event)


@dataclass
class Session:
    id: int
    writer: asyncio.StreamWriter
    authed: bool  # Unix-socket peers are the same user (0600 socket); TCP peers after the token
    tcp: bool = False
    encoding: str = "utf-16"
    name: str = ""
    docs: dict[str, Document] = field(default_factory=dict)
    jobs: dict[int, InFlight] = field(default_factory=dict)
    latest: dict[str, InFlight] = field(default_factory=dict)
    # uri -> plan.Anchor: the last prompt built from scratch, which typing at its cursor extends
    # (built on the engine thread, stored by the event loop: plan.Built)
    anchors: dict[str, Any] = field(default_factory=lambda: LoopOwned())
    history: History = field(default_factory=History)  # recent edits of its documents (next_edit)
    closed: bool = False
    received: int = 0  # bytes read so far (bounded before authentication)
    # a new `complete` cancels the older one of its document (one editor's keystrokes); False for the
    # HTTP bridge's session, where the requests are many clients' and each cancels its own (hangs up)
    supersede: bool = True

    def send(self, data: bytes) -> None:
        if not self.closed:
            try:
                self.writer.write(data)
            except (ConnectionError, RuntimeError, OSError):
                self.closed = True

    def doc(self, uri: str) -> Document:
        doc = self.docs.get(uri)
        if doc is None:
            raise P.RpcError(P.INVALID_PARAMS, f"unknown document {uri!r}: send document/open first")
        return doc

    def current(self, uri: str, version: int | None) -> Document:
        """The open document a request names, at the version it names (-32801 if it moved on)."""
        doc = self.doc(uri)
        if version is not None and version != doc.version:
            raise P.RpcError(P.CONTENT_MODIFIED, f"document is at version {doc.version}, request names {version}")
        return doc

    def offset(self, doc: Document, pos: P.Position, what: str = "position") -> int:
        """A wire position -> character offset in the document (negotiated encoding), -32602 if outside."""
        try:
            return doc.offset(pos.line, pos.character, self.encoding)
        except PositionError as e:
            raise P.RpcError(P.INVALID_PARAMS, f"{what} out of range: {e}") from None

    def start(self, msgid: int, uri: str) -> InFlight:
        """Register a request; an older one for the same document is superseded (cancelled) now."""
        if self.supersede and (old := self.latest.get(uri)) is not None:
            old.cancel.set()
        job = InFlight(msgid, uri)
        self.jobs[msgid] = job
        self.latest[uri] = job
        return job

    def finish(self, job: InFlight) -> None:
        self.jobs.pop(job.msgid, None)
        if self.latest.get(job.uri) is job:
            del self.latest[job.uri]

    def index_key(self, uri: str) -> str:
        """Open buffers of different clients are different index entries, even under one URI."""
        return f"{uri}#client{self.id}"

    def chars(self) -> int:
        return sum(len(d.text) for d in self.docs.values())

    def stale_buffers(self) -> list[tuple[str, IndexView]]:
        """Documents whose text changed since the prompt-lookup index last saw them: the most recently
        edited MAX_INDEXED_BUFFERS, each as its index window, so a request's indexing work is bounded
        (20k open buffers or a 4M-character one were tokenized whole before a completion)."""
        stale = [d for d in self.docs.values() if d.indexed_version != d.version]
        stale = heapq.nlargest(MAX_INDEXED_BUFFERS, stale, key=lambda d: d.touched)
        return [(self.index_key(d.uri), IndexView(d, d.index_window(), d.version)) for d in stale]

    def cancel_all(self) -> None:
        self.closed = True
        for job in self.jobs.values():
            job.cancel.set()
