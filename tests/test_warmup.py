"""Warm before asked (issue 15): a real daemon prefills an opened document's prompt while idle;
the completion that follows reuses it, a request preempts a warm-up, and output never changes."""

import asyncio

import pytest

import tiny
from completiond.core.engine import Engine
from completiond.service.client import Client
from daemon_util import cursor_after, in_process, start_daemon, stop_daemon, wait_warm

SRC = "".join(f"def f{i}(a, b):\n    return a * {i} + b\n\n\n" for i in range(40)) + "def mul(a, b):\n    "
URI = "file:///w/m.py"
END = {"line": SRC.count("\n"), "character": 4}


@pytest.fixture(scope="module")
def daemons(tmp_path_factory, tiny_dir):
    run = tmp_path_factory.mktemp("warm")
    warm = start_daemon(run / "warm.sock", tiny_dir)
    cold = start_daemon(run / "cold.sock", tiny_dir, "--no-warm")
    yield run / "warm.sock", run / "cold.sock"
    stop_daemon(warm)
    stop_daemon(cold)


async def session(sock):
    c = await Client.connect(sock)
    await c.request("initialize", {"client": "test", "protocol": 1, "workspace_roots": []})
    return c


async def both(warm_sock, cold_sock, uri: str):
    """Sessions on the warm and the cold daemon, each with `uri` open (SRC)."""
    c, cold = await session(warm_sock), await session(cold_sock)
    for x in (c, cold):
        await x.notify("document/open", {"uri": uri, "text": SRC, "version": 1, "language_id": "python"})
    return c, cold


async def test_opened_document_is_warm_and_its_completion_reuses_the_prompt(daemons):
    warm_sock, cold_sock = daemons
    c = await session(warm_sock)
    await c.notify("document/open", {"uri": URI, "text": SRC, "version": 1, "language_id": "python"})
    st = await wait_warm(c, URI)
    assert st["cached_tokens"] == st["prompt_tokens"] > 100
    res = await c.request("complete", {"uri": URI, "position": END, "max_tokens": 8, "mode": "ar"})
    assert res["reused_tokens"] == res["prompt_tokens"] - 1  # only the last prompt token re-run (its logits)

    cold = await session(cold_sock)
    await cold.notify("document/open", {"uri": URI, "text": SRC, "version": 1, "language_id": "python"})
    await asyncio.sleep(1.0)  # what would have been time to warm
    st = (await cold.request("status", {}))["warm"][URI]
    assert st == {"warm": False, "cached_tokens": 0, "prompt_tokens": None}
    ref = await cold.request("complete", {"uri": URI, "position": END, "max_tokens": 8, "mode": "ar"})
    assert ref["reused_tokens"] == 0 and ref["text"] == res["text"]
    await c.close()
    await cold.close()


async def test_edit_then_pause_rewarms_and_a_request_preempts_a_warm_up(daemons):
    uri = "file:///w/edit.py"
    c, cold = await both(*daemons, uri)
    await wait_warm(c, uri)
    # an edit at the top: the warm prompt is stale until the pause re-warms it
    edit = {"range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 0}}, "text": "# hi\n"}
    for x in (c, cold):
        await x.notify("document/change", {"uri": uri, "version": 2, "changes": [edit]})
    assert not (await c.request("status", {}))["warm"][uri]["warm"]
    await wait_warm(c, uri)
    # next edit, then a request at once: whatever the warm-up got done, the answer is the cold daemon's
    for x in (c, cold):
        await x.notify("document/change", {"uri": uri, "version": 3, "changes": [edit]})
    end = {"line": END["line"] + 2, "character": 4}
    await asyncio.sleep(0.31)  # the warm-up is queued about now
    got = await c.request("complete", {"uri": uri, "position": end, "max_tokens": 8, "mode": "combined"})
    ref = await cold.request("complete", {"uri": uri, "position": end, "max_tokens": 8, "mode": "combined"})
    assert got["text"] == ref["text"] and got["tokens"] == ref["tokens"]
    await c.close()
    await cold.close()


async def test_after_accepting_a_suggestion_the_next_one_was_computed_ahead(daemons):
    uri = "file:///w/accept.py"
    c, cold = await both(*daemons, uri)
    ask = {"uri": uri, "max_tokens": 8, "mode": "combined", "multiline": False}
    first = await c.request("complete", {**ask, "position": END})
    assert first["text"] and "\n" not in first["text"]
    # the user accepts it (Tab): one insertion at the cursor; then pauses
    accept = {"range": {"start": END, "end": END}, "text": first["text"]}
    for x in (c, cold):
        await x.notify("document/change", {"uri": uri, "version": 2, "changes": [accept]})
    cursor = {"line": END["line"], "character": END["character"] + len(first["text"].encode("utf-16-le")) // 2}
    await wait_warm(c, uri)
    await asyncio.sleep(1.0)  # the follow-up completion runs after its prefill
    got = await c.request("complete", {**ask, "position": cursor})
    ref = await cold.request("complete", {**ask, "position": cursor})
    assert got["text"] == ref["text"] and got["tokens"] == ref["tokens"]
    assert got["served_tokens"] > 0 and ref["served_tokens"] == 0  # computed ahead, from memory
    await c.close()
    await cold.close()


async def test_where_the_cursor_rests_the_completion_is_computed_ahead_before_any_request(tmp_path):
    """An editor says where its cursor rests (document/cursor) in a file nobody asked completions in
    yet: the warm-up computes that cursor's completion (greedy, multi-line: as editors ask), so the
    first keystroke typed through it (Enter at a line's end, the suggestion's first characters) is
    served from memory with no pass: the same text as a daemon that never warmed. (A FIM model: typed
    text extends the FIM middle of the anchor's prompt.)"""
    uri = "file:///w/rest.py"

    def fim_engine() -> Engine:
        return Engine(tiny.loaded(tiny.qwen2_config(), seed=5, scale=4.0))

    for d in ("warm", "cold"):
        (tmp_path / d).mkdir()
    async with in_process(tmp_path / "warm", fim_engine(), warm=True) as (c, daemon), \
            in_process(tmp_path / "cold", fim_engine(), warm=False) as (cold, reference):
        for x in (c, cold):
            await x.request("document/open", {"uri": uri, "text": SRC, "version": 1, "language_id": "python"})
        await c.notify("document/cursor", {"uri": uri, "position": END})
        ref = await cold.request("complete", {"uri": uri, "position": END, "mode": "combined"})
        assert len(ref["text"]) > 2
        await wait_warm(c, uri)
        for _ in range(300):  # the completion computed ahead runs after its prefill: until no job is left
            if not daemon.scheduler.jobs:
                break
            await asyncio.sleep(0.05)
        typed = ref["text"][:2]  # the user types what the suggestion says
        for x in (c, cold):
            await x.request("document/change", {"uri": uri, "version": 2, "changes": [
                {"range": {"start": END, "end": END}, "text": typed}]})
        cursor = cursor_after(END["line"], END["character"], typed)
        got = await c.request("complete", {"uri": uri, "position": cursor, "mode": "combined"})
        reference.engine.typed.clear()  # it answered at END: the same prompt, computed with passes
        want = await cold.request("complete", {"uri": uri, "position": cursor, "mode": "combined"})
        assert got["text"] == want["text"] and got["tokens"] == want["tokens"]
        assert got["served_tokens"] > 0 and want["served_tokens"] == 0


async def test_status_reports_stale_work(daemons):
    warm_sock, _ = daemons
    c = await session(warm_sock)
    await c.notify("document/open", {"uri": "file:///w/stale.py", "text": SRC, "version": 1})
    await wait_warm(c, "file:///w/stale.py")
    stale = (await c.request("status", {}))["stale"]
    assert stale["warms"] >= 1 and stale["warm_ms"] > 0 and {"cancelled", "cancelled_ms", "served_tokens"} <= set(stale)
    await c.close()

