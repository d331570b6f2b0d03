"""`next_edit` {uri, version, position?} -> {edits: [{range, text}], ms, target_passes, ...}.

Prepared on the event loop like `rewrite` (document, version, window and recent edits fixed as the
request arrives), run on the engine thread as a low-priority job: every completion and rewrite
goes first, and a prefill chunk of it gives way to any request between two layers. It has a cached
sequence of its own per document (the job key `uri#next_edit`), so it neither evicts nor supersedes
the document's completion; a newer next edit of the document, or an edit to it, cancels it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from . import protocol as P
from ..core.prompt.context import locate
from ..core.prompt.next_edit import TextEdit, answer_text, edits, next_edit_prompt, window_at
from .plan import Built, Prepared
from .history import job_key
from .session import Session

if TYPE_CHECKING:
    from .daemon import Daemon
    from ..core.engine import Result

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


def prepare(d: Daemon, s: Session, p: P.NextEdit) -> Prepared:
    doc = s.current(p.uri, p.version)
    anchor = s.offset(doc, p.position) if p.position is not None else doc.edited_at
    text, starts, version, lang, tok = doc.text, doc.starts, doc.version, doc.language_id, d.engine.target.tokenizer
    window = window_at(text, min(anchor, len(text)))
    region = text[window.start:window.end]
    roots = list(d.watcher.roots)
    diffs = [e.diff(locate(e.uri, roots)[0]) for e in s.history.recent(HISTORY_EDITS)]
    path = locate(doc.uri, roots)[0]
    mode = p.mode or ("pld" if d.default_mode == "combined" else d.default_mode)
    t0 = time.perf_counter()

    def make() -> Built:
        from ..core.engine import Request

        try:
            ids, stops = next_edit_prompt(tok, text, window, diffs, path, lang, max_tokens=P.MAX_PROMPT_TOKENS)
        except ValueError as e:
            raise P.RpcError(P.INVALID_PARAMS, str(e)) from None
        n_region = len(tok.encode(region, add_special_tokens=False))
        max_tokens = min(P.MAX_REWRITE_TOKENS, 2 * n_region + 64) if p.max_tokens is None else p.max_tokens
        return Built(request=Request(prompt=ids, mode=mode, max_tokens=max_tokens, stops=stops))

    def wire(e: TextEdit) -> dict:
        return {"range": {"start": position_of(text, starts, e.start, s.encoding),
                          "end": position_of(text, starts, e.end, s.encoding)}, "text": e.text}

    def result(res: Result, built: Built) -> dict:
        answer = answer_text(res.text, region)
        found = [] if res.cancelled else edits(region, answer, window.start, finished=res.stopped_by != "max_tokens")
        return {"edits": [wire(e) for e in found], "ms": round((time.perf_counter() - t0) * 1000, 2),
                "target_passes": res.target_passes, "version": version, "cancelled": res.cancelled,
                "window": {"start": position_of(text, starts, window.start, s.encoding),
                           "end": position_of(text, starts, window.end, s.encoding)},
                "text": answer, "tokens": len(res.token_ids), "mean_accepted": round(res.mean_accepted, 4),
                "prompt_tokens": res.prompt_tokens, "reused_tokens": res.reused_tokens,
                "stopped_by": res.stopped_by, "mode": res.mode}

    def superseded() -> dict:
        return {"edits": [], "ms": round((time.perf_counter() - t0) * 1000, 2), "target_passes": 0,
                "version": version, "cancelled": True, "stopped_by": "cancelled", "mode": mode}

    return Prepared(uri=job_key(doc.uri), mode=mode, make=make, partial="next_edit/partial", result=result, low=True,
                    superseded=superseded)
