"""No whitespace-only suggestion is shown: after an accept the model often starts with the line
break, and alone it was drawn as a blank ghost line (and a second Tab inserted it)."""

import pytest

from completiond.service.handlers import shown_text


@pytest.mark.parametrize("out", ["\n", "\n    ", "   ", "\t\n", ""])
def test_a_final_text_of_whitespace_shows_nothing(out):
    assert shown_text("    x = ", out, final=True) == ""


def test_streamed_whitespace_is_held_back_until_something_visible_follows():
    steps = ["\n", "\n    ", "\n    return", "\n    return x"]
    shown = [shown_text("", s, final=False) for s in steps]
    assert shown == [None, None, "\n    return", "\n    return x"]  # the first partial carries the line break


def test_visible_text_keeps_its_whitespace_and_the_repeat_rule_still_applies():
    assert shown_text("", "  y = 1\n", final=True) == "  y = 1\n"
    assert shown_text("    def ", "def f(x):", final=True) == "f(x):"  # the line's last words are not written twice
