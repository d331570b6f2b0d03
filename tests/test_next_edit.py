"""Next edits: the edit history, the window, the prompt, the smallest edits, and greedy identity."""

import pytest

import tiny
from completiond.core.engine import Engine, Request
from completiond.core.prompt.next_edit import (END, START, TextEdit, Window, answer_text, edits, last_change_hint,
                                               name_at, next_edit_prompt, next_edit_window, removed_names,
                                               renamed_draft, window_at)
from completiond.service.history import History, common_span

SRC = "def area(w, h):\n    return w * h\n\n\ndef scale(x, k):\n    y = x * k\n    return y + x\n"


def type_chars(h: History, uri: str, text: str, at: int, typed: str, t0: float = 100.0) -> str:
    """Type `typed` at `at` one keystroke at a time, recording each change; returns the new text."""
    for i, ch in enumerate(typed):
        new = text[:at + i] + ch + text[at + i:]
        h.record(uri, text, new, now=t0 + 0.1 * i)
        text = new
    return text


def test_common_span_finds_the_replaced_text():
    assert common_span("abcdef", "abXYef") == (2, 4, 4)
    assert common_span("aaa", "aaaa") == (3, 3, 4)  # an insert at the end of a run: after it, not inside
    assert common_span("", "x") == (0, 0, 1)
    big = "x = 1\n" * 200_000
    edited = big[:600_000] + "y" + big[600_001:]
    assert common_span(big, edited) == (600_000, 600_001, 600_001)


def test_keystrokes_merge_into_one_edit_with_a_diff():
    h = History()
    at = SRC.index("x, k")
    text = SRC[:at] + SRC[at + 1:]  # delete the parameter name `x`
    h.record("file:///a.py", SRC, text, now=100.0)
    text = type_chars(h, "file:///a.py", text, at, "value", t0=100.5)
    assert len(h.edits) == 1
    e = h.edits[0]
    assert (e.old, e.new) == ("x", "value")
    assert e.line == 4 and text[e.start:e.start + 5] == "value"
    diff = e.diff("a.py")
    assert "-def scale(x, k):\n" in diff and "+def scale(value, k):\n" in diff
    assert "@@ -3," in diff  # the hunk starts at its line in the document (1-based), with 2 lines of context
    assert "     y = x * k\n" in diff  # unchanged context after it


def test_typed_and_deleted_again_leaves_no_edit_and_pauses_split_edits():
    h = History()
    text = type_chars(h, "u", SRC, 3, "ab")
    h.record("u", text, SRC, now=100.2)  # both deleted at once: back to the original
    assert len(h.edits) == 0
    text = type_chars(h, "u", SRC, 3, "a", t0=200.0)
    type_chars(h, "u", text, 4, "b", t0=210.0)  # after a pause: a new edit
    assert [e.new for e in h.edits] == ["a", "b"]


def test_history_is_bounded_and_spans_documents():
    h = History(max_edits=4)
    text = SRC
    for i in range(6):
        new = text.replace("w * h", f"w * h + {i}") if i % 2 == 0 else text + f"# {i}\n"
        h.record(f"file:///{i % 2}.py", text, new, now=100.0 + 10 * i)
        text = new
    assert len(h.edits) == 4
    assert {e.uri for e in h.recent(4)} == {"file:///0.py", "file:///1.py"}
    assert all(e.uri == "file:///1.py" for e in h.recent(4, "file:///1.py"))
    assert h.last("file:///0.py") is h.edits[-2]


def test_window_is_whole_lines_around_the_anchor():
    text = "".join(f"line {i}\n" for i in range(40))
    w = window_at(text, text.index("line 20"))
    region = text[w.start:w.end]
    assert region.startswith("line 16\n") and region.endswith("line 32\n")
    w = window_at(text, 0)
    assert w.start == 0
    w = window_at(text, len(text))
    assert w.end == len(text)
    w = window_at(text, text.index("line 20"), max_chars=40)
    assert w.end - w.start <= 40 and "line 20" in text[w.start:w.end]


def test_window_starts_at_the_anchor_block():
    """A region that opened in the previous function's tail or a docstring's end is where both Qwen
    targets copied a rename back (bench, round 4): it starts at the edited function now."""
    text = ('    """\n    A docstring.\n    """\n    return 1\n\n@cache\ndef scale(value, k):\n'
            '    y = x * k\n    if y:\n        y += 1\n        y *= 2\n    return y + x\n')
    w = window_at(text, text.index("value"))  # a `def`: from its decorator
    assert text[w.start:].startswith("@cache\ndef scale(")
    w = window_at(text, text.index("y *= 2"))  # a body line: from the header of its block
    assert text[w.start:].startswith("    if y:\n")
    w = window_at(text, text.index("y = x"))
    assert text[w.start:].startswith("def scale(")
    body = "".join(f"    x{i} = {i}\n" for i in range(8))  # no header within 4 lines: 4 lines above
    w = window_at("def f():\n" + body, len("def f():\n") + body.index("x6"))
    assert ("def f():\n" + body)[w.start:].startswith("    x2 = 2\n")
    w = window_at(text, text.index("    y = x"), before=0)  # not further up than `before` allows
    assert text[w.start:].startswith("    y = x")


LOAD = ('import os\n\n\ndef load(path, mode="r"):\n    """Read a file.\n\n    path: where it is.\n'
        + "".join(f"    More words {i}.\n" for i in range(12))
        + '    """\n    if not os.path.exists(path):\n        raise OSError(path)\n    return open(path, mode).read()\n'
        '\n\ndef other(path):\n    return path\n')


def test_the_window_follows_a_removed_name_past_a_docstring():
    """A renamed parameter's first use below a 15-line docstring is in the region (the plain window
    ended inside the docstring: the model rewrote only that); the next function's own `path` is not."""
    text = LOAD.replace("def load(path", "def load(file_name")
    at = text.index("file_name") + len("file_name")
    assert removed_names("path", "file_name", "def load(", ", mode") == ["path"]
    assert removed_names("x", "value", "f(", ")") == ["x"] and removed_names("", ", k", "f(x", ")") == []
    assert removed_names("ath", "", "def load(p", ")") == ["path"]  # widened to the whole identifier
    plain = window_at(text, at)
    assert "os.path.exists(path)" not in text[plain.start:plain.end]
    w = next_edit_window(text, at, ["path"])
    region = text[w.start:w.end]
    assert region.startswith("def load(file_name") and "os.path.exists(path)" in region
    assert "def other" not in region  # the region ends with the function
    assert next_edit_window(text, at, []) == plain  # no removed name: the plain window
    assert next_edit_window(text, at, ["mode"]) != plain  # `mode`'s use is further down too
    far = text.replace("    \"\"\"\n    if", "    \"\"\"\n" + "    x = 1\n" * 30 + "    if")
    w = next_edit_window(far, at, ["path"])  # too far to grow to: the region is around the use (a jump)
    assert far[w.start:w.end].startswith("    if not os.path.exists(path):") and "def other" not in far[w.start:w.end]


def test_a_region_that_follows_a_use_ends_two_lines_below_it():
    """With a use of the removed name, the region ends USE_LINES (2) lines below the use's line: fewer
    tokens to prefill and to copy back (before, it ran to the plain window's end, 12 lines below)."""
    body = "".join(f"    step_{i} = {i}\n" for i in range(14))
    text = "def load(file_name, mode):\n    data = open(path, mode)\n" + body + "    return data\n"
    at = text.index("file_name") + len("file_name")
    w = next_edit_window(text, at, ["path"])
    assert text[w.start:w.end] == "def load(file_name, mode):\n    data = open(path, mode)\n    step_0 = 0\n    step_1 = 1\n"
    old = next_edit_window(text, at, ["path"], use_lines=None)  # the earlier rule: to the window's end
    assert old.end > w.end and text[old.start:old.end].count("\n") == 13


def test_a_resting_cursor_gets_the_region_it_will_have_after_a_rename():
    """The warm-up at a cursor resting on a parameter (Ahead) follows the name under the cursor, so its
    prompt has the region the request after renaming that parameter has: the code around it is cached
    (before, the resting cursor had the plain window and a region that grew after the edit missed it)."""
    from completiond.service.next_edit import followed_names

    tok = tiny.qwen_tokenizer()
    doc = '"""A module."""\n\n\n' + LOAD.replace("def load(path", "def load(path, extra")
    at = doc.index("def load(path") + len("def load(path")
    assert name_at(doc, at) == "path" and name_at(doc, at - 2) == "path" and name_at(doc, 0) is None
    assert name_at("def f(x):", 3) is None  # a keyword is no name
    rest = next_edit_window(doc, at, followed_names(doc, at, None))
    assert "os.path.exists(path)" in doc[rest.start:rest.end]
    h = History()
    after = doc.replace("def load(path", "def load(file_name")
    h.record("file:///a.py", doc, after, now=1.0)
    last = h.last("file:///a.py")
    anchor = at + len("file_name") - len("path")
    assert followed_names(after, anchor, last) == ["path"]  # at the edit: the removed name, not `file_name`
    w = next_edit_window(after, anchor, followed_names(after, anchor, last))
    assert (w.start, w.end - rest.end) == (rest.start, len("file_name") - len("path"))
    warm, _ = next_edit_prompt(tok, doc, rest, [], "a.py", "python")
    req, _ = next_edit_prompt(tok, after, w, [last.diff("a.py")], "a.py", "python")
    common = next(i for i, (a, b) in enumerate(zip(warm, req)) if a != b)
    assert tok.decode(req[common:]).lstrip().startswith(("--- a/a.py", "diff"))  # cached up to the new diff
    plain = next_edit_window(doc, at, [])  # without following the name at rest: another region
    assert plain != rest
    body = doc.index("raise OSError(path)") + len("raise OSError(pa")
    assert followed_names(doc, body, None) == []  # a cursor in a body: no name followed, the plain region


def test_a_rename_drafts_its_other_code_uses():
    region = 'def f(value, k):\n    """x is it"""\n    y = x * k  # x\n    return y.x + x + f(x=1)\n'
    draft = renamed_draft(region, "x", "value", "def f(", ", k)")
    assert draft == 'def f(value, k):\n    """x is it"""\n    y = value * k  # x\n    return y.x + value + f(value=1)\n'
    assert renamed_draft(region, "", ", k", "def f(x", ")") is None  # an added parameter: no rename
    assert renamed_draft("def g(a):\n    return a\n", "x", "value", "def f(", ")") is None  # no use


def test_the_prompt_keeps_what_an_edit_changes_last():
    """A prompt warmed before an edit (the cursor at the parameter) shares everything up to the diffs
    with the prompt after it, and the diffs shown before it: only the new diff, the region and the code
    below it are new (before, the diffs came first and a new one changed the whole prompt)."""
    tok = tiny.qwen_tokenizer()
    head = "".join(f"def f{i}(a, b):\n    return a + b * {i}\n\n\n" for i in range(12))
    text0 = head + 'def load(path, mode="r"):\n    return open(path, mode).read()\n\n\n' + head.replace("def f", "def g")
    h = History()
    text1 = text0.replace("def f3(a", "def f3(alpha").replace("return a + b * 3", "return alpha + b * 3")
    h.record("file:///a.py", text0, text1, now=1.0)
    at = text1.index("def load(path") + len("def load(")
    w0 = next_edit_window(text1, at, [])
    before, _ = next_edit_prompt(tok, text1, w0, [e.diff("a.py") for e in h.shown()], "a.py", "python")
    text2 = text1.replace("def load(path", "def load(file_name")
    h.record("file:///a.py", text1, text2, now=10.0)
    w = next_edit_window(text2, at + len("file_name"), ["path"])
    assert w.start == w0.start
    after, _ = next_edit_prompt(tok, text2, w, [e.diff("a.py") for e in h.shown()], "a.py", "python")
    common = 0
    while common < min(len(before), len(after)) and before[common] == after[common]:
        common += 1
    shared = tok.decode(after[:common])
    assert "def f11(a, b):" in shared and "def g11(a, b):" in shared  # the code above and below the region
    assert "+def f3(alpha, b):" in shared  # and the older diff
    new = tok.decode(after[common:])
    assert "file_name" not in shared and new.startswith("--- a/a.py\n+++ b/a.py\n@@ -47")  # new from the new diff on
    assert common >= 0.75 * len(after)  # the diffs-first prompt shared only the system prompt


def test_the_diffs_shown_move_on_in_steps():
    h, text = History(), "a\n" * 30
    seen = []
    for i in range(10):
        new = text[:2 * i] + "z" + text[2 * i + 1:]
        h.record("u", text, new, now=10.0 * i)
        text = new
        seen.append([e.seq for e in h.shown(6, 3)])
    assert seen[5] == [1, 2, 3, 4, 5, 6] and seen[6] == [4, 5, 6, 7] and seen[8] == [4, 5, 6, 7, 8, 9]
    assert seen[9] == [7, 8, 9, 10] and all(len(s) <= 6 for s in seen)


def test_edits_are_the_smallest_spans():
    region = "def scale(value, k):\n    y = x * k\n    return y + x\n"
    answer = "def scale(value, k):\n    y = value * k\n    return y + value\n"
    found = edits(region, answer, offset=100)
    assert [(e.start - 100, e.end - 100, e.text) for e in found] == [
        (region.index("x *"), region.index("x *") + 1, "value"),
        (region.index("y + x") + 4, region.index("y + x") + 5, "value")] or \
        [(e.start - 100, e.end - 100, e.text) for e in found] == [
        (region.index("x *"), region.rindex("x") + 1, answer[region.index("x *"):-2])]
    assert edits(region, region) == []
    assert edits(region, "something else entirely\n") == []  # not an edit: a new text
    # an answer cut by max tokens: its last line may be cut, so nothing from it and after it is an edit
    region += "    print(y)\n"
    answer += "    print(y)\n"
    assert edits(region, answer[:answer.index("print(") + 3], finished=False) == edits(region, answer)
    assert edits(region, answer[:answer.index("y + ")], finished=False) == edits(region, answer)[:1]
    assert len(edits(region, answer)) == 2


def test_an_answer_that_ends_early_keeps_the_rest_of_the_region():
    """The 1.5B renamed the use, then closed the region after the function (end marker): the lines
    below read as deleted and the edit was wrong (bench, toolz/dicttoolz.py f -> value)."""
    region = ("def _get_factory(value, kwargs):\n    name = f.__name__\n    return name\n\n\n"
              "def merge(*dicts):\n    return dicts\n")
    answer = "def _get_factory(value, kwargs):\n    name = value.__name__\n    return name\n"
    use = region.index("f.__name__")
    assert [(e.start, e.end, e.text) for e in edits(region, answer)] == [(use, use + 1, "value")]
    # a changed last line before the early end: only that line is replaced, the rest is kept
    answer = "def _get_factory(value, kwargs):\n    name = f.__name__\n    return name.upper()\n"
    found = edits(region, answer)
    assert len(found) == 1 and found[0].text == ".upper()" and region[found[0].end:].startswith("\n\n\ndef merge")


def test_a_signature_change_drafts_its_other_calls():
    """Parameters reordered or removed in a signature move or drop the same arguments of the region's
    calls with as many arguments; arguments appended at one call are appended at the others. A draft
    only (the target verifies it); None for a rename or an edit of neither kind."""
    from completiond.core.prompt.next_edit import call_draft

    region = "x = 1\nset_conf(conf_dir, conf)\ny = self.branch(a, f(b, c), d)\nset_conf(only)\n"
    assert call_draft(region, "cdir, conf_dict", "conf_dict, cdir", "def set_conf(", "):\n    pass\n") == \
        "x = 1\nset_conf(conf, conf_dir)\ny = self.branch(a, f(b, c), d)\nset_conf(only)\n"
    assert call_draft(region, ", kwargs", "", "    def branch(self, path_1, path_2", "):\n") == \
        "x = 1\nset_conf(conf_dir, conf)\ny = self.branch(a, f(b, c))\nset_conf(only)\n"
    assert call_draft(region, "", ", strict=True", "z = set_conf(p, q", ")\n") == \
        "x = 1\nset_conf(conf_dir, conf, strict=True)\ny = self.branch(a, f(b, c), d)\nset_conf(only)\n"
    assert call_draft(region, "cdir", "path", "def set_conf(", ", conf_dict):\n") is None  # a rename
    assert call_draft(region, "1", "2", "x = ", "\n") is None
    assert call_draft('f("a, b", c)\n', "a, b", "b, a", "def f(", "):\n") is None  # a string: not read


def test_an_answer_that_copies_on_below_the_region_is_cut_there():
    """A region that ends mid-function: the 0.5B renamed the use, skipped the first line below the
    region and copied the rest of the function, which read as inserted lines. Those lines are dropped
    from the answer, and the first code lines below stop the decode."""
    from completiond.core.prompt.next_edit import overrun_stop, trim_overrun

    region = '    def dl_mul(value, y):\n        xx_hi, xx_lo = dl_split(x)\n        p = xx_hi * yy_hi\n'
    below = '        q = xx_hi * yy_lo\n        z = p + q\n        return z, zz\n\n\ndef other():\n    pass\n'
    renamed = region.replace("(x)", "(value)")
    answer = renamed + '        z = p + q\n        return z, zz\n'
    assert answer_text(answer, region, below) == renamed
    assert edits(region, answer_text(answer, region, below)) == [TextEdit(58, 59, "value")]
    assert trim_overrun(renamed, below) == renamed  # nothing below copied: as is
    assert trim_overrun(renamed + "\n", below) == renamed + "\n"  # a blank line alone: kept
    far = renamed + "    pass\n"  # a line that is below, but not within the first lines there
    assert trim_overrun(far, below) == far
    assert overrun_stop(region, below) == ("\n        q = xx_hi * yy_lo\n", "\n        z = p + q\n",
                                           "\n        return z, zz\n")


def test_an_answer_may_add_a_little_to_its_region():
    """The budget covers the region, the end marker and what a next edit adds; a runaway answer (lines
    repeated, the function below rewritten: twice the region before) stops at it."""
    from completiond.core.prompt.next_edit import answer_budget

    assert answer_budget(0) == 32 and answer_budget(160) == 160 + 32 + 20
    assert answer_budget(160) < 2 * 160 + 64


def test_edits_apply_to_give_the_answer():
    region = "a = 1\nb = 2\nc = 3\n"
    for answer in ("a = 1\nb = 20\nc = 3\n", "a = 1\nc = 3\n", "a = 1\nb = 2\nb2 = 2\nc = 3\n", "x = 1\nb = 2\nc = 4\n"):
        out = region
        for e in sorted(edits(region, answer), key=lambda e: -e.start):
            out = out[:e.start] + e.text + out[e.end:]
        assert out == answer


def test_answer_text_drops_markers_and_keeps_the_newline():
    assert answer_text(f"{START}\nx = 1{END}", "x = 0\n") == "x = 1\n"
    assert answer_text("x = 1\n", "x = 0\n") == "x = 1\n"
    region = '    """\n    return 1\n"""\n\ndef f(value):\n    return fullname\n'
    # an answer that starts at a later line of the region skipped its head: kept, not deleted
    assert answer_text(f"{START}\ndef f(value):\n    return value\n{END}", region) \
        == region.replace("return fullname", "return value")
    assert answer_text("\ndef f(value):\n", region) == "\ndef f(value):\n"  # a blank first line: as is
    assert answer_text("y = 2\n", region) == "y = 2\n"  # no region line: as is


def test_prompt_shows_diffs_and_the_region_and_fits_the_budget():
    tok = tiny.qwen_tokenizer()
    text = SRC * 40
    w = window_at(text, text.index("scale"))
    ids, stops = next_edit_prompt(tok, text, w, ["--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-x\n+y\n"], "a.py", "python")
    doc = tok.decode(ids)
    assert "-x\n+y\n" in doc and f"{START}\n{text[w.start:w.end]}{END}\n" in doc
    assert "```" in stops.stop_strings
    assert len(stops.stop_strings) == 3  # the line below the region is also in it (the text repeats): no stop there
    plain = SRC + "\n\nclass Shape:\n    sides = 4\n"
    w = window_at(plain, 0, after=6)  # the region is SRC: below it two blank lines and the class
    _, stops = next_edit_prompt(tok, plain, w, [], "a.py", "python")
    assert "\nclass Shape:\n" in stops.stop_strings  # an answer that copies on past the region stops there
    small, _ = next_edit_prompt(tok, text, w, ["-x\n+y\n"] * 50, "a.py", "python", max_tokens=600)
    assert len(small) <= 600
    with pytest.raises(ValueError, match="too large"):
        next_edit_prompt(tok, text, Window(0, len(text)), [], max_tokens=100)


def test_the_last_change_is_named_in_words_when_short():
    """Instruct targets copy the region back unless told which change to carry on (1.5B, bench)."""
    rename = "--- a/a.py\n+++ b/a.py\n@@ -3,2 +3,2 @@\n-def f(self, fullname):\n+def f(self, value):\n     x = fullname\n"
    assert last_change_hint(rename) == "Their last edit replaced `fullname` with `value`. "
    assert last_change_hint("@@ -1 +1 @@\n-n = max_size + 1\n+n = max_items + 1\n") \
        == "Their last edit replaced `max_size` with `max_items`. "  # whole identifiers
    assert last_change_hint("@@ -1 +1,2 @@\n x = 1\n+y = 2\n") == "Their last edit inserted `y = 2`. "
    assert last_change_hint("@@ -1,2 +1 @@\n x = 1\n-y = 2\n") == "Their last edit deleted `y = 2`. "
    assert last_change_hint("@@ -1,2 +1,2 @@\n-a = 1\n-b = 2\n+a = 3\n+b = 4\n") == ""  # two lines: no words
    assert last_change_hint("@@ -1 +1 @@\n-x = " + "1" * 80 + "\n+x = 2\n") == ""  # too long
    tok = tiny.qwen_tokenizer()
    w = window_at(SRC, 0)
    doc = tok.decode(next_edit_prompt(tok, SRC, w, [rename], "a.py", "python")[0])
    assert "replaced `fullname` with `value`" in doc
    assert "Their last edit" not in tok.decode(next_edit_prompt(tok, SRC, w, [], "a.py", "python")[0])


@pytest.fixture(scope="module")
def engine():
    target = tiny.loaded(tiny.gemma_config(window=16, layers=4), seed=1, scale=4.0)
    return Engine(target, always_speculate=True)


def test_speculative_next_edit_is_identical_to_plain_decoding(engine):
    """Copy speculation (the window in the prompt as the draft, a rename's or a signature change's
    draft indexed) changes speed, never the edit (fp32)."""
    from completiond.core.prompt.next_edit import COPY_RUN, call_draft

    tok = engine.target.tokenizer
    h = History()
    at = SRC.index("x, k")
    text = SRC[:at] + "value" + SRC[at + 1:]
    h.record("file:///a.py", SRC, text, now=1.0)
    swapped = SRC.replace("def scale(x, k)", "def scale(k, x)") + "\n\nz = scale(2, 3) + scale(4, 5)\n"
    for anchor, names in ((at, []), (len(text) - 1, []), (0, []), (at + len("value"), ["x"]), (-1, [])):
        doc = swapped if anchor == -1 else text  # -1: a signature change, its calls drafted
        anchor = len(doc) - 2 if anchor == -1 else anchor
        w = next_edit_window(doc, anchor, names) if names else window_at(doc, anchor)  # the region that follows
        ids, stops = next_edit_prompt(tok, doc, w, [e.diff("a.py") for e in h.recent()], "a.py", "python")
        region = doc[w.start:w.end]
        draft = renamed_draft(region, "x", "value", "def scale(", ", k")  # proposed from, verified
        if doc is swapped:
            draft = call_draft(region, "x, k", "k, x", "def scale(", "):")
            assert draft is not None and "scale(3, 2) + scale(5, 4)" in draft
        engine.index.set_open("draft", tok.encode(draft or region, add_special_tokens=False))
        results = {}
        for mode in ("ar", "pld", "combined", "pld-long"):  # pld-long: copy runs of COPY_RUN tokens (the daemon's)
            res = engine.complete(Request(prompt=ids, mode=mode.split("-")[0], max_tokens=48, stops=stops,
                                          reuse_prefix=False, max_draft_len=COPY_RUN if "long" in mode else None))
            found = edits(region, answer_text(res.text, region), w.start, res.stopped_by != "max_tokens")
            results[mode] = (res.token_ids, [(e.start, e.end, e.text) for e in found], res.target_passes)
        engine.index.close("draft")
        assert results["pld"][:2] == results["ar"][:2] == results["combined"][:2] == results["pld-long"][:2]
        assert results["ar"][2] == len(results["ar"][0]) - 1  # plain decoding: one pass per token after the first


def test_a_long_copy_run_is_verified_in_one_pass(engine):
    """A next edit's candidates run to COPY_RUN tokens (Request.max_draft_len): where the indexed draft
    is the target's own continuation for 48 tokens, one pass verifies it all (16-token candidates:
    three passes and more); the tokens are plain decoding's either way (fp32)."""
    from completiond.core.prompt.next_edit import COPY_RUN

    prompt = engine.target.tokenizer.encode(SRC, add_special_tokens=False)
    plain = engine.complete(Request(prompt=prompt, mode="ar", max_tokens=49, reuse_prefix=False))
    assert len(plain.token_ids) == 49  # the first token (the prefill's), then the 48 the passes verify
    engine.index.set_open("copy", prompt[-4:] + plain.token_ids)  # the draft: where the context is, then the run
    got = {}
    for cap in (None, COPY_RUN):
        res = engine.complete(Request(prompt=prompt, mode="pld", max_tokens=49, reuse_prefix=False, max_draft_len=cap))
        got[cap] = (res.token_ids, res.target_passes)
    engine.index.close("copy")
    assert got[None][0] == got[COPY_RUN][0] == plain.token_ids
    assert got[COPY_RUN][1] == 1 and got[None][1] >= 3


def test_a_next_edit_computed_ahead_is_served_as_plain_decoding_gives_it(engine):
    """A pause computes the next edit ahead (service/next_edit.Ahead: Engine.run, greedy); the request
    for the same prompt is then served from the engine's memory: the tokens plain decoding gives (fp32)."""
    from completiond.core.engine import drain

    tok = engine.target.tokenizer
    h = History()
    at = SRC.index("x, k")
    text = SRC[:at] + "value" + SRC[at + 1:]
    h.record("file:///a.py", SRC, text, now=1.0)
    w = next_edit_window(text, at, ["x"])
    ids, stops = next_edit_prompt(tok, text, w, [e.diff("a.py") for e in h.shown()], "a.py", "python")
    engine.typed.clear()
    with engine.turn(("s", "a#next_edit")):  # ahead, in the next edit's own sequence
        ahead = drain(engine.run(Request(prompt=ids, mode="pld", max_tokens=48, stops=stops, typed_through=True)))
    with engine.turn(("s", "a#next_edit")):
        served = drain(engine.run(Request(prompt=ids, mode="pld", max_tokens=48, stops=stops, typed_through=True)))
    plain = engine.complete(Request(prompt=ids, mode="ar", max_tokens=48, stops=stops, reuse_prefix=False))
    assert ahead.served_tokens == 0 and ahead.target_passes > 0
    assert served.served_tokens > 0 and served.target_passes == 0 and served.reused_tokens == len(ids) - 1
    assert served.token_ids == plain.token_ids and served.text == plain.text


def test_a_change_event_records_the_same_edit_as_comparing_texts():
    from completiond.service.documents import Document
    from completiond.service.history import change_span

    by_span, by_text = History(), History()
    doc = Document("u", SRC, 1)
    at = SRC.index("x, k")
    steps = [({"line": 4, "character": 10}, {"line": 4, "character": 11}, "")] + \
        [({"line": 4, "character": 10 + i}, {"line": 4, "character": 10 + i}, ch) for i, ch in enumerate("val")]
    for i, (a, b, text) in enumerate(steps):
        before = doc.text
        change = [{"range": {"start": a, "end": b}, "text": text}]
        span = change_span(doc, change, "utf-16")
        doc.apply(change, i + 2)
        by_span.record_span("u", before, doc.text, *span, now=100.0 + i)
        by_text.record("u", before, doc.text, now=100.0 + i)
    assert [(e.start, e.old, e.new, e.before, e.after) for e in by_span.edits] == \
        [(e.start, e.old, e.new, e.before, e.after) for e in by_text.edits] == \
        [(at, "x", "val", by_text.edits[0].before, by_text.edits[0].after)]
    assert change_span(doc, [{"text": "whole"}], "utf-16") is None  # a full text: compared instead
    assert change_span(doc, [{"range": {"start": {"line": 99, "character": 0},
                                        "end": {"line": 99, "character": 0}}, "text": ""}], "utf-16") is None
