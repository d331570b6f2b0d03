"""`next_edit` on a real daemon (tiny model): the wire shape, bad input, cancel, priority after completions."""

import asyncio

import pytest

from completiond.service.client import Client, DaemonError

SRC = "def scale(x, k):\n    y = x * k\n    return y + x\n\n\ndef area(w, h):\n    return w * h\n"
URI = "file:///w/ne.py"


async def connect(sock):
    c = await Client.connect(sock)
    await c.request("initialize", {"client": "test", "protocol": 1})
    await c.request("document/open", {"uri": URI, "text": SRC, "version": 1, "language_id": "python"})
    return c


def rng(l0, c0, l1, c1):
    return {"start": {"line": l0, "character": c0}, "end": {"line": l1, "character": c1}}


async def rename_x(c):
    """Rename the parameter x -> value, one keystroke at a time (the history merges them into one edit)."""
    await c.request("document/change", {"uri": URI, "version": 2, "changes": [{"range": rng(0, 10, 0, 11), "text": ""}]})
    for i, ch in enumerate("value"):
        await c.request("document/change", {"uri": URI, "version": 3 + i,
                                            "changes": [{"range": rng(0, 10 + i, 0, 10 + i), "text": ch}]})
    return 7  # the version now


async def test_next_edit_answers_edits_with_ranges(daemon):
    c = await connect(daemon)
    version = await rename_x(c)
    res = await asyncio.wait_for(c.request("next_edit", {"uri": URI, "version": version}), 120)
    for key in ("edits", "ms", "target_passes", "version", "cancelled", "window", "text"):
        assert key in res
    assert res["version"] == version and res["cancelled"] is False and res["target_passes"] >= 1
    assert res["window"]["start"] == {"line": 0, "character": 0}  # around the last edit (line 0)
    for e in res["edits"]:
        assert set(e) == {"range", "text"} and isinstance(e["text"], str)
        assert res["window"]["start"]["line"] <= e["range"]["start"]["line"] <= e["range"]["end"]["line"]
    # at a position: the window is around it, from its block (`def area`, the line above)
    at = await asyncio.wait_for(c.request("next_edit", {"uri": URI, "version": version, "max_tokens": 8,
                                                        "position": {"line": 6, "character": 4}}), 120)
    assert at["window"]["start"]["line"] == 5 and at["tokens"] <= 8
    await c.close()


async def test_next_edit_bad_input_gets_clear_errors(daemon):
    c = await connect(daemon)
    cases = [({"uri": "file:///nope.py", "version": 1}, -32602, "unknown document"),
             ({"uri": URI, "version": 0}, -32801, "version"),  # stale: the daemon holds version 1
             ({"uri": URI}, -32602, "version"),
             ({"uri": URI, "version": 1, "position": {"line": 99, "character": 0}}, -32602, "out of range"),
             ({"uri": URI, "version": 1, "position": {"line": 0}}, -32602, "character"),
             ({"uri": URI, "version": 1, "max_tokens": 0}, -32602, "max_tokens")]
    for params, code, words in cases:
        with pytest.raises(DaemonError) as e:
            await c.request("next_edit", params)
        assert e.value.code == code and words in e.value.message, (params, e.value.message)
    assert (await c.request("status"))["state"] == "ready"  # still serving
    await c.close()


async def test_next_edit_is_cancelled_by_cancel_and_by_an_edit(daemon):
    c = await connect(daemon)
    msgid, fut = c.send_request("next_edit", {"uri": URI, "version": 1, "max_tokens": 4000})
    await c.request("cancel", {"id": msgid})
    res = await asyncio.wait_for(fut, 60)
    assert res["cancelled"] is True and res["edits"] == []
    _, fut = c.send_request("next_edit", {"uri": URI, "version": 1, "max_tokens": 4000})
    await asyncio.sleep(0.3)
    await c.request("document/change", {"uri": URI, "version": 2, "changes": [{"range": rng(6, 0, 6, 0), "text": "#"}]})
    res = await asyncio.wait_for(fut, 60)  # an edit makes the suggestion stale: it stops
    assert res["cancelled"] is True and res["version"] == 1
    await c.close()


async def test_completion_goes_before_a_running_next_edit(daemon):
    c = await Client.connect(daemon)  # a text of its own: a next edit of a prompt the engine remembers is served
    await c.request("initialize", {"client": "test", "protocol": 1})
    await c.request("document/open", {"uri": URI, "text": SRC + "# priority\n", "version": 1, "language_id": "python"})
    order = []
    # a completion with more work left (1000 tokens allowed) than the next edit (300) still goes first
    _, slow = c.send_request("next_edit", {"uri": URI, "version": 1, "max_tokens": 300})
    slow.add_done_callback(lambda f: order.append("next_edit"))
    await asyncio.sleep(0.1)  # it has started
    res = await asyncio.wait_for(c.request("complete", {"uri": URI, "position": {"line": 6, "character": 4},
                                                        "max_tokens": 1000, "mode": "ar"}), 60)
    order.append("complete")
    ne = await asyncio.wait_for(slow, 120)
    assert order == ["complete", "next_edit"], (order, ne)
    assert isinstance(res["text"], str) and ne["cancelled"] is False
    await c.close()


async def test_a_pause_computes_the_next_edit_ahead(daemon):
    """Once the client asked for a next edit, the pause after its next edit computes one ahead: the
    request at the cursor waits for it and is served from the engine's memory (no pass of its own)."""
    c = await Client.connect(daemon)  # a text of its own: the engine's memory is shared by the module's tests
    await c.request("initialize", {"client": "test", "protocol": 1})
    await c.request("document/open", {"uri": URI, "text": SRC + "# ahead\n", "version": 1, "language_id": "python"})
    await asyncio.wait_for(c.request("next_edit", {"uri": URI, "version": 1, "max_tokens": 4}), 120)
    version = await rename_x(c)
    await asyncio.sleep(1.0)  # the pause (0.35 s), and the computation under way
    res = await asyncio.wait_for(c.request("next_edit", {"uri": URI, "version": version,
                                                         "position": {"line": 0, "character": 15}}), 120)
    assert res["served_tokens"] > 0 and res["target_passes"] == 0, res
    assert res["reused_tokens"] == res["prompt_tokens"] - 1 and res["cancelled"] is False
    # a named mode computes it (a comparison): the same answer as the one served
    plain = await asyncio.wait_for(c.request("next_edit", {"uri": URI, "version": version, "mode": "ar",
                                                           "position": {"line": 0, "character": 15}}), 120)
    assert plain["served_tokens"] == 0 and plain["target_passes"] >= 1
    assert (plain["text"], plain["edits"]) == (res["text"], res["edits"])
    # a client that never asked: nothing computed ahead for it (another text: the engine's memory is shared)
    other = await Client.connect(daemon)
    await other.request("initialize", {"client": "test", "protocol": 1})
    await other.request("document/open", {"uri": URI, "text": SRC + "# other\n", "version": 1, "language_id": "python"})
    version = await rename_x(other)
    await asyncio.sleep(1.0)
    res = await asyncio.wait_for(other.request("next_edit", {"uri": URI, "version": version, "max_tokens": 8}), 120)
    assert res["served_tokens"] == 0 and res["target_passes"] >= 1
    await c.close()
    await other.close()
