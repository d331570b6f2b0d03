"""Recent edits of a client's documents: what a next-edit suggestion is predicted from.

Each `document/change` is reduced to one replaced span (old text -> new text, found as the common
prefix and suffix of the text before and after), and typing that continues the last edit of the
same document (its span touched, within MERGE_S) is merged into it, so renaming `x` to `value` one
keystroke at a time is one edit `x -> value`, not five. The ring is bounded (MAX_EDITS edits, each
at most MAX_EDIT_CHARS of old and new text plus a few context lines) and shared by the documents of
one connection, most recent last: the next edit in one file often follows an edit in another.
"""

from __future__ import annotations

import difflib
import time
from collections import deque
from dataclasses import dataclass

MAX_EDITS = 16  # per connection: a prompt shows the last few
MERGE_S = 3.0  # typing that touches the last edit within this many seconds continues it
CONTEXT_LINES = 2  # unchanged lines kept around an edit (shown in its diff hunk)
MAX_EDIT_CHARS = 2000  # a larger replacement (a paste, a formatter) is kept cut to this (the diff says so)


@dataclass
class Edit:
    """`old` replaced by `new` at character offset `start` of `uri`; `before`/`after`: the unchanged
    text around it (CONTEXT_LINES lines each way, whole lines), as the document read after the edit."""
    uri: str
    start: int
    old: str
    new: str
    before: str
    after: str
    line: int  # 0-based line of `start`
    at: float  # time.time() of its last keystroke
    version: int | None = None  # the document version after it
    seq: int = 0  # its place in the connection's history (a merged keystroke keeps the edit's)

    def diff(self, path: str = "") -> str:
        """A unified diff hunk of this edit (the form open next-edit models are trained on)."""
        old = (self.before + self.old + self.after).splitlines(keepends=True)
        new = (self.before + self.new + self.after).splitlines(keepends=True)
        name = path or self.uri
        first = self.line - self.before.count("\n")
        lines = list(difflib.unified_diff(old, new, f"a/{name}", f"b/{name}", n=len(old) + len(new), lineterm=""))
        out = []
        for ln in lines:
            if ln.startswith("@@"):  # difflib numbers from the excerpt: from the document instead
                ln = _shift_hunk(ln, first)
            out.append(ln if ln.endswith("\n") else ln + "\n")
        return "".join(out)


def _shift_hunk(header: str, first: int) -> str:
    """'@@ -1,3 +1,4 @@' of an excerpt -> the same hunk at the excerpt's line in the document."""
    parts = header.split()
    for i in (1, 2):
        sign, nums = parts[i][0], parts[i][1:].split(",")
        nums[0] = str(int(nums[0]) + first)
        parts[i] = sign + ",".join(nums)
    return " ".join(parts)


def common_span(a: str, b: str, hint: int | None = None) -> tuple[int, int, int]:
    """(start, end in a, end in b): a[start:end_a] became b[start:end_b], the rest is equal.
    Binary search over slice comparisons (memcmp): ~1 ms on a 4M-character buffer."""
    n = min(len(a), len(b))
    lo = 0
    if hint is not None and 0 < hint <= n and a[:hint] == b[:hint]:
        lo = hint  # the edit is at or after the hint: search only from there
    hi = n
    while lo < hi:  # the longest equal prefix: a[:lo] == b[:lo]
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    pre = lo
    lo, hi = 0, n - pre
    while lo < hi:  # the longest equal suffix that does not overlap the prefix
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid:len(a) - lo] == b[len(b) - mid:len(b) - lo]:
            lo = mid
        else:
            hi = mid - 1
    return pre, len(a) - lo, len(b) - lo


def _context(text: str, start: int, end: int) -> tuple[str, str, int]:
    """The CONTEXT_LINES whole lines before `start` (with the head of its line) and after `end`
    (with the rest of its line), and the line number of `start`."""
    b = start
    for _ in range(CONTEXT_LINES + 1):
        b = text.rfind("\n", 0, b)
        if b < 0:
            break
    b = b + 1 if b >= 0 else 0
    if start - b > MAX_EDIT_CHARS:
        b = text.find("\n", start - MAX_EDIT_CHARS, start) + 1 or start
    e = end
    for _ in range(CONTEXT_LINES + 1):
        e = text.find("\n", e)
        if e < 0:
            e = len(text)
            break
        e += 1
    if e - end > MAX_EDIT_CHARS:
        e = end + MAX_EDIT_CHARS
    return text[b:start], text[end:e], text.count("\n", 0, start)


def _cut(s: str) -> str:
    return s if len(s) <= MAX_EDIT_CHARS else s[:MAX_EDIT_CHARS] + "\n[...]\n"


class History:
    """The recent edits of one connection's documents (most recent last)."""

    def __init__(self, max_edits: int = MAX_EDITS, merge_s: float = MERGE_S):
        self.edits: deque[Edit] = deque(maxlen=max_edits)
        self.merge_s = merge_s
        self.count = 0  # edits recorded so far (Edit.seq)

    def record(self, uri: str, old_text: str, new_text: str, version: int | None = None,
               hint: int | None = None, now: float | None = None) -> Edit | None:
        """One document/change: `old_text` became `new_text`. Returns the edit it made or continued
        (None when the text did not change)."""
        if old_text is new_text or old_text == new_text:
            return None
        start, end_old, end_new = common_span(old_text, new_text, hint)
        return self.record_span(uri, old_text, new_text, start, end_old, end_new, version, now)

    def record_span(self, uri: str, old_text: str, new_text: str, start: int, end_old: int, end_new: int,
                    version: int | None = None, now: float | None = None) -> Edit | None:
        """`record` with the replaced span known: old_text[start:end_old] became new_text[start:end_new]
        (one incremental change: no comparison of the texts, which costs a copy of a 4M-character buffer)."""
        now = time.time() if now is None else now
        old, new = old_text[start:end_old], new_text[start:end_new]
        if old == new:
            return None
        last = self.edits[-1] if self.edits else None
        whole = last is not None and max(len(last.new), len(last.old)) <= MAX_EDIT_CHARS  # not cut: mergeable
        if whole and last.uri == uri and now - last.at <= self.merge_s \
                and start <= last.start + len(last.new) and end_old >= last.start:
            # continue the last edit: its new text spans [s, s + len(new)) of old_text; the union of
            # both spans, in old_text, was the last edit's before-text there
            s, e = last.start, last.start + len(last.new)
            a, b = min(s, start), max(e, end_old)
            merged_old = old_text[a:s] + last.old + old_text[e:b]
            merged_new = new_text[a:start] + new + new_text[end_old + (end_new - end_old):b + (end_new - end_old)] \
                if b > end_old else new_text[a:start] + new
            # b is in old_text coordinates; past end_old the text shifted by the change's length
            self.edits.pop()
            if merged_old == merged_new:  # typed and deleted again: no edit left
                return None
            start, old, new = a, merged_old, merged_new
            end_new = a + len(merged_new)
            seq = last.seq
        else:
            self.count += 1
            seq = self.count
        before, after, line = _context(new_text, start, end_new)
        edit = Edit(uri, start, _cut(old), _cut(new), before, after, line, now, version, seq)
        self.edits.append(edit)
        return edit

    def recent(self, n: int = 6, uri: str | None = None) -> list[Edit]:
        """The last `n` edits (of `uri` only, when given), oldest first."""
        found = [e for e in self.edits if uri is None or e.uri == uri]
        return found[-n:]

    def shown(self, n: int = 6, step: int = 3) -> list[Edit]:
        """The recent edits a prompt shows, oldest first: between n - step + 1 and n of them, the first
        one moving on only every `step` new edits (not with each), so that the diffs above a new one
        stay the same and a prompt warmed before it keeps them cached."""
        if not self.edits:
            return []
        first = max(0, -(-(self.edits[-1].seq - n) // step) * step + 1)  # seqs first.. last: at most n
        return [e for e in self.edits if e.seq >= first][-n:]

    def last(self, uri: str) -> Edit | None:
        for e in reversed(self.edits):
            if e.uri == uri:
                return e
        return None


def change_span(doc, changes: list, encoding: str) -> tuple[int, int, int] | None:
    """(start, end in the old text, end in the new) of one incremental LSP change, read before it is
    applied (`doc` is a documents.Document); None for several changes, a full text or a bad range."""
    if len(changes) != 1 or not isinstance(changes[0], dict):
        return None
    rng, text = changes[0].get("range"), changes[0].get("text")
    if not isinstance(rng, dict) or not isinstance(text, str):
        return None
    try:
        a = doc.offset(rng["start"]["line"], rng["start"]["character"], encoding)
        b = doc.offset(rng["end"]["line"], rng["end"]["character"], encoding)
    except (KeyError, TypeError, ValueError):
        return None
    return (a, b, a + len(text)) if a <= b else None


def job_key(uri: str) -> str:
    """A document's next-edit job: its own supersede key and cached sequence (not the completion's)."""
    return f"{uri}#next_edit"
