"""The outline of what a short prompt's window leaves out above the cursor: the file's imports and the
headers of the blocks that enclose the cursor (its class, its function). A quick prompt (a few hundred
tokens around the cursor) keeps them at its start, before the window, so the model still sees which
names are imported and which function it is in.

Only lines above the window's first line are read, so the outline changes only when the window's cut
or the enclosing blocks do, never while the user types on the cursor's line (the KV-cache prefix stays).
"""

from __future__ import annotations

import re

IMPORT = re.compile(r"(import\s|from\s+\S+\s+import\s|#include\s|using\s|use\s|require\b)")
HEADER = re.compile(r"(async\s+def|def|class|fn|func|function|impl|struct|interface|module|namespace)\b"
                    r"|(public|private|protected|export|static|pub)\s")
MAX_IMPORTS = 24  # lines: a file that imports more shows its first ones


def outline(text: str, window_start: int, offset: int, max_chars: int) -> str:
    """Lines of text[:window_start] that the window text[window_start:offset] needs: the top-level
    imports, then the headers (def/class-like lines) of the blocks enclosing the cursor's line, in file
    order, at most `max_chars` (enclosing headers first, they are nearer the cursor's meaning).
    "" when the window starts at the top or nothing qualifies."""
    if window_start <= 0 or max_chars <= 0:
        return ""
    above = text[:window_start].splitlines(keepends=True)
    # the cursor line's indentation; a line-start cursor on a blank line: the window's last code line's
    line = text[text.rfind("\n", 0, offset) + 1:offset]
    if not line.strip():
        lines = text[window_start:offset].splitlines()
        code = [x for x in lines if x.strip()]
        line = code[-1] if code else line
    indent = _indent(line)
    for w in text[window_start:offset].splitlines():  # a window line at indent d: what encloses it
        if w.strip():                                  # (and the cursor) above the window is left of d
            indent = min(indent, _indent(w))
    headers: list[int] = []
    for i in range(len(above) - 1, -1, -1):
        if indent == 0:
            break
        s = above[i].strip()
        if not s:
            continue
        d = _indent(above[i])
        if d < indent:
            indent = d
            if HEADER.match(s):
                headers.append(i)
    imports = []  # each a run of lines: a parenthesized import goes on to its closing line
    for i, x in enumerate(above):
        if x[:1] not in (" ", "\t", ")") and IMPORT.match(x) and len(imports) < MAX_IMPORTS:
            j = i
            while "(" in x and ")" not in above[j] and j + 1 < len(above) and j - i < 32:
                j += 1
            imports.append(range(i, j + 1))
    keep, used = set(), 0
    for lines in [range(i, i + 1) for i in headers] + imports:  # nearest enclosing header first, then imports
        n = sum(len(above[i]) + (0 if above[i].endswith("\n") else 1) for i in lines)
        if used + n > max_chars:
            break
        keep.update(lines)
        used += n
    return "".join(above[i] if above[i].endswith("\n") else above[i] + "\n" for i in sorted(keep))


def _indent(line: str) -> int:
    return len(line.expandtabs(4)) - len(line.expandtabs(4).lstrip())



MIN_ECHO_KEY = 8  # characters: a shorter line above the cursor (")", "else:") says too little to look up
ECHO_LINES = 3  # lines shown after each earlier or later use of the line above the cursor


def echoes(text: str, window_start: int, window_end: int, offset: int, max_chars: int) -> str:
    """What followed the line above the cursor where the same line appears outside the window
    text[window_start:window_end]: each such line and the ECHO_LINES after it, nearest to the cursor
    first, at most `max_chars`, in file order. The key is the last code line above the cursor's line,
    so the result does not change while the user types on that line (the KV-cache prefix stays).
    It reads the whole document: measured as a quick-prompt option (benchmarks/experiments/
    quick_prompt_variants.py), not used by the daemon; a daemon use would bound the search."""
    if max_chars <= 0:
        return ""
    above = text[window_start:text.rfind("\n", 0, offset) + 1].splitlines()
    code = [x.strip() for x in above if x.strip()]
    key = code[-1] if code else ""
    if len(key) < MIN_ECHO_KEY or not any(c.isalnum() for c in key):
        return ""
    lines = text.splitlines(keepends=True)
    starts, pos = [], 0
    for x in lines:
        starts.append(pos)
        pos += len(x)
    hits = [i for i, x in enumerate(lines) if x.strip() == key and not window_start <= starts[i] < window_end]
    hits.sort(key=lambda i: abs(starts[i] - offset))
    keep: list[range] = []
    used = 0
    for i in hits:
        span = range(i, min(len(lines), i + 1 + ECHO_LINES))
        n = sum(len(lines[j]) for j in span)
        if used + n > max_chars:
            break
        keep.append(span)
        used += n
    keep.sort(key=lambda r: r.start)
    return "".join("".join(lines[j] if lines[j].endswith("\n") else lines[j] + "\n" for j in r) for r in keep)
