"""Prompt lookup's index of an open buffer is refreshed on every keystroke on the request's path:
it re-tokenizes only the pieces of the buffer that changed (core/speculation/index.py), and finds
what a whole-buffer tokenization finds."""

from __future__ import annotations

import numpy as np

from completiond.core.speculation.index import TokenIndex, pieces


class CountingEncoder:
    """A byte tokenizer that counts the characters it was asked to tokenize."""

    def __init__(self) -> None:
        self.chars = 0

    def __call__(self, text: str) -> list[int]:
        self.chars += len(text)
        return list(text.encode())


def buffer(lines: int) -> str:
    return "".join(f"    value_{i} = compute(value_{i - 1}, {i % 7})\n" for i in range(lines))


def test_pieces_join_back_and_a_line_inserted_above_keeps_the_cuts_below():
    text = buffer(600)
    cut = pieces(text)
    assert "".join(cut) == text and 600 / 64 <= len(cut) < 600
    edited = text.replace("value_300 = ", "value_300 = 1 +", 1)
    inserted = text[:text.index("    value_10 ")] + "    new_line = 1\n" + text[text.index("    value_10 "):]
    for changed in (edited, inserted):
        new = pieces(changed)
        assert "".join(new) == changed
        assert len(set(new) - set(cut)) <= 2, "an edit moves at most the piece it is in (and its cut)"


def test_a_keystroke_retokenizes_one_piece_and_the_index_matches_a_whole_tokenization():
    index, enc = TokenIndex(), CountingEncoder()
    text = buffer(2000)  # ~80 KB
    index.set_open_text("file:///a.py", text, enc)
    assert enc.chars == len(text)
    enc.chars = 0
    at = text.index("value_1500 = ") + len("value_1500 = ")
    typed = text[:at] + "x" + text[at:]
    index.set_open_text("file:///a.py", typed, enc)
    assert 0 < enc.chars < 64 * 60, enc.chars  # one piece of at most 64 lines, not 80 KB
    got = index.open_docs["file:///a.py"].tokens
    assert np.array_equal(got[:-1], np.frombuffer(typed.encode(), dtype=np.uint8).astype(np.int32))
    index.close("file:///a.py")
    assert "file:///a.py" not in index.open_docs
    enc.chars = 0
    index.set_open_text("file:///a.py", typed, enc)  # closed: nothing kept
    assert enc.chars == len(typed)


def test_an_empty_buffer_is_an_empty_document():
    index = TokenIndex()
    index.set_open_text("file:///e.py", "", CountingEncoder())
    assert len(index.open_docs["file:///e.py"].tokens) <= 1
