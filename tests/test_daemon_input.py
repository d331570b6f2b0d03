"""Hostile or racy input on a real daemon (issue 13 points 2, 5, 10): each costs one request at most."""

import asyncio

import msgpack
import pytest

from completiond.service import protocol as P
from completiond.service.client import Client, DaemonError

SRC = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):"
URI = "file:///w/m.py"


async def exchange(sock, frames: list, want: set[int], timeout: float = 120.0) -> dict:
    """Write all frames in ONE write; collect responses {msgid: (error, result)} until `want` are in."""
    r, w = await asyncio.open_unix_connection(str(sock))
    w.write(b"".join(f if isinstance(f, bytes) else msgpack.packb(f) for f in frames))
    await w.drain()
    unp, got = msgpack.Unpacker(raw=False), {}

    async def read():
        while not want <= got.keys() and (data := await r.read(65536)):
            unp.feed(data)
            for obj in unp:
                if obj[0] == P.RESPONSE:
                    got[obj[1]] = (obj[2], obj[3])
    try:
        await asyncio.wait_for(read(), timeout)
    finally:
        w.close()
    return got


def change(version: int, text: str, line: int = 4, char: int = 13) -> list:
    pos = {"line": line, "character": char}
    return [2, "document/change", {"uri": URI, "version": version, "changes": [{"range": {"start": pos, "end": pos},
                                                                                 "text": text}]}]


def complete(msgid: int, version: int, char: int, max_tokens: int = 400) -> list:
    return [0, msgid, "complete", {"uri": URI, "version": version, "position": {"line": 4, "character": char},
                                   "max_tokens": max_tokens, "mode": "ar", "multiline": True}]


async def test_keystroke_storm_supersedes_with_cancel_never_a_version_error(daemon):
    """Each keystroke: change v(n+1), then complete naming v(n+1), all in one write (a 200 Hz storm)."""
    frames = [[0, 1, "document/open", {"uri": URI, "text": SRC, "version": 1}]]
    n = 30
    for k in range(n):
        frames += [change(k + 2, "x"), complete(100 + k, k + 2, 13 + k + 1)]
    got = await exchange(daemon, frames, {100 + k for k in range(n)})
    errors = {i: e for i, (e, _) in got.items() if e is not None}
    assert not errors, errors
    assert all(got[100 + k][1]["cancelled"] for k in range(n - 1))  # superseded: cancelled, not an error
    assert got[100 + n - 1][1]["cancelled"] is False


async def test_a_complete_then_an_edit_in_one_write_is_cancelled_by_the_next_complete(daemon):
    frames = [[0, 1, "document/open", {"uri": URI, "text": SRC, "version": 1}], complete(2, 1, 13),
              change(2, "y"), complete(3, 2, 14, max_tokens=3)]
    got = await exchange(daemon, frames, {2, 3})
    assert got[2][0] is None and got[2][1]["cancelled"] is True
    assert got[3][0] is None and got[3][1]["cancelled"] is False


async def test_a_stale_version_in_any_other_case_is_content_modified(daemon):
    frames = [[0, 1, "document/open", {"uri": URI, "text": SRC, "version": 1}], change(2, "z"),
              complete(2, 1, 13, max_tokens=3)]
    got = await exchange(daemon, frames, {2})
    err = got[2][0]
    assert err["code"] == P.CONTENT_MODIFIED == -32801 and "version 2" in err["message"]


async def test_lone_surrogate_does_not_poison_other_documents(daemon):
    """The editor's JSON "\\ud800": the client sends it scrubbed (U+FFFD, same length); every document works."""
    c = await Client.connect(daemon)
    await c.request("initialize", {"client": "t", "protocol": 1})
    bad = "s = '\ud800'\nt = 1\n"
    await c.notify("document/open", {"uri": "file:///w/bad.py", "text": bad, "version": 1})
    await c.request("document/open", {"uri": URI, "text": SRC, "version": 1})
    await c.request("document/change", {"uri": "file:///w/bad.py", "version": 2, "changes": [
        {"range": {"start": {"line": 1, "character": 0}, "end": {"line": 1, "character": 0}}, "text": "\udfff"}]})
    for uri, line, char in ((URI, 4, 13), ("file:///w/bad.py", 1, 6)):
        res = await c.request("complete", {"uri": uri, "position": {"line": line, "character": char},
                                           "max_tokens": 3}, timeout=120)
        assert res["cancelled"] is False
    # one UTF-16 unit per surrogate, as in the editor: character 7 of "s = '\ud800'" is the line's end
    await c.request("complete", {"uri": "file:///w/bad.py", "position": {"line": 0, "character": 7},
                                 "max_tokens": 2}, timeout=120)
    with pytest.raises(DaemonError):
        await c.request("complete", {"uri": "file:///w/bad.py", "position": {"line": 0, "character": 8}})
    assert (await c.request("status", {}))["documents"] >= 2
    await c.close()


async def test_invalid_utf8_costs_one_request_and_frames_before_it_are_answered(daemon):
    """A string that is not UTF-8 (a lone surrogate encoded, CESU-style) between valid frames."""
    bad_open = b"\x94\x00\x02\xaddocument/open\x82\xa3uri\xa1u\xa4text\xa5a\xed\xa0\x80b"
    got = await exchange(daemon, [[0, 1, "status", {}], bad_open, [0, 3, "status", {}]], {1, 2, 3})
    assert got[1][0] is None and got[3][0] is None  # before and after: answered
    assert got[2][0]["code"] == -32602 and "UTF-8" in got[2][0]["message"] and "text" in got[2][0]["message"]


async def test_stream_errors_name_their_reason_after_answering_what_came_before(daemon):
    deep = b"\x91" * 5000  # nested deeper than the decoder allows
    got = await exchange(daemon, [[0, 1, "status", {}], deep], {1, None}, timeout=30)
    assert got[1][0] is None
    assert got[None][0]["code"] == -32600 and got[None][0]["message"] == "malformed frame: nesting too deep"
    got = await exchange(daemon, [[0, 1, "status", {}], b"\xc1"], {1, None}, timeout=30)
    assert got[1][0] is None and got[None][0]["message"].startswith("malformed frame: not MessagePack")
