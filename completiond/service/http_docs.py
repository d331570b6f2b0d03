"""Which document an HTTP completion is in: the daemon's documents for clients that send text, not files.

llama.vim and llama.vscode send a window of the buffer (256 lines before the cursor, the cursor's
line, 64 after); OpenAI FIM clients a prefix and a suffix. None says which file. A request is placed
in an open synthetic document, in order:

1. the file the client names (`X-Completiond-File` header): that document;
2. the document whose lines the window's lines align with (distinct lines found at one shift in
   the document: a cursor jump moves the window, the lines stay where they were);
3. the document whose text shares a long prefix or suffix with the request (typing on);
4. else a new one.

A window placed in a document is spliced into it: the document's lines before and after the window
stay, so the document grows towards the whole file, its prompt cuts land on the file's own line
numbers (the KV cache of the prompt's start survives a jump) and a jump reuses the document's warm
state instead of opening a cold one.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from .protocol import MAX_DOCUMENT_CHARS

log = logging.getLogger("completiond.http")

FILE_HEADER = "x-completiond-file"  # the client names the file it asks about (any string; a path)
MAX_DOCS = 16  # synthetic documents kept open (least recently used closed first)
MIN_MATCH_CHARS = 64  # shared prefix or suffix that makes a request "the same document"
MIN_LINE_CHARS = 8  # a line shorter than this (stripped) says nothing about where it is
MIN_VOTES = 3  # distinct lines that agree on one shift: the window lies there
PROBE_LINES = 48  # lines from each end of the window that vote
URI = "completiond-http:/"


@dataclass
class Text:
    """A synthetic document's text, with where its distinct lines are (built once per text)."""
    text: str
    lines: list[str] = field(init=False, repr=False)
    where: dict[str, int] = field(init=False, repr=False)  # line -> its index, for lines found once

    def __post_init__(self) -> None:
        self.lines = self.text.splitlines(keepends=True)
        counts = Counter(self.lines)
        self.where = {ln: i for i, ln in enumerate(self.lines) if counts[ln] == 1 and len(ln.strip()) >= MIN_LINE_CHARS}


@dataclass(frozen=True)
class Placed:
    """Where a request goes: `uri` (None: a new document), the document's new text and the cursor in it."""
    uri: str | None
    text: str
    cursor: int
    how: str  # "named", "aligned", "continued" or "new"


def _shift(doc: Text, lines: list[str], probe: range) -> tuple[int | None, int]:
    """The shift d (window line i is document line i + d) most of the probed window lines agree on,
    and how many agree; (None, 0) when fewer than MIN_VOTES do."""
    votes = Counter(doc.where[lines[i]] - i for i in probe if lines[i] in doc.where)
    if not votes:
        return None, 0
    d, n = votes.most_common(1)[0]
    return (d, n) if n >= MIN_VOTES else (None, 0)


def align(doc: Text, text: str, cursor: int) -> tuple[str, int, int] | None:
    """`text` (a window of the file, the cursor in it) spliced into `doc` where its lines align: (the
    document's new text, the cursor in it, the agreeing lines); None where they do not align. The
    window's head and tail are aligned apart: the lines the user added or removed inside the window
    move the tail."""
    lines = text.splitlines(keepends=True)
    if not lines:
        return None
    n = len(lines)
    head, n_head = _shift(doc, lines, range(min(n, PROBE_LINES)))
    tail, n_tail = _shift(doc, lines, range(max(0, n - PROBE_LINES), n))
    if head is None and tail is None:
        return None
    head = tail if head is None else head
    tail = head if tail is None else tail
    before = max(head, 0)  # document lines before the window
    after = max(tail + n, 0)  # the first document line after it
    if after < before or before > len(doc.lines):
        return None
    if not text.endswith(("\n", "\r")) and after < len(doc.lines):
        return None  # a window that ends mid-line cannot be followed by the document's lines
    kept_before = "".join(doc.lines[:before])
    merged = kept_before + text + "".join(doc.lines[after:])
    if len(merged) > MAX_DOCUMENT_CHARS:
        return None
    return merged, len(kept_before) + cursor, max(n_head, n_tail)


class DocumentMap:
    """The HTTP session's synthetic documents: uri -> text, most recently used last; names from the
    file header. Pure bookkeeping: the bridge opens, changes and closes the daemon's documents."""

    def __init__(self) -> None:
        self.texts: OrderedDict[str, Text] = OrderedDict()
        self.names: dict[str, str] = {}  # file name (header) -> uri
        self._next = 0

    def clear(self) -> None:
        self.texts.clear()
        self.names.clear()

    def place(self, text: str, cursor: int, name: str | None = None) -> Placed:
        """Where `text` (cursor at `cursor`) goes; nothing is recorded until `opened` / `changed`."""
        if name is not None and (uri := self.names.get(name)) in self.texts:
            got = align(self.texts[uri], text, cursor)
            if got is not None:
                return Placed(uri, got[0], got[1], "named")
            return Placed(uri, text, cursor, "named")  # the client says so: its text replaces the old
        best: tuple[int, str, str, int] | None = None
        for uri, doc in self.texts.items():
            if name is not None and uri in self.names.values():
                continue  # another named file
            got = align(doc, text, cursor)
            if got is not None and (best is None or got[2] >= best[0]):
                best = (got[2], uri, got[0], got[1])
        if best is not None:
            return Placed(best[1], best[2], best[3], "aligned")
        uri = self.continued(text)
        if uri is not None and (name is None or uri not in self.names.values()):
            return Placed(uri, text, cursor, "continued")
        return Placed(None, text, cursor, "new")

    def continued(self, text: str) -> str | None:
        """The document this text continues: the longest shared prefix or suffix (at least
        MIN_MATCH_CHARS, or half the text when it is short)."""
        need = min(MIN_MATCH_CHARS, len(text) // 2 + 1)
        best, best_n = None, 0
        for uri, old in self.texts.items():
            n = max(_common_prefix(old.text, text), _common_suffix(old.text, text))
            if n >= need and n >= best_n:
                best, best_n = uri, n
        return best

    def new_uri(self, name: str | None) -> str:
        self._next += 1
        return f"{URI}doc-{self._next}" + (f"/{name.lstrip('/')}" if name else "")

    def evict(self) -> list[str]:
        """The least recently used uris to close so that one more document fits."""
        out = []
        while len(self.texts) >= MAX_DOCS:
            uri, _ = self.texts.popitem(last=False)
            self._forget_name(uri)
            out.append(uri)
        return out

    def record(self, uri: str, text: str, name: str | None = None) -> None:
        """The daemon's document `uri` now holds `text` (opened or changed); most recently used."""
        old = self.texts.get(uri)
        self.texts[uri] = old if old is not None and old.text == text else Text(text)
        self.texts.move_to_end(uri)
        if name is not None:
            self.names[name] = uri

    def _forget_name(self, uri: str) -> None:
        for k in [k for k, v in self.names.items() if v == uri]:
            del self.names[k]


def _common_prefix(a: str, b: str) -> int:
    """Length of the shared prefix, by bisection over C-speed slice compares (not a Python loop)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_suffix(a: str, b: str) -> int:
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid:] == b[len(b) - mid:]:
            lo = mid
        else:
            hi = mid - 1
    return lo
