"""`completiond/nextEdit` over stdio: a pygls client, the real server, a real daemon (tiny model)."""

import asyncio

import pytest

from test_lsp import URI, did_open, edit, options, start_lsp, stop_lsp

SRC = "def scale(x, k):\n    y = x * k\n    return y + x\n\n\ndef area(w, h):\n    return w * h\n"


def next_edit(client, params: dict, msg_id=None):
    return client.protocol.send_request_async("completiond/nextEdit", params, msg_id=msg_id)


def as_dict(obj):
    """pygls hands custom results over as namedtuples: plain dicts and lists, recursively."""
    if hasattr(obj, "_asdict"):
        obj = obj._asdict()
    if isinstance(obj, dict):
        return {k: as_dict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [as_dict(v) for v in obj]
    return obj


async def test_next_edit_over_lsp_has_the_daemons_shape(daemon):
    client, _ = await start_lsp(options(daemon))
    try:
        did_open(client, text=SRC)
        edit(client, 2, (0, 10), (0, 11), "value")  # rename the parameter x
        res = as_dict(await asyncio.wait_for(next_edit(client, {"textDocument": {"uri": URI}}), 120))
        assert res["version"] == 2 and res["cancelled"] is False and res["target_passes"] >= 1
        assert isinstance(res["ms"], (int, float)) and isinstance(res["edits"], list)
        assert res["window"]["start"] == {"line": 0, "character": 0}
        for e in res["edits"]:
            assert set(e) == {"range", "text"} and set(e["range"]) == {"start", "end"}
        # at a position, with the version named
        res = as_dict(await asyncio.wait_for(next_edit(client, {
            "textDocument": {"uri": URI}, "version": 2, "position": {"line": 6, "character": 0}}), 120))
        assert res["window"]["start"]["line"] == 5  # from its block: `def area`, the line above
    finally:
        await stop_lsp(client)


async def test_next_edit_bad_params_and_stale_version(daemon):
    client, _ = await start_lsp(options(daemon))
    try:
        did_open(client, text=SRC)
        for params, words in (({}, "textDocument"), ({"textDocument": {"uri": "file:///none.py"}}, "version"),
                              ({"textDocument": {"uri": URI}, "position": {"line": -1, "character": 0}}, "line")):
            with pytest.raises(Exception, match=words):
                await asyncio.wait_for(next_edit(client, params), 60)
        edit(client, 2, (6, 0), (6, 0), "#")
        with pytest.raises(Exception, match="changed|version"):  # the editor is at 2: version 1 is outdated
            await asyncio.wait_for(next_edit(client, {"textDocument": {"uri": URI}, "version": 1}), 60)
    finally:
        await stop_lsp(client)


async def test_a_newer_next_edit_cancels_the_older(daemon):
    client, _ = await start_lsp(options(daemon))
    try:
        did_open(client, text=SRC)
        first = next_edit(client, {"textDocument": {"uri": URI}, "position": {"line": 0, "character": 0}})
        await asyncio.sleep(0.05)
        second = next_edit(client, {"textDocument": {"uri": URI}, "position": {"line": 6, "character": 0}})
        res = as_dict(await asyncio.wait_for(second, 120))
        assert res["cancelled"] is False
        with pytest.raises(Exception):  # the first was cancelled (LSP: RequestCancelled)
            old = as_dict(await asyncio.wait_for(first, 60))
            assert old["cancelled"] is True  # or answered cancelled by the daemon
            raise RuntimeError("cancelled")
    finally:
        await stop_lsp(client)
