"""Editors tell the truth (issue 38 items 5-7): a suggestion never writes typed text again, the LSP
answers every request (malformed ones with an error), and the daemon refuses an older version."""

from __future__ import annotations

import pytest

from completiond.core.stops import drop_repeated_head, repeated_head

# Real line heads (the text before the cursor on its line) and a completion that writes the line's
# last words again, with what the editor must get instead.
REPEATS = [
    ("    def ", "def make_error(self, msg):", "make_error(self, msg):"),
    ("def ", "def main():", "main():"),
    ("    # x = ", "x = compute()", "compute()"),
    ("# x = ", "x = 1", "1"),
    ("        return ", "return self.value", "self.value"),
    ("    result = ", "result = []", "[]"),
    ("class ", "class Parser:", "Parser:"),
    ("import ", "import os", "os"),
    ("from ", "from typing import Any", "typing import Any"),
    ("    for ", "for i in range(n):", "i in range(n):"),
    ("    if ", "if x is None:", "x is None:"),
    ("\tself.count = ", "self.count = 0", "0"),
    ("// total = ", "total = a + b;", "a + b;"),
    ("    async def ", "async def fetch(url):", "fetch(url):"),
    ("    async def ", "def fetch(url):", "fetch(url):"),
    ("    x = y = ", "y = 0", "0"),
    ("    yield ", "yield  item", "item"),
    ("    def ", "def", ""),
]

# Completions that only look like repeats: kept as they are.
KEEPS = [
    ("    def ", "make_error(self):"),
    ("    return ", "return_value"),  # a longer word, not the keyword again
    ("x = ", "x + 1"),  # uses the name, does not write `x =` again
    ("    ", "def f():"),  # indentation only: nothing typed to repeat
    ("    def", " make(self):"),  # no blank before the cursor
    ("long ", "long x = 0;"),  # C's `long long`
    ("    if ", "ifdef"),
    ("    x = ", "\n"),
    ("# ", "x = 1"),
    ("", "def f():"),
]


@pytest.mark.parametrize("head,text,want", REPEATS)
def test_a_repeat_of_the_line_head_is_dropped(head, text, want):
    assert drop_repeated_head(head, text) == want


@pytest.mark.parametrize("head,text", KEEPS)
def test_text_that_is_not_a_repeat_is_kept(head, text):
    assert drop_repeated_head(head, text) == text


@pytest.mark.parametrize("head,text,want", REPEATS)
def test_streamed_text_is_held_until_it_can_tell(head, text, want):
    """Token by token (here: character by character) the shown text is a prefix of the final one and
    never shows a repeat, even for a moment."""
    shown = ""
    for i in range(1, len(text) + 1):
        out = drop_repeated_head(head, text[:i], final=False)
        if out is None:
            continue
        assert out.startswith(shown) or not shown, (text[:i], shown, out)
        shown = out
        assert want.startswith(shown), (text[:i], shown)
    assert drop_repeated_head(head, text) == want


def test_undecided_while_the_text_could_still_become_a_repeat():
    assert repeated_head("    def ", "de", final=False) is None
    assert repeated_head("    def ", "def", final=False) is None
    assert repeated_head("    def ", "de", final=True) == 0  # `de...` may be a name: kept when final
    assert repeated_head("    def ", "x", final=False) == 0
