"""From a document and a cursor to prompt token ids.

Positions follow LSP: 0-based line, character in UTF-16 code units (or "utf-8" / "utf-32" when
negotiated). The prompt is the text before the cursor (FIM with the suffix when the tokenizer has
FIM tokens). Long prefixes are cut at a line boundary that moves in steps of 64 lines (8 or 1 where
64 would keep less than half the budget), so that the prompt's start, and therefore the reusable
KV-cache prefix, stays put while the user types, and the lines nearest the cursor are always kept.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass, field

import numpy as np

from ...limits import COMPLETION_PROMPT_TOKENS
from .outline import echoes
from .outline import outline as outline_of
from .stops import StopRules, indent_width

LINE_BREAK = re.compile(r"\r\n|\r|\n")
NON_SPACE = re.compile(r"\S")
ASTRAL = re.compile("[\U00010000-\U0010ffff]")
FIM_STYLES = (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"), ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"))
CUT_STEP = 64  # lines
MIN_KEEP = 0.5  # a cut on a coarse step keeps at least this share of the prefix budget


class PositionError(ValueError):
    """A position outside the document."""


def line_starts(text: str) -> list[int]:
    return [0] + [m.end() for m in LINE_BREAK.finditer(text)]


def line_index(text: str, end: int | None = None) -> np.ndarray:
    """Where each line of text[:end] starts (int64, the first 0): one regex scan, ~50 ms for 4M characters."""
    ends = (m.end() for m in LINE_BREAK.finditer(text, 0, len(text) if end is None else end))
    return np.array([0, *ends], dtype=np.int64)


def starts_between(text: str, lo: int, hi: int) -> list[int]:
    """Line starts p with lo <= p <= hi: p starts a line when text[p-1] ends a line break (so it
    depends on text[p-1] and text[p] alone, "\r" + "\n" being one break)."""
    out = [0] if lo == 0 else []
    for m in LINE_BREAK.finditer(text, max(lo - 1, 0), min(hi + 1, len(text))):
        if lo <= m.end() <= hi:
            out.append(m.end())
    return out


def splice_index(text: str, starts: np.ndarray, start: int, end: int, n_new: int) -> np.ndarray:
    """The line index after text[start:end] (old) was replaced by n_new characters (`text` is the new
    text): only the edited span is scanned; the starts after it shift. Cost O(edit + lines), no rescan."""
    lo = int(np.searchsorted(starts, start - 1, side="right"))  # starts <= start - 1 keep (their chars did not move)
    hi = int(np.searchsorted(starts, end + 1, side="left"))  # starts >= end + 1 shift by the length change
    mid = np.array(starts_between(text, start, start + n_new), dtype=np.int64)
    return np.concatenate([starts[:lo], mid, starts[hi:] + (n_new - (end - start))])


def offset_at(text: str, line: int, character: int, encoding: str = "utf-16") -> int:
    """Python string index of an LSP position; PositionError when it lies outside the text."""
    return offset_in(text, line_index(text), line, character, encoding)


def offset_in(text: str, starts: np.ndarray, line: int, character: int, encoding: str = "utf-16") -> int:
    """offset_at with the text's line index at hand: costs the position's line, not the document."""
    if not 0 <= line < len(starts):
        raise PositionError(f"line {line} out of range (document has {len(starts)} lines)")
    if character < 0:
        raise PositionError(f"character {character} is negative")
    start = int(starts[line])
    end = int(starts[line + 1]) if line + 1 < len(starts) else len(text)
    while end > start and text[end - 1] in "\r\n":  # the line's break is not part of its content
        end -= 1
    length = end - start
    if encoding == "utf-32":
        if character > length:
            raise PositionError(f"character {character} past the end of line {line} ({length} characters)")
        return start + character
    head = text[start:start + min(character, length)]
    # one unit per character up to the position (BMP / ASCII): the position is the character count
    if len(head) == character and (head.isascii() or (encoding == "utf-16" and not ASTRAL.search(head))):
        return start + character
    content = text[start:end]
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
    """A constraint on the first generated token. Token healing: the prompt's last token was taken
    off (a cursor mid-word splits a token the model never saw split); the first token must start
    with its text, which the editor already shows, so that text is hidden from the completion.
    after_indent: no text, only the allowed ids."""
    text: str
    allowed: list[int]  # the ids the first token may be (healing: those whose text starts with `text`)
    _set: frozenset | None = field(default=None, repr=False, compare=False)
    _ids: "torch.Tensor | None" = field(default=None, repr=False, compare=False)

    def allowed_set(self) -> frozenset:
        """`allowed` as a set, built once per Heal (after_indent's has 100k+ ids: ~15 ms to build)."""
        if self._set is None:
            self._set = frozenset(self.allowed)
        return self._set

    def allowed_ids(self) -> "torch.Tensor":
        """`allowed` as an int64 tensor, built once per Heal (indexing with the list costs ~35 ms)."""
        import torch

        if self._ids is None:
            self._ids = torch.tensor(self.allowed, dtype=torch.int64)
        return self._ids


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


_SPECIAL: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def special_ids(tokenizer) -> frozenset[int]:
    """Ids of the tokenizer's special tokens (<|fim_middle|>, <|im_start|>, BOS, ...): a completion
    ends where the model writes one, and none reaches the text (a FIM model that writes
    <|fim_middle|> after a short middle has finished). Added tokens not marked special (Gemma's
    HTML tags, whitespace runs) are text and stay."""
    if tokenizer is None:
        return frozenset()
    if tokenizer not in _SPECIAL:
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        ids = set(getattr(tokenizer, "all_special_ids", ()) or ()) | {i for i, t in added.items()
                                                                      if getattr(t, "special", False)}
        _SPECIAL[tokenizer] = frozenset(int(i) for i in ids if i is not None)
    return _SPECIAL[tokenizer]


def prepare_tokenizer(tokenizer) -> None:
    """Build the per-tokenizer tables prompts use (FIM ids, BOS, token healing's byte strings: ~0.35 s
    for Qwen's 152k ids) now, at start-up, rather than in a user's first completion. A tokenizer
    with a `prompt_tables` store (models/tokenizer.py) reads the byte tables a previous start saved."""
    store = getattr(tokenizer, "prompt_tables", None)
    saved = store.load() if store is not None and tokenizer not in _VOCAB else None
    if saved is not None:
        _VOCAB[tokenizer], blank = saved
        if blank is not None:
            _CODE_FIRST.setdefault(tokenizer, {})[b" "] = Heal(" ", blank)
    fim_tokens(tokenizer)
    bos_ids(tokenizer)
    _vocab_bytes(tokenizer)
    if fim_tokens(tokenizer):
        after_indent(tokenizer, " ")
    if store is not None and saved is None:
        blank = _CODE_FIRST.get(tokenizer, {}).get(b" ")
        store.save((_VOCAB[tokenizer], None if blank is None else list(blank.allowed)))


def build_prompt(tokenizer, text: str, offset: int, multiline: bool = False, max_tokens: int = COMPLETION_PROMPT_TOKENS,
                 path: str | None = None, context: list[ContextFile] | None = None, repo: str = "",
                 starts: np.ndarray | None = None, heal_indent: bool = True, outline: bool = False,
                 suffix_share: float = 0.25, echo: bool = False) -> Prompt:
    """Prompt ids for a completion at `offset` in `text`.

    With FIM tokens: [repository context] <fim_prefix> prefix <fim_suffix> suffix <fim_middle>, the
    context in Qwen2.5-Coder's format (<|repo_name|>repo, then <|file_sep|>path + text per file, then
    <|file_sep|>path of this file) when the tokenizer has those tokens and a path and a `context` list
    (possibly empty) are given; `context=None` is plain FIM (the default, serve --repo-context off). Context
    comes first and changes only when other files do, so the KV-cache prefix survives typing; it
    gets at most a quarter of the budget. Without FIM tokens: BOS + the prefix alone.

    The cost does not grow with the document: only a window around the cursor is read and tokenized.
    `starts` (the document's line index, documents.py) places the prefix cut without scanning the
    text before the cursor; without it the prefix's lines are found here.
    `heal_indent=False`: the prompt ends with the whole indentation (the earlier prompt, kept for
    benchmarks/indent_ab.py; see after_indent).
    `outline=True` (the quick prompt): where the prefix is cut, it starts with the imports and the
    enclosing blocks' headers from above the cut (outline.py), in at most a quarter of its budget.
    `suffix_share`: the most of `max_tokens` the text after the cursor gets.
    `echo=True`: the prefix also starts with what followed the line above the cursor where it appears
    outside the prompt's text (outline.echoes), in at most a quarter of its budget.
    """
    suffix = text[offset:offset + max_tokens]  # more characters than the suffix's token share can use
    bos = bos_ids(tokenizer)
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False) if s else []  # noqa: E731
    fim = fim_tokens(tokenizer)
    stops = stops_at(text, offset, multiline, fim is not None)
    if starts is None:
        starts = line_index(text, offset)
    head: list[int] = []
    if fim and fim.repo_name is not None and fim.file_sep is not None and path and context is not None:
        head = _repo_context(enc, fim, repo or "workspace", path, context, max_tokens // 4)
    suffix_ids = enc(suffix)[: int(max_tokens * suffix_share)] if fim else []
    # Character budgets shrink in fixed steps, and cuts fall on fixed line numbers (_stable_cut): while
    # the user types, the prompt's start (and so the reusable KV-cache prefix) does not move.
    budget = max(0, (max_tokens - len(head) - len(suffix_ids)) * 4)

    suffix_end = offset + (len(tokenizer.decode(suffix_ids)) if echo and suffix_ids else 0)

    def extra(window: str, budget: int) -> str:  # what goes before the window: its outline, echoes
        start = offset - len(window)
        return ((outline_of(text, start, offset, budget // 4) if outline else "")
                + (echoes(text, start, suffix_end, offset, budget // 4) if echo else ""))

    def cut(budget: int) -> str:  # the prefix's text: the window before the cursor (and what goes before it)
        window = _stable_cut(text, offset, starts, budget)
        if not (outline or echo) or (len(window) == offset and not echo):
            return window
        window = _stable_cut(text, offset, starts, budget - len(extra(window, budget)))
        return extra(window, budget) + window

    prefix = cut(budget)

    # After a line's indentation the prompt stops one blank short of the cursor (see after_indent).
    indent = after_indent(tokenizer, text[text.rfind("\n", 0, offset) + 1:offset]) if fim and heal_indent else None

    def assemble(prefix: str) -> list[int]:
        prefix = prefix[:-1] if indent is not None else prefix
        if fim:
            return bos + head + [fim.prefix] + enc(prefix) + [fim.suffix] + suffix_ids + [fim.middle]
        return bos + enc(prefix)

    ids = assemble(prefix)
    while len(ids) > max_tokens + len(bos) + 4 and budget > 0:  # dense text: a smaller budget
        budget = int(budget * 0.8)
        prefix = cut(budget)
        ids = assemble(prefix)
    if len(ids) > max_tokens + len(bos) + 4:  # a single enormous line: keep its tail
        ids = ids[:len(bos)] + ids[-max_tokens:]
    line_head = prefix[prefix.rfind("\n") + 1:]
    heal = indent
    # Heal the token before <fim_suffix> when the cursor follows code on its line (mid-word, after
    # an operator). Not a line's indentation: healing "    " would force whitespace-only first
    # tokens, where the model's own tokenization is "   " + " word".
    if fim and line_head.strip():
        cut = len(ids) - len(suffix_ids) - 3  # ids end: last prefix token, <fim_suffix>, suffix, <fim_middle>
        if cut > 0 and ids[cut] != fim.prefix:
            heal = _heal(tokenizer, ids[cut])
            if heal is not None:
                ids = ids[:cut] + ids[cut + 1:]
    return Prompt(ids=ids, prefix=prefix, suffix=suffix, stops=stops, heal=heal)


def extend_middle(tokenizer, ids: list[int], middle: str, heal_last: bool) -> tuple[list[int], Heal | None]:
    """A FIM prompt (ending in <fim_middle>) continued by `middle`, text the user typed at the cursor
    since it was built: the prefix/suffix split stays where it was, so the whole old prompt stays in
    the KV cache and only the typed tokens are new (rebuilding the prompt would move the cursor before
    <fim_suffix> and re-prefill the entire suffix on every keystroke). The last typed token is healed
    as build_prompt heals the token before the cursor."""
    if not heal_last:  # e.g. typed Enter and the editor indented: as after_indent
        head = middle[middle.rfind("\n") + 1:]
        heal = after_indent(tokenizer, head)
        middle = middle[:-1] if heal is not None else middle
        return ids + (tokenizer.encode(middle, add_special_tokens=False) if middle else []), heal
    typed = tokenizer.encode(middle, add_special_tokens=False) if middle else []
    heal = _heal(tokenizer, typed[-1]) if typed else None
    return ids + (typed[:-1] if heal is not None else typed), heal


_CODE_FIRST: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _is_indent(line_head: str) -> bool:
    return bool(line_head) and not line_head.strip(" \t")


def after_indent(tokenizer, line_head: str) -> Heal | None:
    """The constraint for a cursor after a line's indentation (line_head: the line up to the cursor,
    blanks only), for a prompt that leaves out the indentation's last blank: the first token must be
    that blank followed by code (or an end token); None when line_head is not indentation.

    Byte-level BPE writes an indented line as "       " + " return" (the last blank joins the word),
    so a prompt ending in the whole indentation ends in a token ("        ") the model saw before code
    only where a document was cut there; ending one blank short and healing it is the tokenization
    the model read in every indented line. It also keeps a FIM model from answering with a whole
    line, indentation included, a level too deep. The blank is hidden (Heal.text)."""
    if not _is_indent(line_head):
        return None
    by_first = _vocab_bytes(tokenizer)
    if by_first is None:
        return None
    blank = line_head[-1].encode()
    tables = _CODE_FIRST.setdefault(tokenizer, {})
    if blank not in tables:
        regular = {i for group in by_first.values() for i, _ in group}
        ends = [i for i in range(len(tokenizer)) if i not in regular]  # special tokens: it may still end
        code = [i for i, b in by_first.get(blank[0], ()) if len(b) > 1 and b[1:2] not in (b" ", b"\t", b"\r", b"\n")]
        tables[blank] = Heal(line_head[-1], sorted(code + ends))
    return tables[blank]  # one object per blank, so its set and tensor are built once


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
# str.translate table: stand-in character -> the character of its byte (then .encode("latin-1")); a
# character below 256 that stands for no byte becomes U+FFFF, which latin-1 cannot encode, as
# cannot any other character outside the map: either means "not byte-level BPE"
_TO_LATIN1 = {**{c: "\uffff" for c in range(256)}, **{ord(c): chr(b) for c, b in _BYTE_OF.items()}}


def _vocab_bytes(tokenizer) -> dict[int, list[tuple[int, bytes]]] | None:
    """Byte strings of every regular token, grouped by first byte (built once per tokenizer);
    None for tokenizers that are not byte-level BPE. (One translate + encode per token: ~0.1 s
    for Qwen's 152k ids, a quarter of a byte-by-byte loop, at every start.)"""
    if tokenizer not in _VOCAB:
        special = set(getattr(tokenizer, "all_special_ids", ())) | set(getattr(tokenizer, "added_tokens_decoder", {}))
        out: dict[int, list[tuple[int, bytes]]] = {}
        pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        byte_level = True
        for i, piece in enumerate(pieces):
            if piece is None or i in special:
                continue
            try:
                b = piece.translate(_TO_LATIN1).encode("latin-1")
            except UnicodeEncodeError:
                byte_level = False
                break
            if b:
                out.setdefault(b[0], []).append((i, b))
        _VOCAB[tokenizer] = out if byte_level else None
    return _VOCAB[tokenizer]


def stops_at(text: str, offset: int, multiline: bool, fim: bool) -> StopRules:
    """Line rules for the cursor's line, and the suffix text a completion must not repeat (reads the
    cursor's line and the next non-blank one, not the rest of the document)."""
    line_start = text.rfind("\n", 0, offset) + 1
    nl = text.find("\n", offset)
    rest = text[offset:] if nl < 0 else text[offset:nl]
    following = None  # the first line after this one with code on it
    if nl >= 0 and (m := NON_SPACE.search(text, nl + 1)):
        end = text.find("\n", m.start())
        following = text[text.rfind("\n", nl, m.start()) + 1:len(text) if end < 0 else end]
    head = text[line_start:offset]
    multiline = multiline and block_may_grow(head, rest, following)
    return StopRules(multiline=multiline, cursor_indent=indent_width(head + rest), line_rest=rest.strip(),
                     next_line=(following or "").strip(), line_head=head, bracket_rule=not fim)


def block_may_grow(head: str, rest: str, following: str | None) -> bool:
    """Whether a completion at the cursor may run over several lines (Copilot's rule): where the
    cursor's line opens a block, or no code at the cursor's indentation or deeper follows it (the end
    of a block or of the file). Between existing lines of a block the suggestion is one line: the
    user is inserting a line, and more lines would guess at code the document already continues.
    `head` / `rest`: the cursor's line before / after it; `following`: the next line with code."""
    if head.rstrip().endswith((":", "{")) and not rest.strip():
        return True
    return following is None or indent_width(following) < indent_width(head + rest)


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


def _stable_cut(text: str, offset: int, starts: np.ndarray, max_chars: int) -> str:
    """text[:offset] less whole lines from the front until at most max_chars remain, cut on a line
    number that is a multiple of 64 (else 8, else 1): cuts land on fixed lines, so typing at the end
    rarely moves them (the KV-cache prefix stays). A coarse cut is taken only while it keeps at least
    MIN_KEEP of the budget: rounded up to 64 lines, a cursor on line 64k would keep nothing but its
    own line. `starts`: line starts of the text (any that lie past `offset` are ignored)."""
    if offset <= max_chars:
        return text[:offset]
    pre = starts[: int(np.searchsorted(starts, offset, side="right"))]  # the prefix's line starts
    if text[offset - 1] == "\r" and pre[-1] != offset:  # a prefix that ends inside "\r\n" ends a line
        pre = np.append(pre, offset)
    first = int(np.searchsorted(pre, offset - max_chars, side="left"))  # the first start that leaves <= max_chars
    for step in (CUT_STEP, 8, 1):
        k = max(step, -(-first // step) * step)
        if k < len(pre) and (step == 1 or offset - int(pre[k]) >= max_chars * MIN_KEEP):
            return text[int(pre[k]):offset]
    return text[offset - max_chars:offset] if max_chars > 0 else ""
