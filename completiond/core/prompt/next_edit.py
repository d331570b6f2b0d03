"""Next-edit suggestions: the target rewrites a window of code given the user's recent edits.

The prompt follows the open next-edit models (Zeta, Sweep): the code around the cursor, the recent
edits as unified diffs, and an editable region between markers; the model answers with the region
rewritten. It is laid out for the KV cache: what changes least comes first (the instructions, the
code around the region, with the region cut out of it), then the edits (oldest first: a new one is
appended), then the region, which the edit being typed changes. A prompt warmed while the cursor
rested before the edit (service/next_edit.py) then holds everything up to the new edit's diff. The answer mostly copies the region, which sits in the prompt token for token, so
prompt lookup (which searches the prompt itself) proposes long runs of it and a verify pass accepts
them: a speculative edit whose draft is the window. Greedy output is the target's own (lossless);
`edits` then diffs it against the window and offers only what changed, as the smallest spans.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from . import bos_ids
from .stops import StopRules

FENCE = "```"
START, END = "<|editable_region_start|>", "<|editable_region_end|>"
HOLE = "<|editable_region|>"  # where the region sits in the code around it (shown there without it)
SYSTEM = ("You predict a programmer's next edit. You are shown the code around their cursor, their recent edits as "
          f"unified diffs, then the editable region, between {START} and {END}. Reply with the "
          "editable region rewritten with the edit they will most likely make next (for example: a name they renamed, "
          "renamed at its other uses; a changed signature followed through; a pattern they applied, applied again), "
          f"in one fenced code block that starts with {START} and ends with {END}, nothing else. Copy every line "
          "that needs no change exactly; if nothing needs "
          "to change, reply with the region unchanged.")
LINES_BEFORE, LINES_AFTER = 4, 12  # the editable region around the anchor line: most next edits are below
MAX_WINDOW_CHARS = 2400  # a region of long lines is cut to this (whole lines)
CONTEXT_CHARS = 1500  # code shown above the region, first in the prompt (cached: it rarely changes) ...
AFTER_CHARS = 1200  # ... and below it (both shrink to fit the budget); the region itself comes last.
# (with the region inline in 3,000 characters around it the 1.5B copied back a rename case whose other
# methods used the old name; with 1,200 it renamed)
SCOPE_LINES = 1000  # the header of the anchor's block is looked for this far up, its uses ...
SCOPE_CHARS = 20_000  # ... this far down (both scans are Python loops on the event loop: bounded)
FOLLOW_LINES = 12  # the region grows down by up to this many lines to reach the next use of a name the
# last edit removed; a use further down gets a region of its own there (a jump)
USE_LINES = 2  # ... and ends this many lines below that use's line: a shorter region to prefill and rewrite
MAX_HINT_CHARS = 60  # the last change named in words only when it is this short (a rename, a literal)
LAST_CHANGE_HINT = True
OVERRUN_LINES = 3  # the first code lines below the region stop an answer that copies on into them
MAX_OVERRUN_LINES = 60  # lines below the region an overrun is looked for in
COPY_RUN = 64  # tokens per prompt-lookup candidate in a next edit (a completion's: 16): the answer copies
# its region back in runs up to the next change, and one CPU pass over 64 nodes costs 1.5-2.2x one over
# 16 (Request.max_draft_len; the tree budget still cuts a run to what its measured acceptance pays)
MIN_SIMILARITY = 0.5  # an answer that changes more than half the region is not an edit but a new text: none


@dataclass(frozen=True)
class Window:
    start: int  # offsets in the document: whole lines
    end: int


@dataclass(frozen=True)
class TextEdit:
    start: int  # offsets in the document
    end: int
    text: str


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def block_start(text: str, line_start: int, before: int = LINES_BEFORE) -> int | None:
    """Where the block of the line at `line_start` starts, when that is at most `before` lines above:
    the line itself when it opens a block (the next code line is indented deeper: a `def`, a `class`,
    an `if`, a `{`), with the decorators directly above it; else the nearest line above indented less
    (the header of the block it is in, or the start of the statement it continues). None when there is
    none that near. By indentation only, so any language; blank lines do not count."""
    nl = text.find("\n", line_start)
    line = text[line_start:nl if nl >= 0 else len(text)]
    if not line.strip():
        return None
    ind, pos = _indent(line), nl + 1 if nl >= 0 else len(text)
    while pos < len(text):  # the next code line
        e = text.find("\n", pos)
        nxt = text[pos:e if e >= 0 else len(text)]
        if nxt.strip():
            break
        pos = e + 1 if e >= 0 else len(text)
    else:
        nxt = ""
    a = line_start
    if nxt.strip() and _indent(nxt) > ind:  # it opens a block: start here, decorators included
        for _ in range(before):
            if a == 0:
                break
            p = text.rfind("\n", 0, a - 1) + 1
            prev = text[p:a - 1]
            if not (prev.lstrip().startswith("@") and _indent(prev) == ind):
                break
            a = p
        return a
    for _ in range(before):
        if a == 0:
            break
        a = text.rfind("\n", 0, a - 1) + 1
        prev = text[a:text.find("\n", a)]
        if prev.strip() and _indent(prev) < ind:
            return a
    return None


def window_at(text: str, offset: int, before: int = LINES_BEFORE, after: int = LINES_AFTER,
              max_chars: int = MAX_WINDOW_CHARS) -> Window:
    """Whole lines around the line of `offset`: from the start of its block (`block_start`: the
    function whose signature was edited, the `if` it is in) when that is at most `before` lines above,
    else `before` lines above it; `after` lines below it; at most `max_chars` (lines are dropped from
    the far end below first, then above). A region that opened in the previous function's tail or a
    docstring's end is where both Qwen targets copied a rename back unchanged (benchmarks/next_edit.py, docs/next-edit.md)."""
    line_start = text.rfind("\n", 0, offset) + 1
    a = block_start(text, line_start, before)
    if a is None:
        a = line_start
        for _ in range(before):
            if a == 0:
                break
            a = text.rfind("\n", 0, a - 1) + 1
    b = line_start
    for _ in range(after + 1):
        nl = text.find("\n", b)
        if nl < 0:
            b = len(text)
            break
        b = nl + 1
    while b - a > max_chars and b > line_start:  # too long: drop lines below, then above
        cut = text.rfind("\n", line_start, b - 1)
        if cut < line_start:
            break
        b = cut + 1
    while b - a > max_chars and a < line_start:
        a = text.find("\n", a, line_start) + 1
    if b - a > max_chars:  # one line longer than the region: its part around the offset
        a, b = max(a, offset - max_chars // 2), min(b, max(a, offset - max_chars // 2) + max_chars)
    return Window(a, b)


def removed_names(old: str, new: str, before: str = "", after: str = "") -> list[str]:
    """The identifiers an edit removed: `old` replaced by `new` between `before` and `after` (widened to
    whole identifiers by the text around it), found in the old text and not in the new one."""
    head, tail = re.search(r"\w*$", before).group(), re.match(r"\w*", after).group()
    ident = re.compile(r"[A-Za-z_]\w*")
    return sorted(set(ident.findall(head + old + tail)) - set(ident.findall(head + new + tail)))


def renamed_draft(region: str, old: str, new: str, before: str = "", after: str = "") -> str | None:
    """A draft of the answer when the last edit (`old` -> `new` between `before` and `after`) renamed
    one identifier to another: the region with that name's other code uses renamed too. Only a draft
    (copy speculation proposes from it and the target verifies every token: the answer stays the
    target's own, not this); None when the edit is no such rename or the region has no other use."""
    gone, came = removed_names(old, new, before, after), removed_names(new, old, before, after)
    if len(gone) != 1 or len(came) != 1:
        return None
    quiet = _quiet_spans(region)
    out, last = [], 0
    for m in re.finditer(r"(?<![\w.])" + re.escape(gone[0]) + r"\b", region):
        if not any(a <= m.start() < b for a, b in quiet):
            out += [region[last:m.start()], came[0]]
            last = m.end()
    return "".join(out) + region[last:] if out else None


def _args(inner: str) -> list[str] | None:
    """`a, f(b, c), d` -> ['a', 'f(b, c)', 'd'] (split at top-level commas, spaces kept off); None when
    brackets do not balance or there is a string (too hard to read lexically)."""
    out, depth, cur = [], 0, ""
    for c in inner:
        if c in "\"'":
            return None
        depth += c in "([{"
        depth -= c in ")]}"
        if depth < 0:
            return None
        if c == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += c
    if depth:
        return None
    return out + [cur.strip()] if cur.strip() or out else []


def _calls_in(code: str, name: str) -> list[tuple[int, int, list[str]]]:
    """One-line calls `name(...)` (or `x.name(...)`) in `code`, not `def name(`: (start and end of the
    argument text, the arguments)."""
    out = []
    for m in re.finditer(r"(?<![\w])" + re.escape(name) + r"\(", code):
        if re.search(r"\bdef\s+$", code[:m.start()]):
            continue
        depth, j = 1, m.end()
        while j < len(code) and depth and code[j] != "\n":
            depth += code[j] in "([{"
            depth -= code[j] in ")]}"
            j += 1
        if depth == 0 and (args := _args(code[m.end():j - 1])) is not None:
            out.append((m.end(), j - 1, args))
    return out


def call_draft(region: str, old: str, new: str, before: str = "", after: str = "") -> str | None:
    """A draft of the answer when the last edit (`old` -> `new` between `before` and `after`, whole
    lines around it) changed a function's parameters or one call's arguments: the region's other calls
    of that function changed the same way. A signature `def f(a, b, c)` -> `def f(b, a)` (parameters
    reordered or removed, by name) moves or drops the same positions of calls with as many arguments
    as it had; a call `f(x, y)` -> `f(x, y, z=1)` (arguments appended) appends them to the other calls.
    Only a draft, as `renamed_draft`: the target verifies every token. None when it is no such edit."""
    line_a = before[before.rfind("\n") + 1:] + old + after[:after.find("\n") if "\n" in after else len(after)]
    line_b = before[before.rfind("\n") + 1:] + new + after[:after.find("\n") if "\n" in after else len(after)]
    sig = re.compile(r"\bdef\s+(\w+)\s*\((.*)\)")
    ma, mb = sig.search(line_a), sig.search(line_b)
    if ma and mb and ma.group(1) == mb.group(1):
        pa, pb = _args(ma.group(2)), _args(mb.group(2))
        if pa is None or pb is None:
            return None
        names_a = [re.split(r"[:=]", p)[0].strip() for p in pa if p not in ("self", "cls")]
        names_b = [re.split(r"[:=]", p)[0].strip() for p in pb if p not in ("self", "cls")]
        if names_a == names_b or not set(names_b) <= set(names_a) or len(set(names_a)) != len(names_a):
            return None
        order = [names_a.index(n) for n in names_b]
        name, n_args = ma.group(1), len(names_a)

        def change(args: list[str]) -> list[str] | None:
            return [args[i] for i in order] if len(args) == n_args else None
    else:
        found = [(m.group(1), m) for m in re.finditer(r"([A-Za-z_]\w*)\(", line_a)]
        for fname, _ in found:
            a, b = _calls_in(line_a, fname), _calls_in(line_b, fname)
            if len(a) == 1 and len(b) == 1 and b[0][2][:len(a[0][2])] == a[0][2] and len(b[0][2]) > len(a[0][2]):
                extra = b[0][2][len(a[0][2]):]
                name, n_args = fname, len(a[0][2])
                break
        else:
            return None

        def change(args: list[str]) -> list[str] | None:
            return args + extra if len(args) == n_args else None
    out, last = [], 0
    for s, e, args in _calls_in(region, name):
        new_args = change(args)
        if new_args is not None and new_args != args:
            out += [region[last:s], ", ".join(new_args)]
            last = e
    return "".join(out) + region[last:] if out else None


def _quiet_spans(code: str) -> list[tuple[int, int]]:
    """Spans of `code` that are strings or comments (`#`, `//`, quotes single or triple): a name there
    is a mention, not a use. Lexical and approximate, so any language."""
    out, i, n = [], 0, len(code)
    while i < n:
        c = code[i]
        if c == "#" or code.startswith("//", i):
            e = code.find("\n", i)
            e = n if e < 0 else e
        elif c in "\"'":
            q = code[i:i + 3] if code[i:i + 3] in ('"""', "'''") else c
            e, j = n, i + len(q)
            while j < n:
                if code[j] == "\\":
                    j += 2
                    continue
                if code.startswith(q, j):
                    e = j + len(q)
                    break
                if len(q) == 1 and code[j] == "\n":  # an unclosed one-line string ends with its line
                    e = j
                    break
                j += 1
        else:
            i += 1
            continue
        out.append((i, e))
        i = max(e, i + 1)
    return out


def scope_end(text: str, offset: int) -> int:
    """Where the block around the line of `offset` ends: the block it opens (a `def` edited in its
    signature) or the one it is in (its nearest less-indented line above), at the first code line
    indented no deeper than that header; the end of the text for a top-level line. By indentation."""
    line_start = text.rfind("\n", 0, offset) + 1
    head = block_start(text, line_start, before=SCOPE_LINES)
    if head is None:
        return len(text)
    while text[head:text.find("\n", head)].lstrip().startswith("@"):  # a decorator: its `def` is the header
        head = text.find("\n", head) + 1
    nl = text.find("\n", head)
    ind = _indent(text[head:nl if nl >= 0 else len(text)])
    pos = nl + 1 if nl >= 0 else len(text)
    while pos < len(text):
        e = text.find("\n", pos)
        line = text[pos:e if e >= 0 else len(text)]
        if line.strip() and _indent(line) <= ind:
            return pos
        pos = e + 1 if e >= 0 else len(text)
    return len(text)


def name_at(text: str, offset: int) -> str | None:
    """The identifier `offset` is in or just after (the cursor resting on or behind a name), or None;
    a Python keyword is no name (`def`)."""
    import keyword

    a = offset
    while a > 0 and (text[a - 1].isalnum() or text[a - 1] == "_"):
        a -= 1
    b = offset
    while b < len(text) and (text[b].isalnum() or text[b] == "_"):
        b += 1
    word = text[a:b]
    if not word or word[0].isdigit() or keyword.iskeyword(word):
        return None
    return word


def next_use(text: str, start: int, end: int, names: list[str]) -> int | None:
    """The offset of the first code use (not in a string or comment, not an attribute `x.name`) of one
    of `names` in text[start:end], or None."""
    if not names:
        return None
    code = text[start:end]
    quiet = _quiet_spans(code)
    pattern = re.compile(r"(?<![\w.])(?:" + "|".join(re.escape(n) for n in names) + r")\b")
    for m in pattern.finditer(code):
        if not any(a <= m.start() < b for a, b in quiet):
            return start + m.start()
    return None


def next_edit_window(text: str, offset: int, names: list[str] = (), follow_lines: int = FOLLOW_LINES,
                     max_chars: int = MAX_WINDOW_CHARS, use_lines: int | None = USE_LINES) -> Window:
    """The editable region for a next edit at `offset`: `window_at`, made to follow the next use of a
    name the last edit removed (`names`: a renamed parameter) in the block of `offset` (`scope_end`).
    A use below the region within `follow_lines` lines of its end (and `max_chars` of its start) grows
    the region down to it (past a docstring); one further down gets the region around it instead (a
    jump: the editors show it as the next edit at that line). With such a use, or when the line of
    `offset` opens its block (a `def` edited in its signature), the region ends where the block does:
    the next function's own uses of a name are another scope, and the region is the same before the
    edit (the cursor resting there) as after it, so the prompt warmed before it stays valid. A use
    counts only as code (`next_use`: not in a docstring or comment); else the region is `window_at`'s.
    With a use, the region ends `use_lines` lines below the use's line (within the block; None: at
    the window's own end): the next edit there is that use's, and every line more is prefilled at
    the request and copied by the answer."""
    w = window_at(text, offset, max_chars=max_chars)
    line_start = text.rfind("\n", 0, offset) + 1
    line_end = text.find("\n", offset)
    below = len(text) if line_end < 0 else line_end + 1
    block_end = scope_end(text, offset)
    use = next_use(text, below, min(block_end, below + SCOPE_CHARS), list(names))
    if use is None:
        opens = block_start(text, line_start, before=0) == line_start
        return Window(w.start, max(min(w.end, block_end), below)) if opens else w
    end = use
    for _ in range(3):  # the use's line and two more
        nl = text.find("\n", end)
        end = len(text) if nl < 0 else nl + 1
    use_end = text.find("\n", use) + 1 or len(text)
    tight = use_end
    for _ in range(use_lines or 0):
        nl = text.find("\n", tight)
        tight = len(text) if nl < 0 else nl + 1
    if use < w.end:
        return Window(w.start, max(min(w.end if use_lines is None else min(w.end, tight), block_end), use_end))
    if text.count("\n", w.end, end) <= follow_lines and end - w.start <= max_chars:
        return Window(w.start, max(min(end, block_end), use_end))
    j = window_at(text, use, max_chars=max_chars)
    return Window(j.start, max(min(j.end if use_lines is None else tight, block_end), use_end))


def answer_budget(region_tokens: int) -> int:
    """The most tokens an answer for a region of `region_tokens` may take: the region, an end marker
    and room for what a next edit adds (a longer name at each use, an argument at each call). An
    answer that repeats lines or rewrites the function below ran to twice the region before (the
    0.5B: 260-358 tokens for 130-170-token regions, wrong every time); it now stops earlier. Greedy
    decoding of the same prompt with the same budget gives the same answer."""
    return region_tokens + 32 + region_tokens // 8


def next_edit_prompt(tokenizer, text: str, window: Window, diffs: list[str], path: str = "", language: str = "",
                     max_tokens: int = 3072) -> tuple[list[int], StopRules]:
    """Prompt ids and stop rules for rewriting `text[window]` as the next edit after `diffs`.

    In cache order: the instructions and the code around the region, the region cut out of it (the
    same before and after the edit being typed, while the region stays), the diffs oldest first, then
    the region and the last change named. The code around the region shrinks until the prompt holds at
    most `max_tokens` (then the oldest diffs are dropped); ValueError if the region alone does not fit."""
    region = text[window.start:window.end]
    lang = language or ""
    name = f" ({path})" if path else ""

    def build(before: str, after: str, shown: list[str]) -> list[int]:
        edits = "".join(shown) or "(none yet)\n"
        hint = last_change_hint(shown[-1]) if shown and LAST_CHANGE_HINT else ""
        above = before if before.endswith("\n") or not before else before + "\n"
        code = f"{above}{HOLE}\n{after}"
        if not code.endswith("\n"):
            code += "\n"
        shown_region = f"{START}\n{region}{'' if region.endswith(chr(10)) or not region else chr(10)}{END}\n"
        head = f"Code around the editable region{name}, which is the line {HOLE} here:\n{FENCE}{lang}\n{code}{FENCE}\n\n"
        history = f"Recent edits, oldest first:\n{FENCE}diff\n{edits}{FENCE}\n\n"
        if getattr(tokenizer, "chat_template", None):
            user = (f"{head}{history}The editable region:\n{FENCE}{lang}\n{shown_region}{FENCE}\n\n"
                    f"{hint}Rewrite the editable region with the next edit.")
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
            doc = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            # the answer opens with the start marker: it copies the region, not the code shown above it
            return tokenizer.encode(doc + f"{FENCE}{lang}\n{START}\n", add_special_tokens=False)
        doc = (f"{head}{history}The editable region:\n{FENCE}{lang}\n{shown_region}{FENCE}\n\n"
               f"{hint}Editable region after the next edit:\n{FENCE}{lang}\n{START}\n")
        return bos_ids(tokenizer) + tokenizer.encode(doc, add_special_tokens=False)

    chars, shown = CONTEXT_CHARS, list(diffs)
    while True:
        before = text[max(0, window.start - chars):window.start]
        if window.start > chars and "\n" in before:  # a cut context starts at a line
            before = before[before.index("\n") + 1:]
        below = min(chars, AFTER_CHARS)
        after = text[window.end:window.end + below]
        if window.end + below < len(text) and "\n" in after:
            after = after[:after.rindex("\n") + 1]
        ids = build(before, after, shown)
        if len(ids) <= max_tokens:
            break
        if chars > 64:
            chars = int(chars * 0.6)
        elif shown:
            shown = shown[1:]  # then the oldest edits
            chars = CONTEXT_CHARS
        else:
            raise ValueError(f"next-edit prompt too large: {len(ids):,} tokens for a {region.count(chr(10)):,}-line "
                             f"region; a prompt holds at most {max_tokens:,} tokens")
    return ids, StopRules(line_rules=False, stop_strings=("\n" + FENCE, FENCE, END) + overrun_stop(region, after))


def last_change_hint(diff: str) -> str:
    """One sentence naming what the last diff changed, when it is a short change within a line or two
    (`fullname` -> `value`): an instruct model that is not trained on next edits copies the region
    back unless it is told which change to carry on. Whole identifiers, not the characters that differ."""
    lines = diff.splitlines()
    old = "\n".join(l[1:] for l in lines if l.startswith("-") and not l.startswith("---"))
    new = "\n".join(l[1:] for l in lines if l.startswith("+") and not l.startswith("+++"))
    if old == new:
        return ""
    p = 0
    while p < min(len(old), len(new)) and old[p] == new[p]:
        p += 1
    q = 0
    while q < min(len(old), len(new)) - p and old[-1 - q] == new[-1 - q]:
        q += 1

    def word(c: str) -> bool:
        return c.isalnum() or c == "_"

    while p > 0 and word(old[p - 1]):  # widen to whole identifiers
        p -= 1
    while q > 0 and (word(old[len(old) - q]) if q <= len(old) else False):
        q -= 1
    a, b = old[p:len(old) - q].strip(), new[p:len(new) - q].strip()
    if "\n" in a or "\n" in b or len(a) > MAX_HINT_CHARS or len(b) > MAX_HINT_CHARS or "`" in a + b:
        return ""
    if a and b:
        return f"Their last edit replaced `{a}` with `{b}`. "
    return f"Their last edit inserted `{b}`. " if b else f"Their last edit deleted `{a}`. "


def overrun_stop(region: str, after: str, lines: int = OVERRUN_LINES) -> tuple[str, ...]:
    """Stops at the first `lines` code lines after the region: a model that copies on past the region's
    end into the code below it (the 0.5B did, to max_tokens, on a region that ended mid-function; and
    it skipped the first line below and copied the rest of the function) is cut there. Only lines
    distinctive enough not to be written inside the region: some code, not in the region."""
    out = []
    for line in [l for l in after.split("\n") if l.strip()][:lines]:
        stop = "\n" + line + "\n"
        if len(line.strip()) >= 8 and stop not in "\n" + region:
            out.append(stop)
    return tuple(out)


def trim_overrun(answer: str, below: str, skipped: int = OVERRUN_LINES) -> str:
    """The answer without the lines it copied on from below the region: its longest run of last lines
    that the code below the region has in the same order, the first of them within `skipped` lines
    of the region's end (the model skipped a line and copied the rest of the function: read as
    inserted lines, the edit was wrong). A run of blank lines alone is kept. Dropping them never
    deletes code: an answer that ends early keeps the region's remaining lines (`edits`)."""
    a = answer.splitlines(keepends=True)
    b = [l if l.endswith("\n") else l + "\n" for l in below.splitlines(keepends=True)[:MAX_OVERRUN_LINES]]
    best = 0
    for k in range(1, len(a) + 1):
        j, first = 0, None
        for line in a[-k:]:
            line = line if line.endswith("\n") else line + "\n"
            try:
                j = b.index(line, j) + 1
            except ValueError:
                j = -1
                break
            first = j - 1 if first is None else first
        if j < 0 or first is None or first > skipped:
            break
        if any(l.strip() for l in a[-k:]):
            best = k
    return "".join(a[:len(a) - best]) if best else answer


def answer_text(generated: str, region: str, below: str = "") -> str:
    """The region as the model rewrote it: markers it may have copied dropped, the trailing newline kept,
    lines it copied on from `below` (the text after the region) dropped (`trim_overrun`)."""
    out = generated
    if out.startswith(START):
        out = out[len(START):].lstrip("\n")
    out = out.replace(END, "")
    if region.endswith("\n") and not out.endswith("\n"):
        out += "\n"
    if below:
        out = trim_overrun(out, below)
    return _skipped_head(region, out) + out


def _skipped_head(region: str, out: str) -> str:
    """The region's first lines when the answer starts copying at a later one (the 1.5B skipped the
    end of a docstring the region opened in): a model does not mean to delete the lines above the
    one it began with. Only up to LINES_BEFORE lines, and only when the answer's first line is a
    code line (not blank) that is not the region's first."""
    a, first = region.splitlines(keepends=True), out.split("\n", 1)[0]
    if not a or not first.strip() or a[0].rstrip("\n") == first:
        return ""
    for k in range(1, min(LINES_BEFORE, len(a) - 1) + 1):
        if a[k].rstrip("\n") == first:
            return "".join(a[:k])
    return ""


def edits(region: str, answer: str, offset: int = 0, finished: bool = True) -> list[TextEdit]:
    """The smallest edits that turn `region` into `answer` (offsets + `offset`), by lines, then each
    changed block trimmed to the characters that differ. An answer that ends before the region's end
    keeps the region's remaining lines (an early end never deletes code); one that did not finish
    (max tokens) keeps only the edits before its last line; one that changes over half the region
    gives none."""
    if answer == region:
        return []
    a, b = region.splitlines(keepends=True), answer.splitlines(keepends=True)
    if not finished:
        b = b[:-1]  # its last line may be cut: compare only what is whole
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    starts = [0]
    for line in a:
        starts.append(starts[-1] + len(line))
    ops = sm.get_opcodes()
    if ops and ops[-1][0] != "equal":
        # an answer that ends before the region does (cut by max tokens, or the model closed the
        # region early: the 1.5B ended after the function and 7 lines below it read as deleted) does
        # not delete the region's remaining lines: a trailing delete is dropped, a trailing replace
        # keeps only as many old lines as it has new ones (the answer stopped there)
        tag, i1, i2, j1, j2 = ops.pop()
        if tag == "replace":
            ops.append(("replace", i1, min(i2, i1 + j2 - j1), j1, j2))
        elif tag == "insert":
            ops.append((tag, i1, i2, j1, j2))
    out = []
    for tag, i1, i2, j1, j2 in ops:
        if tag == "equal":
            continue
        # as many lines changed as replaced: one edit per line, each trimmed to what differs in it
        pairs = [(i, i + 1, j, j + 1) for i, j in zip(range(i1, i2), range(j1, j2))] \
            if tag == "replace" and i2 - i1 == j2 - j1 else [(i1, i2, j1, j2)]
        for k1, k2, l1, l2 in pairs:
            old, new = "".join(a[k1:k2]), "".join(b[l1:l2])
            p = 0
            while p < min(len(old), len(new)) and old[p] == new[p]:
                p += 1
            q = 0
            while q < min(len(old), len(new)) - p and old[len(old) - 1 - q] == new[len(new) - 1 - q]:
                q += 1
            if old != new:
                out.append(TextEdit(offset + starts[k1] + p, offset + starts[k2] - q, new[p:len(new) - q]))
    changed = sum(max(e.end - e.start, len(e.text)) for e in out)
    covered = starts[ops[-1][2]] if ops else len(region)  # the region's part the answer rewrote
    if finished and changed > (1 - MIN_SIMILARITY) * max(covered, len(answer)):
        return []  # most of the region changed: a new text, not an edit
    return out
