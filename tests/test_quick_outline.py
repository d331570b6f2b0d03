"""The quick prompt's outline (core/prompt/outline.py): where its short window leaves them out, the
file's imports and the headers of the blocks enclosing the cursor come first, within a quarter of the
budget, and they do not move while the user types on the cursor's line."""

import tiny
from completiond.core.prompt import build_prompt
from completiond.core.prompt.outline import echoes, outline

BODY = "".join(f"        total += item * {i}\n" for i in range(60))
TEXT = ("import os\nfrom typing import (\n    Any,\n    Iterable,\n)\n\nX = 1\n\n\n"
        "class Ledger:\n    \"\"\"Sums.\"\"\"\n\n    def add(self, items: Iterable[Any]) -> int:\n"
        "        total = 0\n" + BODY + "        return total\n")


def cursor() -> int:
    return TEXT.index("        return total") + len("        return ")


def test_outline_keeps_imports_and_enclosing_headers_from_above_the_window():
    off = cursor()
    window = TEXT.index("        total += item * 40")
    out = outline(TEXT, window, off, 400)
    assert out == ("import os\nfrom typing import (\n    Any,\n    Iterable,\n)\n"
                   "class Ledger:\n    def add(self, items: Iterable[Any]) -> int:\n")
    assert "X = 1" not in out and "total" not in out  # neither other top-level code nor the body above


def test_outline_is_empty_where_the_window_starts_at_the_top_and_is_capped():
    off = cursor()
    assert outline(TEXT, 0, off, 400) == ""
    window = TEXT.index("        total += item * 40")
    assert len(outline(TEXT, window, off, 30)) <= 30
    # the nearest header first: with room for one line only, it is the enclosing function's
    room = len("    def add(self, items: Iterable[Any]) -> int:\n")
    assert outline(TEXT, window, off, room) == "    def add(self, items: Iterable[Any]) -> int:\n"


def test_outline_skips_headers_the_window_holds():
    off = cursor()
    window = TEXT.index("    def add")
    imports = "import os\nfrom typing import (\n    Any,\n    Iterable,\n)\n"
    assert outline(TEXT, window, off, 400) == imports + "class Ledger:\n"


def test_quick_prompt_with_outline_keeps_its_budget_and_its_prefix_while_typing():
    tok = tiny.qwen_tokenizer()
    off = cursor()
    plain = build_prompt(tok, TEXT, off, max_tokens=256)
    with_outline = build_prompt(tok, TEXT, off, max_tokens=256, outline=True)
    assert "def add(self" not in plain.prefix and "import os" not in plain.prefix
    assert with_outline.prefix.startswith("import os\n") and "    def add(self" in with_outline.prefix
    assert len(with_outline.ids) <= 256 + 5
    assert with_outline.prefix.endswith("        return ")
    # typing at the cursor: everything before the cursor's line is the same prompt (the cache stays)
    typed = TEXT[:off] + "tot" + TEXT[off:]
    later = build_prompt(tok, typed, off + 3, max_tokens=256, outline=True)
    assert later.prefix == with_outline.prefix + "tot"


TESTS = ("import pytest\n\n\n" + "".join(
    f"def test_case_{i}():\n    value = {i}\n    with pytest.raises(ValueError) as excinfo:\n        check(value)\n"
    f"    assert excinfo.value.args[0] == {{'n': {i}}}\n\n\n" for i in range(40))
    + "def test_last():\n    value = 99\n    with pytest.raises(ValueError) as excinfo:\n        check(value)\n    ")


def test_echoes_show_what_followed_the_line_above_the_cursor_outside_the_window():
    off = len(TESTS)
    window = TESTS.rindex("def test_case_38")
    out = echoes(TESTS, window, off, off, 400)
    # the nearest uses above the window first (test_case_37, 36, ...), each with the lines after it
    assert out.startswith("        check(value)\n    assert excinfo.value.args[0] == {'n': ")
    assert "{'n': 37}" in out and "{'n': 38}" not in out  # test_case_38 is in the window
    assert len(out) <= 400 and "'n': 0}" not in out  # capped: the far ones are left out
    assert echoes(TESTS, window, off, off, 10) == ""  # no room for one whole echo
    # the line above the cursor is too short to look up: nothing
    short = TESTS + "x = 1\n    )\n    "
    assert echoes(short, window, len(short), len(short), 400) == ""


def test_quick_prompt_with_echoes_keeps_its_budget_and_its_prefix_while_typing():
    tok = tiny.qwen_tokenizer()
    off = len(TESTS)
    plain = build_prompt(tok, TESTS, off, max_tokens=256)
    echoed = build_prompt(tok, TESTS, off, max_tokens=256, echo=True)
    assert "excinfo.value.args[0]" in echoed.prefix.split("def test_")[0]  # before the window's first test
    assert echoed.prefix != plain.prefix and len(echoed.ids) <= 256 + 5
    typed = TESTS + "assert exc"
    later = build_prompt(tok, typed, off + 10, max_tokens=256, echo=True)
    assert later.prefix == echoed.prefix + "assert exc"
