"""Typing at the cursor of a suggestion (issue 15), through a real daemon with a tiny FIM model:
typed text that matches the suggestion is served with no target pass; any typed text keeps the FIM
split, so the whole earlier prompt (suffix included) stays cached, new lines included (Enter, an
accepted multi-line suggestion); moving the cursor elsewhere starts afresh."""


import pytest

import tiny
from completiond.core.engine import Engine
from daemon_util import in_process, insert, wait_warm

SRC = (tiny.STDLIB / "textwrap.py").read_text()[:3000]
URI = "file:///w/textwrap.py"


@pytest.fixture(params=[False])
async def client(tmp_path, request):
    engine = Engine(tiny.loaded(tiny.qwen2_config(), seed=5, scale=4.0))
    async with in_process(tmp_path, engine, warm=request.param) as (c, _):
        yield c


def cursor_in(text: str, n: int) -> list[tuple[int, int, int]]:
    """(offset, line, character) at the end of the code on n lines that have code."""
    out, offset = [], 0
    for i, line in enumerate(text.split("\n")):
        if line.strip() and len(out) < n and i > 3:
            out.append((offset + len(line), i, len(line)))
        offset += len(line) + 1
    return out


async def type_text(c, version: int, line: int, char: int, typed: str) -> None:
    await insert(c, URI, version, line, char, typed)


async def complete(c, line: int, char: int, **kw) -> dict:
    return await c.request("complete", {"uri": URI, "position": {"line": line, "character": char},
                                        "max_tokens": 12, "mode": "ar", "multiline": False, **kw})


async def test_typing_through_the_suggestion_is_served_without_a_pass(client):
    c, served = client, 0
    for _, line, char in cursor_in(SRC, 12):
        await c.request("document/open", {"uri": URI, "text": SRC, "version": 1, "language_id": "python"})
        first = await complete(c, line, char)
        shown = first["text"]
        if len(shown) < 3 or not shown[:3].isprintable() or "\ufffd" in shown[:3]:  # what a user can type
            continue
        await type_text(c, 2, line, char, shown[:2])
        after = await complete(c, line, char + 2)
        assert shown[2:].startswith(after["text"]) or after["text"].startswith(shown[2:]), (shown, after["text"])
        assert after["reused_tokens"] >= first["prompt_tokens"] - 1  # the earlier prompt stays cached
        served += after["served_tokens"] > 0
    assert served >= 3  # several positions had a suggestion to type through


async def test_other_typed_text_and_new_lines_keep_the_prompt_cached(client):
    c = client
    (_, line, char), = cursor_in(SRC, 1)
    await c.request("document/open", {"uri": URI, "text": SRC, "version": 1, "language_id": "python"})
    first = await complete(c, line, char)
    typed = " zq" if not first["text"].startswith(" zq") else " qz"
    await type_text(c, 2, line, char, typed)
    after = await complete(c, line, char + len(typed))
    # the suffix was not re-prefilled: everything the first prompt held is reused
    assert after["reused_tokens"] >= first["prompt_tokens"] - 1 and after["served_tokens"] == 0
    assert after["prompt_tokens"] - first["prompt_tokens"] <= len(typed)
    # sampling requests never take this path: they rebuild (and so re-run the suffix)
    sampled = await complete(c, line, char + len(typed), temperature=0.8, seed=1)
    assert sampled["reused_tokens"] < first["prompt_tokens"] - 1
    # Enter and more typing (or accepting a multi-line suggestion): the split stays, nothing is re-run
    await type_text(c, 3, line, char + len(typed), "\n    x = ")
    on = await complete(c, line + 1, 8)
    assert on["reused_tokens"] >= first["prompt_tokens"] - 1
    assert on["prompt_tokens"] - first["prompt_tokens"] <= len(typed) + 8
    # the cursor moved elsewhere: the prompt is built afresh (the FIM split moves to it)
    fresh = await complete(c, line - 2, 0)
    assert fresh["reused_tokens"] < first["prompt_tokens"] - 1


@pytest.mark.parametrize("client", [True], indirect=True)
async def test_editor_cursor_warms_the_prompt_there(client):
    """`document/cursor`: the warm-up prefills the FIM prompt at that position (prefix and suffix),
    not the end-of-file one, which would share only the text before the cursor."""
    c = client
    (_, line, char), = cursor_in(SRC, 1)
    await c.notify("document/open", {"uri": URI, "text": SRC, "version": 1, "language_id": "python"})
    await c.notify("document/cursor", {"uri": URI, "position": {"line": 9999, "character": 0}})  # ignored
    await c.notify("document/cursor", {"uri": URI, "position": {"line": line, "character": char}})
    assert (await wait_warm(c, URI, timeout=30.0))["warm"]
    res = await complete(c, line, char)
    assert res["reused_tokens"] == res["prompt_tokens"] - 1  # the suffix too was already cached
