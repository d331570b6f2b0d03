"""Placing HTTP requests in documents (service/http_docs.py): llama.vim's windows (256 lines before the
cursor, 64 after) of one file land in one document, spliced into the file seen so far, whatever the
cursor jumps; another file gets its own; a named file is its document; OpenAI prefix + suffix
requests continue theirs. And the HTTP checks that changed with it (http_api.py)."""

import pytest

import tiny
from completiond.service.http_api import Ask, Done, finish_reason, infill_ask, openai_ask
from completiond.service.http_docs import DocumentMap, align, Text
from completiond.service.http_io import HttpError

FILE = (tiny.STDLIB / "textwrap.py").read_text()
OTHER = (tiny.STDLIB / "heapq.py").read_text()


def window(text: str, line: int, col: int | None = None, n_prefix: int = 256, n_suffix: int = 64) -> tuple[str, int]:
    """llama.vim's s:fim_ctx_local: (input_prefix + prompt + input_suffix, cursor) at 0-based `line`."""
    lines = text.splitlines()  # vim's lines: no empty one after the last newline
    cur = lines[line]
    col = len(cur) if col is None else col
    prefix = "\n".join(lines[max(0, line - n_prefix):line]) + "\n"
    middle, rest = cur[:col], cur[col:]
    suffix = rest + "\n" + "\n".join(lines[line + 1:line + 1 + n_suffix]) + "\n"
    return prefix + middle + suffix, len(prefix) + len(middle)


def place(docs: DocumentMap, text: str, cursor: int, name: str | None = None):
    placed = docs.place(text, cursor, name)
    uri = placed.uri or docs.new_uri(name)
    docs.record(uri, placed.text, name)
    return uri, placed


def test_cursor_jumps_in_one_file_stay_in_one_document_that_grows_to_the_file():
    docs = DocumentMap()
    n = FILE.count("\n")
    uris, hows = set(), []
    for line in (300, 340, 120, 420, 40, n - 5, 300):
        text, cursor = window(FILE, line)
        uri, placed = place(docs, text, cursor)
        uris.add(uri)
        hows.append(placed.how)
        # the cursor lands on the same place of the file: the same text around it
        at = len("".join(FILE.splitlines(keepends=True)[:line])) + len(FILE.split("\n")[line])
        assert FILE[:at].endswith(placed.text[:placed.cursor][-3000:])
        assert FILE[at:].startswith(placed.text[placed.cursor:][:2000])
    assert len(uris) == 1 and hows[0] == "new" and set(hows[1:]) == {"aligned"}
    assert docs.texts[uris.pop()].text == FILE  # every window spliced in: the whole file


def test_an_edit_inside_the_window_moves_the_tail_and_keeps_the_rest():
    docs = DocumentMap()
    text, cursor = window(FILE, 300)
    uri, _ = place(docs, text, cursor)
    lines = FILE.split("\n")
    edited = "\n".join(lines[:310] + ["    x = 1", "    y = 2"] + lines[310:])
    text2, cursor2 = window(edited, 290)
    uri2, placed = place(docs, text2, cursor2)
    assert uri2 == uri and placed.how == "aligned"
    # the edited file over the lines both windows saw: from line 34 (the second window) to the end of
    # the first (file line 364, now 366), the lines after the insertion where they are now
    assert placed.text == "".join(edited.splitlines(keepends=True)[34:367])


def test_another_file_gets_its_own_document_and_a_named_file_is_its_document():
    docs = DocumentMap()
    a, _ = place(docs, *window(FILE, 300))
    b, _ = place(docs, *window(OTHER, 200))
    assert a != b
    again, placed = place(docs, *window(OTHER, 250))
    assert again == b and placed.how == "aligned"
    # named: a window that shares nothing with the document named still goes there
    c, _ = place(docs, "x = 1\n", 6, name="src/mod.py")
    d, placed = place(docs, "totally = 'different'\n", 5, name="src/mod.py")
    assert c == d and placed.how == "named" and "src/mod.py" in c
    e, _ = place(docs, "x = 1\n", 6, name="src/other.py")
    assert e != c


def test_openai_prefix_and_suffix_requests_continue_their_document():
    docs = DocumentMap()
    cut = FILE.index("def dedent")
    a, _ = place(docs, FILE, cut)
    typed = FILE[:cut] + "# a comment\n" + FILE[cut:]
    b, placed = place(docs, typed, cut + 12)
    assert a == b and placed.text == typed and placed.cursor == cut + 12


def test_small_texts_without_distinct_lines_do_not_align():
    assert align(Text("a\nb\nc\n"), "a\nb\n", 2) is None


def test_too_many_documents_evicts_the_least_recently_used():
    docs = DocumentMap()
    texts = [f"value_{i:02d} = {i * 7919 % 1000} + len('{chr(65 + i) * 30}')\n" for i in range(17)]
    uris = [place(docs, t, 0)[0] for t in texts[:16]]
    assert len(set(uris)) == 16
    place(docs, texts[0], 0)  # used again: the second one is now the least recent
    assert docs.evict() == [uris[1]] and len(docs.texts) == 15


# ---- http_api: type messages, finish reasons, the file header ---------------------------------------------
def test_a_wrong_type_gets_a_type_message_not_a_range_message():
    with pytest.raises(HttpError) as e:
        infill_ask({"input_prefix": "x", "n_predict": "ten"})
    assert "'n_predict' must be an integer, not a string" in e.value.message and "range" not in e.value.message
    with pytest.raises(HttpError) as e:
        infill_ask({"input_prefix": "x", "n_predict": -5})
    assert "out of range" in e.value.message
    with pytest.raises(HttpError) as e:
        infill_ask({"input_prefix": "x", "temperature": "hot"})
    assert "'temperature' must be a number, not a string" in e.value.message
    with pytest.raises(HttpError) as e:
        infill_ask({"prompt": [1, 2]})
    assert "token arrays are not supported" in e.value.message
    with pytest.raises(HttpError) as e:
        openai_ask({"prompt": "x", "max_tokens": 2.5})
    assert "'max_tokens' must be an integer, not a number" in e.value.message


def test_an_alternative_cut_where_the_main_one_ended_is_length():
    from completiond.service.http_api import _stop_type

    res = {"stopped_by": "alternatives_budget"}
    assert finish_reason(Done("x = f(a,", res, _stop_type(res))) == "length"
    res = {"stopped_by": "max_tokens"}
    assert finish_reason(Done("x", res, _stop_type(res))) == "length"
    for by in ("eos", "stop_rule"):
        assert finish_reason(Done("x", {"stopped_by": by}, _stop_type({"stopped_by": by}))) == "stop"


def test_the_file_header_and_extra_chunks_reach_the_ask():
    ask, chunks = infill_ask({"input_prefix": "a", "input_extra": [{"filename": "f.py", "text": "x"}] * 2},
                             {"x-completiond-file": " src/a.py "})
    assert ask.file == "src/a.py" and ask.extra_chunks == 2 and len(chunks) == 2
    ask, _ = openai_ask({"prompt": "a"}, {})
    assert ask.file is None
