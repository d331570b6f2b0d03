"""From a document and a cursor to prompt token ids.

Positions follow LSP: 0-based line, character in UTF-16 code units (or "utf-8" / "utf-32" when
negotiated). The prompt is the text before the cursor (FIM with the suffix when the tokenizer has
FIM tokens). Long prefixes are cut at a line boundary that moves in steps of 64 lines, so that the
prompt's start, and therefore the reusable KV-cache prefix, stays put while the user types.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass

from .stops import StopRules, indent_width

LINE_BREAK = re.compile(r"\r\n|\r|\n")
FIM_STYLES = (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"), ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"))
CUT_STEP = 64  # lines


class PositionError(ValueError):
    """A position outside the document."""


def line_starts(text: str) -> list[int]:
    return [0] + [m.end() for m in LINE_BREAK.finditer(text)]


def offset_at(text: str, line: int, character: int, encoding: str = "utf-16") -> int:
    """Python string index of an LSP position; PositionError when it lies outside the text."""
    starts = line_starts(text)
    if not 0 <= line < len(starts):
        raise PositionError(f"line {line} out of range (document has {len(starts)} lines)")
    start = starts[line]
    end = starts[line + 1] if line + 1 < len(starts) else len(text)
    content = LINE_BREAK.sub("", text[start:end])
    if character < 0:
        raise PositionError(f"character {character} is negative")
    if encoding == "utf-32":
        if character > len(content):
            raise PositionError(f"character {character} past the end of line {line} ({len(content)} characters)")
        return start + character
    units = 0
    for i, ch in enumerate(content):
        if units == character:
            return start + i
        units += (2 if ord(ch) > 0xFFFF else 1) if encoding == "utf-16" else len(ch.encode("utf-8"))
        if units > character:
            raise PositionError(f"character {character} splits a character on line {line}")
    if units == character:
        return start + len(content)
    raise PositionError(f"character {character} past the end of line {line} ({units} {encoding} units)")


def utf16_len(s: str) -> int:
    return len(s.encode("utf-16-le")) // 2


@dataclass
class Prompt:
    ids: list[int]
    prefix: str  # text of the document before the cursor (possibly cut at the front)
    suffix: str
    stops: StopRules


_FIM: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def fim_tokens(tokenizer) -> tuple[int, int, int] | None:
    """The tokenizer's FIM prefix/suffix/middle ids, if it has them (looked up once: get_vocab()
    builds a 262k-entry dict, ~0.3 s)."""
    if tokenizer not in _FIM:
        found = None
        for style in FIM_STYLES:
            ids = [tokenizer.convert_tokens_to_ids(t) for t in style]
            unk = getattr(tokenizer, "unk_token_id", None)
            if all(isinstance(i, int) and i != unk for i in ids):
                found = tuple(ids)
                break
        _FIM[tokenizer] = found
    return _FIM[tokenizer]


def build_prompt(tokenizer, text: str, offset: int, multiline: bool = False, max_tokens: int = 3072,
                 use_fim: bool = True, context: list[str] | None = None) -> Prompt:
    """Prompt ids for a completion at `offset` in `text`; `context`: extra chunks placed before it."""
    prefix, suffix = text[:offset], text[offset:]
    line_start = prefix.rfind("\n") + 1
    stops = StopRules(multiline=multiline, cursor_indent=indent_width(prefix[line_start:] + suffix.split("\n", 1)[0]))
    head = "".join(context or [])
    full_prefix = prefix
    # Character budgets shrink in fixed steps, and cuts fall on fixed line numbers (_stable_cut): while
    # the user types, the prompt's start (and so the reusable KV-cache prefix) does not move.
    budget = max(0, max_tokens * 4 - len(head))
    prefix = _stable_cut(full_prefix, budget)
    bos = [tokenizer.bos_token_id] if getattr(tokenizer, "bos_token_id", None) is not None else []
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False) if s else []  # noqa: E731
    fim = fim_tokens(tokenizer) if use_fim and suffix.strip() else None
    suffix_ids = enc(suffix[:max_tokens])[: max_tokens // 4] if fim else []

    def assemble(prefix: str) -> list[int]:
        if fim:
            return bos + [fim[0]] + enc(head + prefix) + [fim[1]] + suffix_ids + [fim[2]]
        return bos + enc(head + prefix)

    ids = assemble(prefix)
    while len(ids) > max_tokens + len(bos) + 4 and budget > 0:  # dense text: a smaller budget
        budget = int(budget * 0.8)
        prefix = _stable_cut(full_prefix, budget)
        ids = assemble(prefix)
    if len(ids) > max_tokens + len(bos) + 4:  # a single enormous line: keep its tail
        ids = ids[:len(bos)] + ids[-max_tokens:]
    return Prompt(ids=ids, prefix=prefix, suffix=suffix, stops=stops)


def _stable_cut(prefix: str, max_chars: int) -> str:
    """Drop whole lines from the front, in steps of 64 lines (else 8, else 1), until at most
    max_chars remain; cuts land on fixed line numbers, so typing at the end rarely moves them."""
    if len(prefix) <= max_chars:
        return prefix
    starts = line_starts(prefix)
    for step in (CUT_STEP, 8, 1):
        for k in range(step, len(starts), step):
            if len(prefix) - starts[k] <= max_chars:
                return prefix[starts[k]:]
    return prefix[-max_chars:] if max_chars > 0 else ""
