"""A remote target (`--target openai:URL`) against a misbehaving server (a real asyncio HTTP server on
loopback): a byte-at-a-time trickle is given up after --remote-timeout whole-event silence and
cancelled at once, never holding other documents; endless events stop at max_tokens; a stream of
empty events ends at --remote-deadline; malformed answers are one-line errors naming the URL."""

import asyncio
import time

import pytest

import tiny

from completiond.service.client import Client, DaemonError
from daemon_util import Misbehaving, start_daemon, stop_daemon

DOC = "def area(r):\n    return \n\n\nprint(area(2))\n"
CURSOR = {"line": 1, "character": 11}


async def open_doc(sock, mode: str, uri: str) -> Client:
    c = await Client.connect(sock)
    await c.request("initialize", {"client": "t", "protocol": 1})
    await c.request("document/open", {"uri": uri, "text": f"# mode: {mode}\n" + DOC, "version": 1})
    return c


def at() -> dict:
    return {"line": CURSOR["line"] + 1, "character": CURSOR["character"]}


@pytest.fixture
async def laptop(tmp_path, tiny_dir):
    async with Misbehaving() as srv:
        log = tmp_path / "daemon.log"
        url = f"http://127.0.0.1:{srv.port}/v1"
        proc = await asyncio.to_thread(start_daemon, tmp_path / "d.sock", tiny_dir, "--target",
                                       f"openai:{url}#{tiny_dir}", "--remote-timeout", "2", "--remote-deadline", "4",
                                       "--no-warm", log=log)
        try:
            yield {"sock": tmp_path / "d.sock", "srv": srv, "url": url, "log": log}
        finally:
            assert await asyncio.to_thread(stop_daemon, proc) == 0
        text = log.read_text(errors="replace")
        assert "Traceback" not in text and "Unhandled exception" not in text, text[-3000:]


async def test_trickle_is_cancelled_at_once_and_holds_no_other_document(laptop):
    a = await open_doc(laptop["sock"], "trickle", "file:///a.py")
    b = await open_doc(laptop["sock"], "good", "file:///b.py")
    try:
        msgid, slow = a.send_request("complete", {"uri": "file:///a.py", "position": at(), "max_tokens": 16})
        await asyncio.sleep(0.6)  # the trickle is streaming
        t0 = time.monotonic()
        good = await b.request("complete", {"uri": "file:///b.py", "position": at(), "max_tokens": 16}, timeout=30)
        assert good["text"] == "r * r" and not slow.done()
        assert time.monotonic() - t0 < 1.0  # the old engine thread sat in the trickle's read
        t0 = time.monotonic()
        await a.request("cancel", {"id": msgid}, timeout=30)
        try:
            res = await asyncio.wait_for(slow, 30)
            assert res["cancelled"]
        except DaemonError as e:
            assert e.code == -32800
        assert time.monotonic() - t0 < 1.0
        for _ in range(50):  # and the server saw its connection closed
            if "trickle" in laptop["srv"].closed_at:
                break
            await asyncio.sleep(0.02)
        assert laptop["srv"].closed_at["trickle"] - t0 < 1.0
    finally:
        await a.close()
        await b.close()


async def test_trickle_fails_after_the_idle_deadline_naming_the_url(laptop):
    c = await open_doc(laptop["sock"], "trickle", "file:///t.py")
    try:
        t0 = time.monotonic()
        with pytest.raises(DaemonError) as e:
            await c.request("complete", {"uri": "file:///t.py", "position": at(), "max_tokens": 16}, timeout=60)
        assert time.monotonic() - t0 < 6  # 2 s of no whole event, though a byte came every 0.3 s
        assert laptop["url"] in e.value.message and "no whole event for 2 s" in e.value.message
        assert "\n" not in e.value.message
    finally:
        await c.close()


async def test_endless_events_stop_at_max_tokens(laptop):
    c = await open_doc(laptop["sock"], "endless", "file:///e.py")
    try:
        res = await c.request("complete", {"uri": "file:///e.py", "position": at(), "max_tokens": 16}, timeout=60)
        assert 0 < len(res["text"]) <= 32 and set(res["text"]) <= set("xy"), res["text"][:100]
        assert res["stopped_by"] in ("max_tokens", "stop_rule")
        st = await c.request("status", {})  # answered, and the server's stream is closed
        assert st["state"] == "ready"
    finally:
        await c.close()


async def test_empty_events_end_at_the_deadline(laptop):
    c = await open_doc(laptop["sock"], "empty", "file:///d.py")
    try:
        t0 = time.monotonic()
        res = await c.request("complete", {"uri": "file:///d.py", "position": at(), "max_tokens": 16}, timeout=60)
        assert res["stopped_by"] == "deadline" and res["text"] == ""
        assert 3.5 < time.monotonic() - t0 < 8
    finally:
        await c.close()


@pytest.mark.parametrize("mode,words", [("badtext", "sent an event this daemon cannot read"),
                                        ("badstatus", "answered something that is not HTTP")])
async def test_malformed_answers_are_one_line_errors_naming_the_url(laptop, mode, words):
    c = await open_doc(laptop["sock"], mode, f"file:///{mode}.py")
    try:
        with pytest.raises(DaemonError) as e:
            await c.request("complete", {"uri": f"file:///{mode}.py", "position": at(), "max_tokens": 8}, timeout=60)
        assert words in e.value.message and laptop["url"] in e.value.message, e.value.message
        assert "\n" not in e.value.message
    finally:
        await c.close()


async def test_stop_rules_read_a_long_answer_a_bounded_number_of_times():
    """1,000 events of one line each (128 KB for max_tokens 2048), a few ms apart: the stop rules read
    the text once per batch while it is short, then at each quarter of growth; not once per event
    (quadratic: 1,000 reads, 64 M characters)."""
    from completiond.core.prompt.stops import StopRules
    from completiond.core.remote import RemoteEngine, parse_remote
    from completiond.core.request import Request

    class Counting(StopRules):
        calls = chars = 0

        def cut(self, text: str) -> int | None:
            Counting.calls += 1
            Counting.chars += len(text)
            return super().cut(text)

    tok = tiny.tokenizer()
    async with Misbehaving() as srv:
        engine = RemoteEngine(parse_remote(f"openai:http://127.0.0.1:{srv.port}/v1#x"), tok, timeout_s=10)
        req = Request(prompt=tok.encode("# mode: long\nx = 1\n"), max_tokens=2048,
                      stops=Counting(line_rules=False, stop_strings=("NEVER",)))
        shown: list[str] = []

        def drive():
            steps = engine.run(req, lambda step: shown.append(step.text))
            try:
                while True:
                    next(steps)
            except StopIteration as done:
                return done.value

        res = await asyncio.to_thread(drive)
    assert res.text == ("x" * 127 + "\n") * 1000 and "".join(shown) == res.text
    assert Counting.calls < 100 and Counting.chars < 2_000_000, (Counting.calls, Counting.chars)
