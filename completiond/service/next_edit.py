"""`next_edit` {uri, version, position?} -> {edits: [{range, text}], ms, target_passes, ...}.

Prepared on the event loop like `rewrite` (document, version, window and recent edits fixed as the
request arrives), run on the engine thread as a low-priority job: every completion and rewrite
goes first, and a prefill chunk of it gives way to any request between two layers. It has a cached
sequence of its own per document (the job key `uri#next_edit`), so it neither evicts nor supersedes
the document's completion; a newer next edit of the document, or an edit to it, cancels it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from . import protocol as P
from ..core.prompt.context import locate
from ..core.prompt.next_edit import TextEdit, Window, answer_text, edits, next_edit_prompt, window_at
from .plan import Built, EngineJob
from .history import job_key
from .session import Session

if TYPE_CHECKING:
    from .serving import Serving
    from ..core.engine_like import EngineLike
    from ..core.request import Result

HISTORY_EDITS = 6  # recent edits shown to the model (all documents of the client, oldest first)


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
    text: str
    starts: np.ndarray  # the document's line starts
    version: int
    lang: str
    window: Window
    diffs: list[str]  # recent edits, oldest first
    path: str
    t0: float  # when the request arrived (perf_counter)

    def build(self, engine: EngineLike) -> Built:
        from ..core.engine import Request

        p, tok = self.params, engine.target.tokenizer
        try:
            ids, stops = next_edit_prompt(tok, self.text, self.window, self.diffs, self.path, self.lang,
                                          max_tokens=P.MAX_PROMPT_TOKENS)
        except ValueError as e:
            raise P.RpcError(P.INVALID_PARAMS, str(e)) from None
        n_region = len(tok.encode(self.region, add_special_tokens=False))
        max_tokens = min(P.MAX_REWRITE_TOKENS, 2 * n_region + 64) if p.max_tokens is None else p.max_tokens
        return Built(request=Request(prompt=ids, mode=self.mode, max_tokens=max_tokens, stops=stops))

    @property
    def region(self) -> str:
        return self.text[self.window.start:self.window.end]

    def _position(self, offset: int) -> dict:
        return position_of(self.text, self.starts, offset, self.session.encoding)

    def _wire(self, e: TextEdit) -> dict:
        return {"range": {"start": self._position(e.start), "end": self._position(e.end)}, "text": e.text}

    def answer(self, result: Result, built: Built) -> dict:
        res, window = result, self.window
        answer = answer_text(res.text, self.region)
        found = [] if res.cancelled else edits(self.region, answer, window.start,
                                                finished=res.stopped_by != "max_tokens")
        return {"edits": [self._wire(e) for e in found], "ms": round((time.perf_counter() - self.t0) * 1000, 2),
                "target_passes": res.target_passes, "version": self.version, "cancelled": res.cancelled,
                "window": {"start": self._position(window.start), "end": self._position(window.end)},
                "text": answer, "tokens": len(res.token_ids), "mean_accepted": round(res.mean_accepted, 4),
                "prompt_tokens": res.prompt_tokens, "reused_tokens": res.reused_tokens,
                "stopped_by": res.stopped_by, "mode": res.mode}

    def superseded(self) -> dict:
        return {"edits": [], "ms": round((time.perf_counter() - self.t0) * 1000, 2), "target_passes": 0,
                "version": self.version, "cancelled": True, "stopped_by": "cancelled", "mode": self.mode}


def prepare(d: Serving, s: Session, p: P.NextEdit) -> NextEditJob:
    doc = s.current(p.uri, p.version)
    anchor = s.offset(doc, p.position) if p.position is not None else doc.edited_at
    window = window_at(doc.text, min(anchor, len(doc.text)))
    roots = list(d.watcher.roots)
    diffs = [e.diff(locate(e.uri, roots)[0]) for e in s.history.recent(HISTORY_EDITS)]
    path = locate(doc.uri, roots)[0]
    mode = p.mode or ("pld" if d.default_mode == "combined" else d.default_mode)
    return NextEditJob(uri=job_key(doc.uri), mode=mode, params=p, session=s, text=doc.text, starts=doc.starts,
                       version=doc.version, lang=doc.language_id, window=window, diffs=diffs, path=path,
                       t0=time.perf_counter())
