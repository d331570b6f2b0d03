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

    def cut(self, text: str) -> int | None:
        cuts = [i for i in (text.find(s) for s in self.stop_strings) if i >= 0]
        if self.line_rules:
            line_cut = self._cut_multiline(text) if self.multiline else self._cut_single(text)
            if line_cut is not None:
                cuts.append(line_cut)
        return min(cuts) if cuts else None

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
        cut = _unbalanced_closer(text)
        lines = text.split("\n")
        stop_indent = self.cursor_indent
        offset = len(lines[0]) + 1
        first_body = True
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
                    end = offset - 1  # the newline before the dedented line
                    cut = end if cut is None else min(cut, end)
                    break
            offset += len(line) + 1
        if cut is None:
            return None
        return len(text[:cut].rstrip(" \t\r\n")) if text[:cut].strip() else cut


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
