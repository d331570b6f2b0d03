"""Bounded work (issue 13, points 3 and 4): a rewrite's prompt has a token budget, a large document
costs a completion or an edit its window, not its size. Real daemon with the tiny model where the
behaviour does not depend on the model; no timed assertions."""

import asyncio
import random

import numpy as np
import pytest

import tiny
from completiond.service import protocol as P
from completiond.service.client import Client, DaemonError
from completiond.service.documents import INDEX_WINDOW_CHARS, Document, DocumentError
from completiond.service.handlers import doc_change, doc_open
from completiond.core.prompt import build_prompt, line_index, line_starts
from completiond.core.prompt.rewrite import PROBE_CHARS, TooLarge, check_selection, rewrite_prompt
from completiond.service.session import MAX_INDEXED_BUFFERS, Session

BUDGET = P.MAX_PROMPT_TOKENS
# the input: 2,000 lines, ~35 characters each (69,780 characters there)
BIG_SELECTION = "".join(f"    v{i:04d} = f(v{i - 1:04d}, {i % 97:2d}) + 1  # ok\n" for i in range(2000))
BIG_DOC = "".join(f"row_{i:06d} = compute({i}, 'abc') + y\n" for i in range(120_000))[:4_000_000]


# ---- documents: a line index kept by each edit --------------------------------------------------
def test_edits_keep_the_line_index_equal_to_a_full_rescan():
    rng = random.Random(7)
    pieces = ["a", "é", "😀", " ", "\n", "\r", "\r\n", "()", "    "]

    def position(text: str) -> tuple[dict, int]:
        starts = line_starts(text)
        line = rng.randrange(len(starts))
        end = starts[line + 1] if line + 1 < len(starts) else len(text)
        content = text[starts[line]:end].rstrip("\r\n")
        ch = rng.randint(0, len(content))
        return {"line": line, "character": ch}, starts[line] + ch  # UTF-32: characters are indices

    for _ in range(400):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 50)))
        doc, naive = Document("u", text, 0), text
        for v in range(1, 6):
            (p1, a1), (p2, a2) = position(naive), position(naive)
            if a2 < a1:
                (p1, a1), (p2, a2) = (p2, a2), (p1, a1)
            new = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 4)))
            doc.apply([{"range": {"start": p1, "end": p2}, "text": new}], v, "utf-32")
            naive = naive[:a1] + new + naive[a2:]
            assert doc.text == naive
            assert list(doc.starts) == line_starts(naive)


def test_a_document_change_past_the_cap_is_refused_and_leaves_the_document():
    doc = Document("u", "abc\n", 1)
    with pytest.raises(DocumentError, match="characters"):
        doc.apply([{"range": {"start": {"line": 1, "character": 0}, "end": {"line": 1, "character": 0}},
                    "text": "x" * 10}], 2, max_chars=8)
    assert doc.text == "abc\n" and doc.version == 1 and list(doc.starts) == [0, 4]


def test_the_prompt_lookup_window_of_a_big_document_is_bounded_and_follows_the_edit():
    doc = Document("u", BIG_DOC, 1)
    at = len(BIG_DOC) // 2
    line = int(np.searchsorted(doc.starts, at, side="right")) - 1
    doc.apply([{"range": {"start": {"line": line, "character": 0}, "end": {"line": line, "character": 0}},
                "text": "EDITED"}], 2)
    window = doc.index_window()
    assert len(window) == INDEX_WINDOW_CHARS and "EDITED" in window


def test_a_completion_prompt_reads_a_window_of_a_4m_document():
    tok = tiny.qwen_tokenizer()
    starts = line_index(BIG_DOC)
    for offset in (0, 1000, len(BIG_DOC) // 2, len(BIG_DOC) - 7):
        p = build_prompt(tok, BIG_DOC, offset, starts=starts)
        assert len(p.ids) <= BUDGET + 5
        assert BIG_DOC[:offset].endswith(p.prefix) and len(p.suffix) <= BUDGET
        # the same prompt as without the document's index (the prefix's lines found by a scan)
        assert p.ids == build_prompt(tok, BIG_DOC, offset).ids


# ---- rewrites: one prompt budget -----------------------------------------------------------------
def test_a_2000_line_selection_is_refused_saying_the_limit_and_its_size():
    tok = tiny.qwen_tokenizer()
    with pytest.raises(TooLarge) as e:
        check_selection(tok, BIG_SELECTION)
    msg = str(e.value)
    head = BIG_SELECTION[:PROBE_CHARS]  # already over the budget: the rest is not tokenized
    n = len(tok.encode(head, add_special_tokens=False))
    assert n > BUDGET and f"{len(BIG_SELECTION):,} characters, {n:,} tokens in its first {PROBE_CHARS:,}" in msg
    assert "2,000 lines" in msg and f"{BUDGET:,} tokens" in msg
    assert f"about {(head.count(chr(10)) + 1) * BUDGET // n:,} lines like these" in msg  # a cut last line counts
    fits = BIG_SELECTION[:PROBE_CHARS + 1000]  # its probe fits a large budget: sized by the whole selection
    assert check_selection(tok, fits, budget=10**6) == len(tok.encode(fits, add_special_tokens=False))
    assert check_selection(tok, BIG_SELECTION[:2000]) == len(tok.encode(BIG_SELECTION[:2000]))
    with pytest.raises(TooLarge, match="characters"):  # too long to tokenize whole: refused by characters
        check_selection(tok, " " * (4 * 1024 * 1024))


def test_rewrite_context_is_windowed_to_the_budget():
    tok = tiny.qwen_tokenizer()
    text = BIG_SELECTION + "def target(a):\n    return a\n"
    start = len(BIG_SELECTION)
    ids, _ = rewrite_prompt(tok, text, start, len(text), "rename a to b", "python", max_tokens=300)
    shown = tok.decode(ids)
    assert len(ids) <= 300 and "def target(a):" in shown and "rename a to b" in shown
    assert "v1999" in shown  # the code right before the selection is kept, the far code is not
    with pytest.raises(TooLarge, match="at most 40 tokens"):
        rewrite_prompt(tok, text, start, len(text), "rename a to b", "python", max_tokens=40)


# ---- per-connection caps (the handlers, on a session without a socket) ------------------------------
async def test_open_documents_per_connection_are_capped(monkeypatch):
    monkeypatch.setattr(P, "MAX_OPEN_DOCUMENTS", 3)
    monkeypatch.setattr(P, "MAX_SESSION_CHARS", 100)
    s = Session(1, writer=None, authed=True)
    for i in range(3):
        await doc_open(None, s, P.DocumentOpen.parse({"uri": f"u{i}", "text": "x" * 20}), None)
    with pytest.raises(P.RpcError, match="too many open documents"):
        await doc_open(None, s, P.DocumentOpen.parse({"uri": "u3", "text": ""}), None)
    await doc_open(None, s, P.DocumentOpen.parse({"uri": "u0", "text": "y" * 30}), None)  # a re-open replaces
    with pytest.raises(P.RpcError, match="in all"):
        await doc_open(None, s, P.DocumentOpen.parse({"uri": "u1", "text": "y" * 70}), None)
    with pytest.raises(P.RpcError, match="characters"):  # 30 + 20 + 51 > 100
        await doc_change(None, s, P.DocumentChange.parse({"uri": "u2", "changes": [{"text": "z" * 51}]}), None)
    assert s.docs["u2"].text == "x" * 20


def test_stale_buffers_are_bounded_and_most_recent_first():
    s = Session(1, writer=None, authed=True)
    for i in range(MAX_INDEXED_BUFFERS + 5):
        s.docs[f"u{i}"] = Document(f"u{i}", f"text {i}", 1)
    s.docs["u0"].apply([{"text": "edited"}], 2)
    stale = s.stale_buffers()
    assert len(stale) == MAX_INDEXED_BUFFERS and stale[0][1].text == "edited"
    stale[0][1].indexed_version = 2  # what the daemon sets after indexing lands on the document
    assert s.docs["u0"].indexed_version == 2 and all(k != s.index_key("u0") for k, _ in s.stale_buffers())


# ---- a real daemon --------------------------------------------------------------------------------
async def connect(sock):
    c = await Client.connect(sock)
    await c.request("initialize", {"client": "bounds", "protocol": 1})
    return c


async def test_a_2000_line_rewrite_is_refused_and_another_client_still_completes(daemon):
    a, b = await connect(daemon), await connect(daemon)
    await a.request("document/open", {"uri": "file:///w/big.py", "text": BIG_SELECTION, "version": 1})
    await b.request("document/open", {"uri": "file:///w/small.py", "text": "def add(a, b):\n    return", "version": 1})
    _, rewrite = a.send_request("rewrite", {"uri": "file:///w/big.py", "instruction": "rename f to g", "max_tokens": 2,
                                            "range": {"start": {"line": 0, "character": 0},
                                                      "end": {"line": 2000, "character": 0}}})
    _, other = b.send_request("complete", {"uri": "file:///w/small.py", "position": {"line": 1, "character": 10},
                                           "max_tokens": 4})
    with pytest.raises(DaemonError) as e:
        await asyncio.wait_for(rewrite, 60)
    assert e.value.code == P.INVALID_PARAMS
    assert "2,000 lines" in e.value.message and f"at most {BUDGET:,} tokens" in e.value.message
    res = await asyncio.wait_for(other, 60)
    assert res["cancelled"] is False and res["prompt_tokens"] > 0
    # a selection that fits, at the end of a long file: the context before it is windowed
    res = await a.request("rewrite", {"uri": "file:///w/big.py", "instruction": "rename f to g", "max_tokens": 2,
                                      "range": {"start": {"line": 1990, "character": 0},
                                                "end": {"line": 2000, "character": 0}}}, timeout=120)
    assert 0 < res["prompt_tokens"] <= BUDGET
    await a.close()
    await b.close()


async def test_a_4m_character_document_edits_and_completes_with_a_bounded_prompt(daemon):
    c = await connect(daemon)
    uri = "file:///w/huge.py"
    await c.request("document/open", {"uri": uri, "text": BIG_DOC, "version": 1}, timeout=60)
    last = BIG_DOC.count("\n")  # the (empty) line after the last newline
    for v, ch in enumerate("x = ", start=2):  # typing at the end, one change per keystroke
        await c.request("document/change", {"uri": uri, "version": v, "changes": [
            {"range": {"start": {"line": last, "character": v - 2}, "end": {"line": last, "character": v - 2}},
             "text": ch}]})
    res = await c.request("complete", {"uri": uri, "version": 5, "max_tokens": 4,
                                       "position": {"line": last, "character": 4}}, timeout=120)
    assert res["cancelled"] is False and 0 < res["prompt_tokens"] <= BUDGET + 5
    # an edit in the middle, then a completion there
    mid = last // 2
    await c.request("document/change", {"uri": uri, "version": 6, "changes": [
        {"range": {"start": {"line": mid, "character": 0}, "end": {"line": mid + 1, "character": 0}}, "text": ""}]})
    res = await c.request("complete", {"uri": uri, "version": 6, "max_tokens": 4,
                                       "position": {"line": mid, "character": 3}}, timeout=120)
    assert res["cancelled"] is False and 0 < res["prompt_tokens"] <= BUDGET + 5
    look = await c.request("debug/lookup", {"uri": uri, "position": {"line": mid, "character": 3}}, timeout=120)
    assert isinstance(look["candidates"], list)
    await c.close()
