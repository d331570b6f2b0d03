"""Positions (LSP UTF-16), prompt building, stop rules, prompt lookup index."""

import numpy as np
import pytest

import tiny
from tokenizers import processors
from completiond.core.speculation.index import Segment, TokenIndex, continuations
from completiond.core.prompt import PositionError, build_prompt, offset_at
from completiond.core.prompt.stops import StopRules


def test_utf16_positions():
    text = "a𝄞b\nélan\r\nlast"
    assert offset_at(text, 0, 0) == 0
    assert offset_at(text, 0, 3) == 2  # 𝄞 is two UTF-16 units
    assert offset_at(text, 0, 4) == 3
    assert offset_at(text, 1, 1) == text.index("l")
    assert offset_at(text, 2, 4) == len(text)
    assert offset_at(text, 0, 2, encoding="utf-32") == 2
    assert offset_at(text, 1, 2, encoding="utf-8") == text.index("l")  # é is 2 bytes
    for line, char in ((3, 0), (0, 5), (1, 5), (0, -1)):
        with pytest.raises(PositionError):
            offset_at(text, line, char)
    with pytest.raises(PositionError):
        offset_at(text, 0, 2)  # inside the surrogate pair


def test_prompt_prefix_and_stable_cut():
    tok = tiny.tokenizer()
    text = "".join(f"line_{i} = {i}\n" for i in range(1000))
    offset = len(text) - 5
    p = build_prompt(tok, text, offset, max_tokens=512)
    assert len(p.ids) <= 512 + 4
    assert text[:offset].endswith(p.prefix) and p.prefix.startswith("line_")
    # typing two more characters keeps the same prompt start (prefix reuse stays possible)
    text2 = text[:offset] + "ab" + text[offset:]
    p2 = build_prompt(tok, text2, offset + 2, max_tokens=512)
    assert p2.prefix.startswith(p.prefix[:200])
    assert p2.ids[:50] == p.ids[:50]
    # dense code (few characters per token) needs a second, smaller cut: that one is stable too
    dense = "".join(f"x{i}=f(a,b)[{i}]+g({i})\n" for i in range(3000))
    firsts = {tuple(build_prompt(tok, dense + "y" * k, len(dense) + k, max_tokens=512).ids[:20]) for k in range(8)}
    assert len(firsts) == 1
    assert len(build_prompt(tok, dense, len(dense), max_tokens=512).ids) <= 512 + 4


def test_fim_prompt_when_the_tokenizer_has_fim_tokens():
    import copy

    tok = copy.deepcopy(tiny.tokenizer())
    tok.add_special_tokens({"additional_special_tokens": ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]})
    pre, suf, mid = tok.convert_tokens_to_ids(["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"])
    text = "def f(x):\n    return x\n"
    p = build_prompt(tok, text, text.index("return"))
    assert p.ids[0] == pre and p.ids[-1] == mid and suf in p.ids
    assert tok.decode(p.ids[p.ids.index(suf) + 1:-1]) == "return x\n"
    plain = tiny.tokenizer()  # no FIM tokens: the prefix alone, the suffix left out
    assert build_prompt(plain, text, 4).ids == plain.encode(text[:4], add_special_tokens=False)


def test_bos_only_where_the_tokenizer_adds_it():
    import copy

    from completiond.core.prompt import bos_ids

    assert bos_ids(tiny.qwen_tokenizer()) == []  # has no BOS of its own
    tok = copy.deepcopy(tiny.tokenizer())  # a tokenizer that starts sequences with BOS (as Gemma's does)
    tok._tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", tok.bos_token_id)])
    assert bos_ids(tok) == [tok.bos_token_id]
    assert build_prompt(tok, "x = 1\n", 3).ids[0] == tok.bos_token_id


def test_single_line_stop():
    s = StopRules(multiline=False)
    assert s.cut("foo(x)") is None
    assert s.cut("foo(x)\n    bar") == len("foo(x)")
    assert s.cut("\n    return x\n") == len("\n    return x")  # cursor at end of line: next line
    assert s.cut("\n") is None


def test_multiline_stops():
    body = StopRules(multiline=True, cursor_indent=0)  # cursor after "def f():"
    text = "\n    a = 1\n    return a\n\ndef g():\n"
    assert text[:body.cut(text)] == "\n    a = 1\n    return a"
    inner = StopRules(multiline=True, cursor_indent=4)
    assert inner.cut("assert") is None and inner.cut("assert x\n") is None  # the cursor's own line goes on
    text = "x = 1\n    y = 2\n  z"
    assert text[:inner.cut(text)] == "x = 1\n    y = 2"
    assert inner.cut("x = 1\n    y = (2,\n        3)\n") is None
    # unbalanced closer: the bracket belongs to code before the cursor
    assert "a, b)"[: inner.cut("a, b)")] == "a, b"
    assert inner.cut("f('(')\n") is None  # brackets in strings do not count


def test_a_long_line_written_twice_ends_the_completion():
    """A small model loops (seen on toolz: `assert isinstance(A.addmethod, curry)` five times);
    short lines such as `pass` or `)` may repeat in real code."""
    s = StopRules(multiline=True, cursor_indent=4, bracket_rule=False)  # FIM: the `)` may close code before
    loop = "x)\n    assert isinstance(a, curry)\n    assert isinstance(a, curry)\n    assert"
    assert loop[:s.cut(loop)] == "x)\n    assert isinstance(a, curry)"
    assert s.cut("x)\n    assert isinstance(a, curry)\n    assert isinstance(a, curr") is None  # unfinished
    short = "x\n    if a:\n        pass\n    if b:\n        pass\n"
    assert s.cut(short) is None


def test_continuations_finds_distinct_branches():
    ctx = np.array([1, 2, 3, 9, 9, 1, 2, 3, 7, 7, 5, 1, 2, 3])
    found = continuations(ctx, [], max_len=3, max_candidates=5)
    conts = [c for c, _ in found]
    assert [7, 7, 5] in conts and [9, 9, 1] in conts
    seg = Segment.build([np.array([4, 1, 2, 3, 8, 8]), np.array([1, 2, 3, 6])])
    found = continuations(ctx, [seg], max_len=3, max_candidates=10)
    conts = [c for c, _ in found]
    assert [8, 8] in conts and [6] in conts  # stops at the document end, never crosses it
    # the longest backward match ranks first: only the second document has "5 1 2 3" like the context
    seg2 = Segment.build([np.array([5, 1, 2, 3, 42])])
    found = continuations(ctx, [seg, seg2], max_len=3, max_candidates=10)
    assert found[0] == ([42], 4)


def test_index_open_documents_and_files():
    idx = TokenIndex()
    idx.set_file("/w/a.py", [10, 11, 12, 13, 14])
    ctx = np.array([0, 10, 11, 12])
    assert continuations(ctx, idx.segments(), 2, 4)[0][0] == [13, 14]
    idx.remove_file("/w/a.py")
    assert continuations(ctx, idx.segments(), 2, 4) == []
    idx.set_open("file:///b.py", [10, 11, 12, 20])
    assert continuations(ctx, idx.segments(), 2, 4)[0][0] == [20]
    idx.close("file:///b.py")
    assert continuations(ctx, idx.segments(), 2, 4) == []


def test_prompt_lookup_keys_a_fim_context_on_the_code_before_the_cursor():
    """[<p>] P [<s>] S [<m>] G is looked up as P + G: the raw context's last n-gram spans <fim_middle>
    and occurs nowhere. The cursor's own spot in the open buffer (P followed by S) is not a guess."""
    from completiond.core.speculation.proposers import Limits, PromptLookup
    P, S, M = 900, 901, 902  # <fim_prefix>, <fim_suffix>, <fim_middle>
    idx = TokenIndex()
    idx.set_file("/w/a.py", [10, 11, 12, 13, 14, 15])  # elsewhere: "10 11 12" goes on "13 14 15"
    idx.set_open("file:///b.py", [1, 10, 11, 12, 30, 31])  # the buffer: prefix "1 10 11 12", suffix "30 31"
    context = [P, 1, 10, 11, 12, S, 30, 31, M]
    limits = Limits(max_len=3, min_value=0.0)
    plain = PromptLookup(idx)
    assert plain.propose(context, limits) == []
    fim = PromptLookup(idx, fim=(P, S, M))
    view, after = fim.document_view(context)
    assert view[-4:].tolist() == [1, 10, 11, 12] and after == [30, 31]
    assert [c.tokens for c in fim.propose(context, limits)] == [[13, 14, 15]]  # not [30, 31]
    # after <fim_middle>: what was typed or verified continues the prefix
    assert [c.tokens for c in fim.propose([P, 1, 10, S, 30, 31, M, 11, 12], limits)] == [[13, 14, 15]]
    assert fim.document_view([5, 6, 7])[0].tolist() == [5, 6, 7]  # not FIM: as it is
