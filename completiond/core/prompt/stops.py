"""Where a completion ends: end of line (single-line), or the end of the cursor's block (multi-line).

`cut(text)` returns the index at which the generated text must be cut, or None to keep going. The
engine also stops on EOS, max tokens, a deadline and cancellation.
"""

from __future__ import annotations

from dataclasses import dataclass

OPEN = {"(": ")", "[": "]", "{": "}"}
CLOSE = {v: k for k, v in OPEN.items()}


def indent_width(line: str) -> int:
    stripped = line.lstrip(" \t")
    return len(line[: len(line) - len(stripped)].expandtabs(4))


@dataclass
class StopRules:
    multiline: bool = False
    cursor_indent: int = 0  # indentation width of the line the cursor is on
    line_rules: bool = True  # False: only stop_strings end the text (rewrites)
    stop_strings: tuple[str, ...] = ()
    line_rest: str = ""  # text after the cursor on its line (stripped): a mid-line completion ends there
    next_line: str = ""  # the suffix's next non-blank line (stripped): never generated again
    line_head: str = ""  # text before the cursor on its line
    # Stop at a bracket that closes one opened before the completion. Not for FIM prompts: the
    # model sees the suffix, so it writes a closer only where the document lacks one.
    bracket_rule: bool = True

    def cut(self, text: str) -> int | None:
        cuts = [i for i in (text.find(s) for s in self.stop_strings) if i >= 0]
        if self.line_rules:
            if self.line_rest:
                line_cut = self._cut_mid_line(text)
            else:
                line_cut = self._cut_multiline(text) if self.multiline else self._cut_single(text)
                if self.bracket_rule and (closer := _unbalanced_closer(text)) is not None:
                    cuts.append(len(text[:closer].rstrip(" \t\r\n")) if text[:closer].strip() else closer)
            for c in (line_cut, self._cut_repeat(text), _cut_loop(text)):
                if c is not None:
                    cuts.append(c)
        return min(cuts) if cuts else None

    def _cut_mid_line(self, text: str) -> int | None:
        """The cursor is inside a line: the completion fills it up to the text already after the
        cursor and ends with the line (dropping a copy of that text the model wrote again)."""
        nl = text.find("\n")
        if nl < 0:
            return None
        line = text[:nl].rstrip(" \t\r")
        if line.endswith(self.line_rest):
            line = line[: len(line) - len(self.line_rest)]
        return len(line.rstrip(" \t")) if line.strip() else len(line)

    def _cut_repeat(self, text: str) -> int | None:
        """Cut before a finished line that is the suffix's next line: the model reached text the
        document already has (a FIM model would otherwise duplicate the line below the cursor)."""
        if not self.next_line:
            return None
        start = text.find("\n")
        while start >= 0:
            end = text.find("\n", start + 1)
            if end < 0:
                return None  # the last line is still being generated
            if text[start + 1:end].strip() == self.next_line:
                return len(text[:start].rstrip(" \t\r"))
            start = end
        return None

    @staticmethod
    def _cut_single(text: str) -> int | None:
        """End of the first line that has any text (leading newlines: the completion is the next line)."""
        start = len(text) - len(text.lstrip("\r\n"))
        if not text[start:].strip(" \t\r\n"):
            return None
        nl = text.find("\n", start)
        if nl < 0:
            return None
        return nl - 1 if nl > 0 and text[nl - 1] == "\r" else nl

    def _cut_multiline(self, text: str) -> int | None:
        """Before the first line indented less than the block the completion writes."""
        lines = text.split("\n")
        stop_indent = self.cursor_indent
        offset = len(lines[0]) + 1
        first_body = True
        if len(lines) > 1 and lines[0].strip() and not self.line_head.strip():
            # the cursor sat in a blank line's indentation: the completion's first line is the body
            stop_indent = max(stop_indent, indent_width(self.line_head + lines[0]))
            first_body = False
        later = lines[1:]
        if later and not later[-1].strip():
            later = later[:-1]  # the line being generated has no indentation to judge yet
        for line in later:
            if line.strip():
                width = indent_width(line)
                if first_body and width > stop_indent:
                    stop_indent = width  # the cursor opened a deeper block: it is the body
                first_body = False
                if width < stop_indent:
                    cut = offset - 1  # the newline before the dedented line
                    return len(text[:cut].rstrip(" \t\r\n")) if text[:cut].strip() else cut
            offset += len(line) + 1
        return None


LOOP_LINE_CHARS = 16  # shorter lines (`pass`, `return None`, `)`) may well repeat in real code


def _cut_loop(text: str) -> int | None:
    """Cut before a finished line that repeats an earlier line of the completion: a statement of
    LOOP_LINE_CHARS or more written twice in one suggestion is a small model looping."""
    seen: set[str] = set()
    start = 0
    while (end := text.find("\n", start)) >= 0:
        line = text[start:end].strip()
        if len(line) >= LOOP_LINE_CHARS:
            if line in seen:
                return len(text[:start].rstrip(" \t\r\n"))
            seen.add(line)
        start = end + 1
    return None


def _unbalanced_closer(text: str) -> int | None:
    """Index of the first closing bracket that closes something opened before the completion."""
    depth: list[str] = []
    quote = None
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote or ch == "\n":
                quote = None
        elif ch in "'\"`":
            quote = ch
        elif ch == "#":
            nl = text.find("\n", i)
            i = len(text) if nl < 0 else nl
            continue
        elif ch in OPEN:
            depth.append(ch)
        elif ch in CLOSE:
            if not depth:
                return i
            depth.pop()
        i += 1
    return None


# Words that are legitimately written twice in a row (C's `long long`): not taken for a repeat.
DOUBLED_OK = frozenset({"long"})


def _head_tails(line_head: str) -> list[str]:
    """The ends of the cursor line's code that a repeat could copy, longest first: each starts where a
    word starts (after a blank, or after punctuation before a word character) and holds a word character."""
    content = line_head.strip()
    tails = []
    for i, ch in enumerate(content):
        prev = content[i - 1] if i else " "
        starts_word = prev in " \t" or ((ch.isalnum() or ch == "_") and not (prev.isalnum() or prev == "_"))
        if starts_word and ch not in " \t" and any(c.isalnum() or c == "_" for c in content[i:]):
            tails.append(content[i:])
    return [t for t in tails if t not in DOUBLED_OK]


def repeated_head(line_head: str, text: str, final: bool = True) -> int | None:
    """How many characters at the start of `text` (a completion at the end of `line_head`) write the
    line's last words again; 0 when none, None when the text so far cannot tell yet (`final=False`).

    A model may answer `    def ` with `def make_error(…` or `# x = ` with `x = …` (the prompt's
    indentation or healing rule hides the cursor's last blank, and a FIM model then writes the whole
    line): shown as is, the editor gets `def def make_error`. The rule is textual, so it holds
    whatever prompt rule caused it: after a blank that ends the line's code, a completion that starts
    with the words before that blank, then a blank (or nothing more, when final), is a repeat."""
    if not text or not line_head.strip() or not line_head.endswith((" ", "\t")):
        return 0
    undecided = False
    for tail in _head_tails(line_head):
        if text.startswith(tail):
            rest = text[len(tail):]
            if rest[:1] in (" ", "\t"):
                return len(tail) + len(rest) - len(rest.lstrip(" \t"))
            if not rest:
                if final:
                    return len(tail)
                undecided = True
        elif not final and tail.startswith(text):
            undecided = True
    return None if undecided else 0


def drop_repeated_head(line_head: str, text: str, final: bool = True) -> str | None:
    """`text` without a repeat of the line's last words (repeated_head); None while undecided."""
    n = repeated_head(line_head, text, final)
    return None if n is None else text[n:]
