"""Open documents and LSP incremental edits (positions in UTF-16 code units unless negotiated)."""

from __future__ import annotations

from dataclasses import dataclass

from .prompt import PositionError, offset_at
from .protocol import MAX_DOCUMENT_CHARS


class DocumentError(ValueError):
    pass


@dataclass
class Document:
    uri: str
    text: str
    version: int
    language_id: str = ""
    indexed_version: int | None = None  # version last written to the prompt-lookup index

    def apply(self, changes: list[dict], version: int, encoding: str = "utf-16") -> None:
        """Apply LSP TextDocumentContentChangeEvents in order; all-or-nothing."""
        text = self.text
        for ch in changes:
            if not isinstance(ch, dict) or not isinstance(ch.get("text"), str):
                raise DocumentError("each change needs a string 'text'")
            rng = ch.get("range")
            if rng is None:
                text = ch["text"]
                continue
            try:
                start = _offset(text, rng.get("start"), encoding)
                end = _offset(text, rng.get("end"), encoding)
            except (AttributeError, PositionError) as e:
                raise DocumentError(f"bad change range: {e}") from None
            if end < start:
                raise DocumentError("change range ends before it starts")
            text = text[:start] + ch["text"] + text[end:]
        if len(text) > MAX_DOCUMENT_CHARS:
            raise DocumentError(f"document over {MAX_DOCUMENT_CHARS} characters")
        self.text, self.version = text, version


def _offset(text: str, pos, encoding: str) -> int:
    if not isinstance(pos, dict) or not isinstance(pos.get("line"), int) or not isinstance(pos.get("character"), int):
        raise PositionError("a position is {line: int, character: int}")
    return offset_at(text, pos["line"], pos["character"], encoding)
