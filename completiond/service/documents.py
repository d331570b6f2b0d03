"""Open documents and LSP incremental edits (positions in UTF-16 code units unless negotiated).

A document keeps a line index (where each line starts) next to its text, updated by each edit
over the edited span only, so an edit or a position costs its line, not the document: a 4M-character
buffer no longer holds the event loop for a re-split on every keystroke.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from ..core.prompt import PositionError, line_index, offset_in, splice_index
from .plan import not_engine_thread
from .protocol import MAX_DOCUMENT_CHARS

INDEX_WINDOW_CHARS = 128 * 1024  # what prompt lookup tokenizes of one buffer per edit (~30 ms, ~32k tokens)
_touch = itertools.count(1)


class DocumentError(ValueError):
    pass


@dataclass
class Document:
    uri: str
    text: str
    version: int
    language_id: str = ""
    indexed_version: int | None = None  # version last written to the prompt-lookup index
    starts: np.ndarray = field(init=False, repr=False)  # line starts, int64, the first 0
    edited_at: int = 0  # offset of the last edit: the prompt-lookup window is centred there
    touched: int = field(default_factory=lambda: next(_touch))  # opened / edited order (most recent last)

    def __post_init__(self) -> None:
        self.starts = line_index(self.text)

    def offset(self, line: int, character: int, encoding: str = "utf-16") -> int:
        """Python string index of an LSP position; PositionError when it lies outside the text."""
        return offset_in(self.text, self.starts, line, character, encoding)

    def apply(self, changes: list[dict], version: int, encoding: str = "utf-16",
              max_chars: int = MAX_DOCUMENT_CHARS) -> None:
        """Apply LSP TextDocumentContentChangeEvents in order; all-or-nothing. A version lower than the
        document's is refused: an edit that old was made on a text this copy no longer has."""
        if version < self.version:
            raise DocumentError(f"version {version} is older than the document's {self.version}: "
                                f"send document/open with the whole text to resynchronise")
        text, starts, at = self.text, self.starts, self.edited_at
        for ch in changes:
            if not isinstance(ch, dict) or not isinstance(ch.get("text"), str):
                raise DocumentError("each change needs a string 'text'")
            new, rng = ch["text"], ch.get("range")
            if rng is None:
                text, starts, at = new, line_index(new), len(new)
                continue
            try:
                start = _offset(text, starts, rng.get("start"), encoding)
                end = _offset(text, starts, rng.get("end"), encoding)
            except (AttributeError, PositionError) as e:
                raise DocumentError(f"bad change range: {e}") from None
            if end < start:
                raise DocumentError("change range ends before it starts")
            text = text[:start] + new + text[end:]
            starts, at = splice_index(text, starts, start, end, len(new)), start + len(new)
        if len(text) > max_chars:
            raise DocumentError(f"document over {max_chars} characters ({len(text)})")
        self.text, self.starts, self.version, self.edited_at = text, starts, version, at
        self.touched = next(_touch)

    def index_window(self) -> str:
        """What prompt lookup indexes of this buffer: all of it, or INDEX_WINDOW_CHARS around the last
        edit (tokenizing a 4M-character buffer on every edit cost seconds)."""
        if len(self.text) <= INDEX_WINDOW_CHARS:
            return self.text
        lo = min(max(0, self.edited_at - INDEX_WINDOW_CHARS // 2), len(self.text) - INDEX_WINDOW_CHARS)
        return self.text[lo:lo + INDEX_WINDOW_CHARS]


@dataclass
class IndexView:
    """A stale buffer as the daemon's index refresh reads it (`text`, `version`, and `indexed_version`
    set once indexed): the text is the document's index window, the version mark lands on the document."""
    doc: Document
    text: str
    version: int

    @property
    def indexed_version(self) -> int | None:
        return self.doc.indexed_version

    @indexed_version.setter
    def indexed_version(self, version: int | None) -> None:
        not_engine_thread("a document's indexed version")
        self.doc.indexed_version = version


def _offset(text: str, starts: np.ndarray, pos, encoding: str) -> int:
    if not isinstance(pos, dict) or not isinstance(pos.get("line"), int) or not isinstance(pos.get("character"), int):
        raise PositionError("a position is {line: int, character: int}")
    return offset_in(text, starts, pos["line"], pos["character"], encoding)
