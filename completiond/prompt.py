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


@dataclass
class Heal:
    """Token healing: the prompt's last token was taken off (a cursor mid-word splits a token the
    model never saw split); the first generated token must start with its text, which the editor
    already shows, so that text is hidden from the completion."""
    text: str
    allowed: list[int]  # token ids whose text starts with `text`


@dataclass
class Prompt:
    ids: list[int]
    prefix: str  # text of the document before the cursor (possibly cut at the front)
    suffix: str
    stops: StopRules
    heal: Heal | None = None


@dataclass
class ContextFile:
    """Another file shown to the model before the current one (an open buffer, a related file)."""
    path: str
    text: str


@dataclass(frozen=True)
class Fim:
    prefix: int
    suffix: int
    middle: int
    repo_name: int | None = None  # Qwen2.5-Coder's repository format
    file_sep: int | None = None


_FIM: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def fim_tokens(tokenizer) -> Fim | None:
    """The tokenizer's FIM (and repository) token ids, if it has them (looked up once: get_vocab()
    builds a 262k-entry dict, ~0.3 s)."""
    if tokenizer not in _FIM:
        unk = getattr(tokenizer, "unk_token_id", None)

        def known(t: str) -> int | None:
            i = tokenizer.convert_tokens_to_ids(t)
            return i if isinstance(i, int) and i != unk else None

        found = None
        for style in FIM_STYLES:
            ids = [known(t) for t in style]
            if all(i is not None for i in ids):
                found = Fim(*ids, repo_name=known("<|repo_name|>"), file_sep=known("<|file_sep|>"))
                break
        _FIM[tokenizer] = found
    return _FIM[tokenizer]


_BOS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def bos_ids(tokenizer) -> list[int]:
    """[BOS] when the tokenizer itself starts sequences with it (Gemma), else [] (Qwen has a
    bos_token but never adds it; llama.cpp leaves it out too)."""
    if tokenizer not in _BOS:
        bos = getattr(tokenizer, "bos_token_id", None)
        probe = tokenizer.encode("a", add_special_tokens=True) if bos is not None else []
        _BOS[tokenizer] = [bos] if probe and probe[0] == bos else []
    return _BOS[tokenizer]


def build_prompt(tokenizer, text: str, offset: int, multiline: bool = False, max_tokens: int = 3072,
                 path: str | None = None, context: list[ContextFile] | None = None, repo: str = "") -> Prompt:
    """Prompt ids for a completion at `offset` in `text`.

    With FIM tokens: [repository context] <fim_prefix> prefix <fim_suffix> suffix <fim_middle>, the
    context in Qwen2.5-Coder's format (<|repo_name|>repo, then <|file_sep|>path + text per file, then
    <|file_sep|>path of this file) when the tokenizer has those tokens and a path is given. Context
    comes first and changes only when other files do, so the KV-cache prefix survives typing; it
    gets at most a quarter of the budget. Without FIM tokens: BOS + the prefix alone.
    """
    prefix, suffix = text[:offset], text[offset:]
    bos = bos_ids(tokenizer)
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False) if s else []  # noqa: E731
    fim = fim_tokens(tokenizer)
    stops = _stops(prefix, suffix, multiline, fim is not None)
    head: list[int] = []
    if fim and fim.repo_name is not None and fim.file_sep is not None and path:
        head = _repo_context(enc, fim, repo or "workspace", path, context or [], max_tokens // 4)
    suffix_ids = enc(suffix[:max_tokens])[: max_tokens // 4] if fim else []
    full_prefix = prefix
    # Character budgets shrink in fixed steps, and cuts fall on fixed line numbers (_stable_cut): while
    # the user types, the prompt's start (and so the reusable KV-cache prefix) does not move.
    budget = max(0, (max_tokens - len(head) - len(suffix_ids)) * 4)
    prefix = _stable_cut(full_prefix, budget)

    def assemble(prefix: str) -> list[int]:
        if fim:
            return bos + head + [fim.prefix] + enc(prefix) + [fim.suffix] + suffix_ids + [fim.middle]
        return bos + enc(prefix)

    ids = assemble(prefix)
    while len(ids) > max_tokens + len(bos) + 4 and budget > 0:  # dense text: a smaller budget
        budget = int(budget * 0.8)
        prefix = _stable_cut(full_prefix, budget)
        ids = assemble(prefix)
    if len(ids) > max_tokens + len(bos) + 4:  # a single enormous line: keep its tail
        ids = ids[:len(bos)] + ids[-max_tokens:]
    heal = None
    # Heal the token before <fim_suffix> when the cursor follows code on its line (mid-word, after
    # an operator). Not in a line's indentation: "    " would force whitespace-only first tokens,
    # where the model's own tokenization is "   " + " word".
    if fim and prefix[prefix.rfind("\n") + 1:].strip():
        cut = len(ids) - len(suffix_ids) - 3  # ids end: last prefix token, <fim_suffix>, suffix, <fim_middle>
        if cut > 0 and ids[cut] != fim.prefix:
            heal = _heal(tokenizer, ids[cut])
            if heal is not None:
                ids = ids[:cut] + ids[cut + 1:]
    return Prompt(ids=ids, prefix=prefix, suffix=suffix, stops=stops, heal=heal)


_VOCAB: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _heal(tokenizer, token: int) -> Heal | None:
    """The Heal for taking `token` off the prompt, or None when its text cannot be matched."""
    by_first = _vocab_bytes(tokenizer)
    if by_first is None:
        return None
    text = next((b for b in by_first.get(_first_byte_of(tokenizer, token), ()) if b[0] == token), None)
    if text is None or not text[1]:
        return None
    allowed = [i for i, b in by_first.get(text[1][0], ()) if b.startswith(text[1])]
    try:
        return Heal(text[1].decode("utf-8"), allowed)
    except UnicodeDecodeError:  # a token that ends inside a character: leave it
        return None


def _first_byte_of(tokenizer, token: int) -> int:
    s = tokenizer.convert_ids_to_tokens(token)
    return _BYTE_OF.get(s[0], -1) if s else -1


def _byte_level_map() -> dict[str, int]:
    """GPT-2 byte-level BPE's printable stand-in character -> the byte it stands for."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    return chars


_BYTE_OF = _byte_level_map()


def _vocab_bytes(tokenizer) -> dict[int, list[tuple[int, bytes]]] | None:
    """Byte strings of every regular token, grouped by first byte (built once per tokenizer);
    None for tokenizers that are not byte-level BPE."""
    if tokenizer not in _VOCAB:
        special = set(getattr(tokenizer, "all_special_ids", ())) | set(getattr(tokenizer, "added_tokens_decoder", {}))
        out: dict[int, list[tuple[int, bytes]]] = {}
        pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        byte_level = True
        for i, piece in enumerate(pieces):
            if piece is None or i in special:
                continue
            try:
                b = bytes(_BYTE_OF[c] for c in piece)
            except KeyError:
                byte_level = False
                break
            if b:
                out.setdefault(b[0], []).append((i, b))
        _VOCAB[tokenizer] = out if byte_level else None
    return _VOCAB[tokenizer]


def _stops(prefix: str, suffix: str, multiline: bool, fim: bool) -> StopRules:
    """Line rules for the cursor's line, and the suffix text a completion must not repeat."""
    line_start = prefix.rfind("\n") + 1
    rest, _, after = suffix.partition("\n")
    next_line = next((ln.strip() for ln in after.split("\n") if ln.strip()), "")
    return StopRules(multiline=multiline, cursor_indent=indent_width(prefix[line_start:] + rest),
                     line_rest=rest.strip(), next_line=next_line, line_head=prefix[line_start:],
                     bracket_rule=not fim)


def _repo_context(enc, fim: Fim, repo: str, path: str, files: list[ContextFile], budget: int) -> list[int]:
    """<|repo_name|>repo\n (<|file_sep|>path\ntext\n)* <|file_sep|>path\n within `budget` tokens;
    each file keeps its head (imports, definitions) when cut."""
    out = [fim.repo_name] + enc(repo + "\n")
    tail = [fim.file_sep] + enc(path + "\n")
    for f in files:
        room = budget - len(out) - len(tail) - 8
        if room <= 16:
            break
        body = enc(f"{f.path}\n{f.text[: room * 6]}")[:room]
        out += [fim.file_sep] + body + enc("\n")
    return out + tail


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
