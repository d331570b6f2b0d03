"""`next_edit` {uri, version, position?} -> {edits: [{range, text}], ms, target_passes, ...}.

Prepared on the event loop like `rewrite` (document, version, window and recent edits fixed as the
request arrives), run on the engine thread as a low-priority job: every completion and rewrite
goes first, and a prefill chunk of it gives way to any request between two layers. It has a cached
sequence of its own per document (the job key `uri#next_edit`), so it neither evicts nor supersedes
the document's completion; a newer next edit of the document, or an edit to it, cancels it.

Computed ahead in the pauses (`Ahead`): once a client has asked for a next edit, every pause in its
edits (and a resting cursor) queues the next edit at the cursor as a warm-up of that sequence, the
lowest priority, stopped by the next edit to the document. The prompt keeps what an edit changes
last (core/prompt/next_edit.py), so a pause before the edit leaves most of the next request's prompt
cached; a pause after it computes the whole answer, which the request is then served from (the
engine's memory of verified greedy tokens: the same tokens plain decoding gives).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from . import protocol as P
from ..core.forward.context import PassContext
from ..core.prompt.context import locate
from ..core.prompt.next_edit import (COPY_RUN, TextEdit, Window, answer_budget, answer_text, block_start,
                                     call_draft, edits, name_at, next_edit_prompt, next_edit_window, removed_names, renamed_draft)
from .plan import Built, EngineJob
from .history import job_key
from .session import Session

if TYPE_CHECKING:
    from ..core.engine_like import EngineLike
    from ..core.request import Result
    from ..core.speculation.index import TokenIndex
    from .serving import Serving

log = logging.getLogger(__name__)
HISTORY_EDITS = 6  # recent edits shown to the model (all documents of the client, oldest first) ...
HISTORY_STEP = 3  # ... the oldest shown moving on every 3 new edits (History.shown): the diffs stay cached
LATER_S = 0.05  # queued this long after the completion warm-up of the same pause: that one goes first
RETRY_S = 0.3  # a pause that ends with a request queued or running: try again this much later


def position_of(text: str, starts: np.ndarray, offset: int, encoding: str = "utf-16") -> dict:
    """The LSP position of a character offset (`character` in the negotiated encoding)."""
    line = int(np.searchsorted(starts, offset, side="right")) - 1
    head = text[int(starts[line]):offset]
    if encoding == "utf-16":
        n = len(head) + sum(1 for c in head if ord(c) > 0xFFFF)
    elif encoding == "utf-8":
        n = len(head.encode("utf-8", "surrogatepass"))
    else:
        n = len(head)
    return {"line": line, "character": n}


@dataclass(frozen=True, kw_only=True)
class NextEditJob(EngineJob):
    """`next_edit`: the document, its window and the recent edits as the request found them."""
    partial = "next_edit/partial"
    low = True
    params: P.NextEdit
    session: Session  # its position encoding, for the answer's ranges
    index: TokenIndex  # the engine's: the rename draft is open in it while the job runs
    text: str
    starts: np.ndarray  # the document's line starts
    version: int
    lang: str
    window: Window
    diffs: tuple[str, ...]  # recent edits, oldest first
    path: str
    draft: str | None  # a rename's other uses renamed, or a signature change's other calls changed: a draft
    # for copy speculation (the target verifies it)
    draft_key: str
    t0: float  # when the request arrived (perf_counter)

    @property
    def made_of(self) -> tuple:
        """What the prompt is made of (Ahead compares a request's with the one it computes)."""
        return self.version, self.window, self.diffs, self.params.max_tokens

    @property
    def region(self) -> str:
        return self.text[self.window.start:self.window.end]

    def build(self, engine: EngineLike) -> Built:
        from ..core.request import Request

        p, tok = self.params, engine.target.tokenizer
        try:
            ids, stops = next_edit_prompt(tok, self.text, self.window, list(self.diffs), self.path, self.lang,
                                          max_tokens=P.MAX_PROMPT_TOKENS)
        except ValueError as e:
            raise P.RpcError(P.INVALID_PARAMS, str(e)) from None
        n_region = len(tok.encode(self.region, add_special_tokens=False))
        if self.draft is not None:  # prompt lookup searches the index too: it proposes the renamed uses
            engine.index.set_open(self.draft_key, tok.encode(self.draft, add_special_tokens=False))
        else:
            engine.index.close(self.draft_key)
        max_tokens = min(P.MAX_REWRITE_TOKENS, answer_budget(n_region)) if p.max_tokens is None else p.max_tokens
        # typed_through: a next edit computed ahead for this prompt (greedy, verified) is served as is;
        # not when a mode is named (a comparison of modes computes each)
        return Built(request=Request(prompt=ids, mode=self.mode, max_tokens=max_tokens, stops=stops,
                                     typed_through=p.mode is None, max_draft_len=COPY_RUN))

    def _position(self, offset: int) -> dict:
        return position_of(self.text, self.starts, offset, self.session.encoding)

    def _wire(self, e: TextEdit) -> dict:
        return {"range": {"start": self._position(e.start), "end": self._position(e.end)}, "text": e.text}

    def answer(self, result: Result, built: Built) -> dict:
        self.index.close(self.draft_key)
        res, window, region = result, self.window, self.region
        answer = answer_text(res.text, region, self.text[window.end:window.end + 4000])
        found = [] if res.cancelled else edits(region, answer, window.start, finished=res.stopped_by != "max_tokens")
        return {"edits": [self._wire(e) for e in found], "ms": round((time.perf_counter() - self.t0) * 1000, 2),
                "target_passes": res.target_passes, "version": self.version, "cancelled": res.cancelled,
                "window": {"start": self._position(window.start), "end": self._position(window.end)},
                "text": answer, "tokens": len(res.token_ids), "mean_accepted": round(res.mean_accepted, 4),
                "prompt_tokens": res.prompt_tokens, "reused_tokens": res.reused_tokens,
                "served_tokens": res.served_tokens, "stopped_by": res.stopped_by, "mode": res.mode}

    def superseded(self) -> dict:
        self.index.close(self.draft_key)
        return {"edits": [], "ms": round((time.perf_counter() - self.t0) * 1000, 2), "target_passes": 0,
                "version": self.version, "cancelled": True, "stopped_by": "cancelled", "mode": self.mode}


def followed_names(text: str, anchor: int, last) -> list[str]:
    """The names whose next use the region follows: those the last edit (a history Edit, or None)
    removed, and, when the anchor is away from that edit on a line that opens a block (a signature),
    the name under the cursor (a cursor resting on a parameter before renaming it gets the region it
    will have after: the prompt warmed then is the request's up to the edit). Elsewhere (a cursor in a
    body on `self`) the region stays the plain one."""
    names = removed_names(last.old, last.new, last.before, last.after) if last is not None else []
    at_edit = last is not None and last.start <= anchor <= last.start + len(last.new)
    line_start = text.rfind("\n", 0, anchor) + 1
    opens = block_start(text, line_start, before=0) == line_start  # a signature: where a rename starts
    here = None if at_edit or not opens else name_at(text, anchor)
    return sorted(set(names) | {here}) if here else names


def prepare(d: Serving, s: Session, p: P.NextEdit, ahead: bool = False) -> NextEditJob:
    """The next_edit job; `ahead`: the same job for a pause (Ahead), which a request for the same
    prompt then waits for instead of stopping it."""
    doc = s.current(p.uri, p.version)
    anchor = s.offset(doc, p.position) if p.position is not None else doc.edited_at
    text = doc.text
    last = s.history.last(doc.uri)
    anchor = min(anchor, len(text))
    window = next_edit_window(text, anchor, followed_names(text, anchor, last))
    region = text[window.start:window.end]
    draft = (renamed_draft(region, last.old, last.new, last.before, last.after)
             or call_draft(region, last.old, last.new, last.before, last.after)) if last is not None else None
    roots = list(d.watcher.roots)
    diffs = tuple(e.diff(locate(e.uri, roots)[0]) for e in s.history.shown(HISTORY_EDITS, HISTORY_STEP))
    mode = p.mode or ("pld" if d.default_mode == "combined" else d.default_mode)
    job = NextEditJob(uri=job_key(doc.uri), mode=mode, params=p, session=s, index=d.engine.index, text=text,
                      starts=doc.starts, version=doc.version, lang=doc.language_id, window=window, diffs=diffs,
                      path=locate(doc.uri, roots)[0], draft=draft, draft_key=s.index_key(job_key(doc.uri)),
                      t0=time.perf_counter())
    if not ahead and getattr(d, "next_edits", None) is not None:
        d.next_edits.asked(s, doc.uri, job.made_of)
    return job


class Ahead:
    """Next edits computed in the pauses, for the clients that ask for next edits (a client that never
    asks costs nothing). After an edit pauses (as long as the completion warm-up waits, and queued
    after it: that one goes first), or where the cursor rests, the next edit at the cursor runs as
    a warm-up of the document's next-edit sequence: the lowest priority, every request first, a new
    edit to the document stops it. A request whose prompt is the one computed ahead (same version,
    region, diffs) waits for it and is served from the engine's memory of verified tokens; any other
    next_edit request of the document stops it (its prefill chunks stay cached: most of the prompt)."""

    def __init__(self, daemon: Serving, enabled: bool = True):
        self.d = daemon
        self.enabled = enabled
        self.users: set[int] = set()  # sessions that asked for a next edit
        self.timers: dict[tuple[int, str], asyncio.TimerHandle] = {}
        self.positions: dict[tuple[int, str], P.Position] = {}  # the cursor as last seen
        self.running: dict[tuple[int, str], tuple[threading.Event, tuple]] = {}  # cancel, and its prompt's plan

    def asked(self, s: Session, uri: str, plan: tuple) -> None:
        """A next_edit request: this client uses next edits. One computed ahead for another prompt of
        the document stops (the request's prefill goes on from its chunks); one for this prompt goes on."""
        self.users.add(s.id)
        key = (s.id, uri)
        if (t := self.timers.pop(key, None)) is not None:
            t.cancel()  # the request computes it now
        running = self.running.get(key)
        if running is not None and running[1] != plan:
            running[0].set()

    def touched(self, s: Session, uri: str, cursor: P.Position | None, after_s: float) -> None:
        """The document was edited (the cursor now at `cursor`, if known) or the cursor rests: what ran
        ahead for it is stale; compute the next edit once the edits pause."""
        key = (s.id, uri)
        if cursor is not None:
            self.positions[key] = cursor
        if not self.enabled or s.id not in self.users:
            return
        if (running := self.running.pop(key, None)) is not None:
            running[0].set()
        if (t := self.timers.pop(key, None)) is not None:
            t.cancel()
        self.timers[key] = asyncio.get_running_loop().call_later(after_s + LATER_S, self._start, s, uri)

    def closed(self, s: Session, uri: str) -> None:
        """`uri` was closed: what runs ahead for it stops."""
        key = (s.id, uri)
        if (t := self.timers.pop(key, None)) is not None:
            t.cancel()
        if (running := self.running.pop(key, None)) is not None:
            running[0].set()
        self.positions.pop(key, None)

    def forget(self, s: Session) -> None:
        self.users.discard(s.id)
        for key in [k for k in self.timers if k[0] == s.id]:
            self.timers.pop(key).cancel()
        for key in [k for k in self.running if k[0] == s.id]:
            self.running.pop(key)[0].set()
        for key in [k for k in self.positions if k[0] == s.id]:
            del self.positions[key]

    def _start(self, s: Session, uri: str) -> None:
        key = (s.id, uri)
        self.timers.pop(key, None)
        d = self.d
        if d.engine is None or s.closed or uri not in s.docs:
            return
        if getattr(d.engine, "typed", None) is None:  # a remote target: no memory of verified tokens to serve from
            return
        if any(c.jobs for c in d.sessions.values()):  # a request is queued or running: after it
            self.timers[key] = asyncio.get_running_loop().call_later(RETRY_S, self._start, s, uri)
            return
        doc = s.docs[uri]
        params = P.NextEdit(uri=uri, version=doc.version, position=self.positions.get(key))
        try:
            prepared = prepare(d, s, params, ahead=True)
        except P.RpcError:  # the remembered cursor fell off the edited document: at the last edit
            prepared = prepare(d, s, P.NextEdit(uri=uri, version=doc.version), ahead=True)
        cancel = threading.Event()
        self.running[key] = (cancel, prepared.made_of)
        loop = asyncio.get_running_loop()

        def work(ctx: PassContext):  # the whole next edit, as steps: greedy, so the engine remembers it
            if cancel.is_set():
                return None
            req = prepared.build(d.engine).request
            req.cancel = cancel
            res = yield from d.engine.run(req, ctx=ctx)
            return res

        def done(fut) -> None:
            d.engine.index.close(s.index_key(job_key(uri)))  # its rename draft (a request sets its own)
            if self.running.get(key, (None,))[0] is cancel:
                del self.running[key]
            if not fut.cancelled() and fut.exception() is not None:
                log.warning("next edit ahead of %s failed: %s", uri, fut.exception())

        d.scheduler.submit(work, (s.id, job_key(uri)), cancel, low=True).add_done_callback(
            lambda fut: loop.call_soon_threadsafe(done, fut))
