"""The daemon as a real process on a temporary socket: protocol, scheduling, workspace, bad input."""

import asyncio
import os
import socket
import stat
import time

import msgpack
import pytest

from completiond.service.client import Client, DaemonError
from daemon_util import fuzz_frames, fuzz_send, start_daemon, stop_daemon

SRC = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"
URI = "file:///w/m.py"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return tmp_path_factory.mktemp("ws")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, tiny_dir, workspace):
    sock = tmp_path_factory.mktemp("run") / "d.sock"
    proc = start_daemon(sock, tiny_dir)
    yield sock
    assert stop_daemon(proc) == 0
    assert not sock.exists()


async def connect(sock, roots=()):
    c = await Client.connect(sock)
    info = await c.request("initialize", {"client": "test", "protocol": 1, "workspace_roots": list(roots)})
    assert info["protocol"] == 1 and "target" in info and "device" in info
    return c


async def open_doc(c, uri=URI, text=SRC):
    await c.request("document/open", {"uri": uri, "text": text, "version": 1, "language_id": "python"})


async def test_complete_streams_partials_that_concatenate(daemon):
    c = await connect(daemon)
    await open_doc(c)
    parts, final_seen = [], []
    c.on("complete/partial", lambda p: parts.append((p["id"], p["text"], bool(final_seen))))
    msgid, fut = c.send_request("complete", {"uri": URI, "position": {"line": 8, "character": 14},
                                             "max_tokens": 24, "mode": "combined"})
    res = await asyncio.wait_for(fut, 60)
    final_seen.append(True)
    assert parts, "no partial notifications"
    assert all(i == msgid and not late for i, _, late in parts)
    assert "".join(t for _, t, _ in parts) == res["text"]
    for key in ("text", "tokens", "target_passes", "mean_accepted", "ms_first_token", "ms_total", "cancelled"):
        assert key in res
    assert res["cancelled"] is False
    await c.close()


async def test_document_changes_utf16_and_version(daemon):
    c = await connect(daemon)
    await open_doc(c, text="s = '😀'\n")
    # insert after the emoji: character 7 in UTF-16 units (the emoji is 2 units, at 5 and 6)
    await c.request("document/change", {"uri": URI, "version": 2, "changes": [
        {"range": {"start": {"line": 0, "character": 7}, "end": {"line": 0, "character": 7}}, "text": "é"}]})
    look = await c.request("debug/lookup", {"uri": URI, "position": {"line": 0, "character": 8}})
    assert isinstance(look["candidates"], list)
    with pytest.raises(DaemonError) as e:  # inside the surrogate pair
        await c.request("complete", {"uri": URI, "position": {"line": 0, "character": 6}})
    assert e.value.code == -32602
    with pytest.raises(DaemonError) as e:
        await c.request("complete", {"uri": URI, "position": {"line": 0, "character": 1}, "version": 1})
    assert e.value.code == -32801 and "version" in e.value.message
    res = await c.request("complete", {"uri": URI, "position": {"line": 0, "character": 9}, "version": 2,
                                       "max_tokens": 4})
    assert isinstance(res["text"], str)
    await c.request("document/close", {"uri": URI})
    with pytest.raises(DaemonError):
        await c.request("complete", {"uri": URI, "position": {"line": 0, "character": 0}})
    await c.close()


async def test_rewrite_streams_and_answers(daemon):
    c = await connect(daemon)
    await open_doc(c)
    parts = []
    c.on("rewrite/partial", lambda p: parts.append(p["text"]))
    res = await c.request("rewrite", {"uri": URI, "range": {"start": {"line": 0, "character": 0},
                                                            "end": {"line": 2, "character": 0}},
                                      "instruction": "rename add to plus", "max_tokens": 20}, timeout=60)
    assert isinstance(res["text"], str) and res["target_passes"] >= 0
    assert "".join(parts) == res["text"].rstrip("\n") or "".join(parts) == res["text"]
    await c.close()


async def long_request(c, uri=URI, **extra):
    """A request that would run ~2000 tokens; resolves its first partial in `first`."""
    first = asyncio.get_running_loop().create_future()
    seen = []

    def on(p):
        seen.append(p["text"])
        if not first.done():
            first.set_result(p["id"])
    unsubscribe = c.on("complete/partial", on)
    msgid, fut = c.send_request("complete", {"uri": uri, "position": {"line": 8, "character": 14},
                                             "max_tokens": 2000, "mode": "ar", "multiline": True, **extra})
    return msgid, fut, first, seen, unsubscribe


async def test_explicit_cancel_stops_quickly(daemon):
    c = await connect(daemon)
    await open_doc(c, text=SRC.replace("mul(a, b):\n", "mul(a, b):"))
    msgid, fut, first, seen, _ = await long_request(c)
    await asyncio.wait_for(first, 60)
    await c.request("cancel", {"id": msgid})
    n_at_cancel = len(seen)
    res = await asyncio.wait_for(fut, 30)
    assert res["cancelled"] is True
    assert len(res["tokens"]) < 2000
    # stopped within a pass or two of the cancel (partials already in flight may still arrive)
    assert len(res["tokens"]) <= n_at_cancel * 64 + 64
    with pytest.raises(DaemonError):
        await c.request("cancel", {"id": msgid})  # no longer in flight
    await c.close()


async def test_latest_complete_for_a_document_wins(daemon):
    c = await connect(daemon)
    await open_doc(c, text=SRC.replace("mul(a, b):\n", "mul(a, b):"))
    msgid, fut, first, _, _ = await long_request(c)
    await asyncio.wait_for(first, 60)
    newer = await c.request("complete", {"uri": URI, "position": {"line": 8, "character": 14}, "max_tokens": 5},
                            timeout=60)
    old = await asyncio.wait_for(fut, 30)
    assert old["cancelled"] is True and newer["cancelled"] is False
    await c.close()


async def test_clients_share_the_daemon_and_survive_a_disconnect(daemon):
    a, b = await connect(daemon), await connect(daemon)
    await open_doc(a)
    await open_doc(b)  # same URI in another client: independent documents
    _, fut, first, _, _ = await long_request(a)
    await asyncio.wait_for(first, 60)
    a.writer.transport.abort()  # vanish mid-request
    res = await b.request("complete", {"uri": URI, "position": {"line": 8, "character": 14}, "max_tokens": 8},
                          timeout=60)
    assert res["cancelled"] is False
    st = await b.request("status", {})
    for key in ("target", "draft", "device", "clients", "documents", "indexed_files", "requests_served",
                "mean_accepted"):
        assert key in st
    assert st["requests_served"] >= 1
    assert st["cuda_graphs"] is None  # a CPU daemon's passes are eager (tests/test_cuda.py: the CUDA daemon's)
    await b.close()


async def test_another_clients_completion_does_not_wait_for_a_long_request(daemon):
    a, b = await connect(daemon), await connect(daemon)
    await open_doc(a, text=SRC.replace("mul(a, b):\n", "mul(a, b):"))
    await open_doc(b, uri="file:///w/other.py")
    msgid, fut, first, _, _ = await long_request(a)  # 2,000 tokens
    await asyncio.wait_for(first, 60)
    res = await b.request("complete", {"uri": "file:///w/other.py", "position": {"line": 8, "character": 14},
                                       "max_tokens": 5}, timeout=60)
    assert res["cancelled"] is False and not fut.done()  # served in turns, before the long one ended
    st = await b.request("status", {})
    assert st["scheduler"]["slots"] >= 2 and st["scheduler"]["turns"] > 0
    await a.request("cancel", {"id": msgid})
    assert (await asyncio.wait_for(fut, 30))["cancelled"] is True
    await a.close()
    await b.close()


async def wait_index(c, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = await c.request("status", {})
        if st["index_idle"]:
            return st
        await asyncio.sleep(0.1)
    raise TimeoutError("index did not settle")


async def test_workspace_files_feed_prompt_lookup(daemon, workspace):
    c = await connect(daemon, roots=[str(workspace)])
    await open_doc(c, uri="file:///w/q.py", text="value = zyxw_marker_fn(")
    pos = {"line": 0, "character": 22}

    async def candidates():
        await asyncio.sleep(0.4)  # watchdog event + debounce
        await wait_index(c)
        return " | ".join((await c.request("debug/lookup", {"uri": "file:///w/q.py", "position": pos}))["candidates"])

    f = workspace / "lib.py"
    f.write_text("total = zyxw_marker_fn(alpha_beta_gamma)\n")
    assert "alpha_beta_gamma" in await candidates()
    f.write_text("total = zyxw_marker_fn(delta_epsilon)\n")
    got = await candidates()
    assert "delta_epsilon" in got and "alpha_beta_gamma" not in got
    (workspace / "node_modules").mkdir()
    (workspace / "node_modules" / "dep.js").write_text("x = zyxw_marker_fn(ignored_dir)\n")
    (workspace / ".gitignore").write_text("secret.py\n")
    (workspace / "secret.py").write_text("x = zyxw_marker_fn(ignored_file)\n")
    (workspace / "blob.bin").write_bytes(b"zyxw_marker_fn(\x00binary)")
    f.rename(workspace / "moved.py")
    got = await candidates()
    assert "delta_epsilon" in got and "ignored" not in got and "binary" not in got
    (workspace / "moved.py").unlink()
    assert "delta_epsilon" not in await candidates()
    await c.close()


# ---- bad input ------------------------------------------------------------------------------------
async def raw(sock, payload: bytes, read_timeout=5.0):
    """Send raw bytes; return decoded frames until the daemon closes or goes quiet."""
    r, w = await asyncio.open_unix_connection(str(sock))
    out, unp = [], msgpack.Unpacker(raw=False)
    try:
        w.write(payload)
        await w.drain()
        while True:
            data = await asyncio.wait_for(r.read(65536), read_timeout)
            if not data:
                break
            unp.feed(data)
            out.extend(unp)
    except asyncio.TimeoutError:
        pass
    except ConnectionError:  # the daemon closed this connection while we were still writing
        out.append("closed")
    w.close()
    return out


def req(method, params, msgid=1):
    return msgpack.packb([0, msgid, method, params])


BAD_FRAMES = {
    "garbage bytes": (b"\xc1\xc1\xc1hello", -32600),
    "not an array": (msgpack.packb({"a": 1}), -32600),
    "short array": (msgpack.packb([0, 1, "status"]), -32600),
    "response frame": (msgpack.packb([1, 1, None, None]), -32600),
    "msgid not int": (msgpack.packb([0, "x", "status", {}]), -32600),
    "method not str": (msgpack.packb([0, 1, 5, {}]), -32600),
    "params not map": (msgpack.packb([0, 1, "status", [1, 2]]), -32602),
    "unknown method": (req("nope", {}), -32601),
    "unknown uri": (req("complete", {"uri": "file:///none", "position": {"line": 0, "character": 0}}), -32602),
    "wrong param type": (req("document/open", {"uri": 5, "text": "x"}), -32602),
    "bool for int": (req("cancel", {"id": True}), -32602),
    "bad position": (req("complete", {"uri": URI, "position": {"line": "0"}}), -32602),
    "bad mode": (req("complete", {"uri": URI, "position": {"line": 0, "character": 0}, "mode": "x"}), -32602),
    "invalid utf-8": (b"\x94\x00\x01\xa6status\xa2\xff\xfe", -32600),
}


@pytest.mark.parametrize("case", BAD_FRAMES)
async def test_bad_frames_get_errors_and_daemon_keeps_serving(daemon, case):
    payload, code = BAD_FRAMES[case]
    frames = await raw(daemon, payload, read_timeout=2.0)
    errors = [f for f in frames if f[0] == 1 and f[2] is not None]
    assert errors and errors[0][2]["code"] == code
    c = await connect(daemon)
    other = await connect(daemon)
    assert (await c.request("status", {}))["clients"] == 1  # the other client; the asker and the bad peer not
    await other.close()
    await c.close()


@pytest.mark.parametrize("method,params", [
    ("document/open", {"uri": {"a": 1}, "text": "x", "version": 1}),
    ("document/change", {"uri": ["x"], "version": 2, "changes": []}),
    ("document/close", {"uri": {"a": 1}}),
])
@pytest.mark.parametrize("kind", ["request", "notification"])
async def test_a_bad_message_costs_itself_not_the_connection(daemon, method, params, kind):
    """Found by benchmarks/fuzz.py on the real model: a map or list as `uri` was answered with an
    error and then raised in the after-edit hook (unhashable type), which closed the connection."""
    bad = msgpack.packb([0, 7, method, params] if kind == "request" else [2, method, params])
    frames = await raw(daemon, bad + req("status", {}, msgid=8), read_timeout=3.0)
    answers = {f[1]: f for f in frames if isinstance(f, list) and f[0] == 1}
    assert "closed" not in frames and 8 in answers and answers[8][2] is None, frames
    if kind == "request":
        assert answers[7][2]["code"] == -32602


async def test_truncated_and_oversize_frames(daemon):
    frames = await raw(daemon, req("status", {})[:-3], read_timeout=1.0)  # waits for the rest: no answer
    assert frames == []
    big = msgpack.packb([0, 1, "document/open", {"uri": "u", "text": "x" * (17 * 1024 * 1024)}])
    frames = await raw(daemon, big, read_timeout=10.0)
    # an error answer, or the connection closed mid-write: either way only this client is affected
    assert frames == ["closed"] or (frames[0][2]["code"] == -32600 and "over" in frames[0][2]["message"])
    c = await connect(daemon)
    await c.request("status", {})
    await c.close()


def test_fuzz_malformed_frames(daemon):
    """A few thousand random frames over a few connections; then the daemon still completes."""
    frames = fuzz_frames(3000)

    async def send_all():
        out = await fuzz_send(daemon, frames)
        assert out["internal_errors"] == 0, out["internal_error_frames"]
        assert out["answered"] > 0
        c = await connect(daemon)
        await open_doc(c)
        res = await c.request("complete", {"uri": URI, "position": {"line": 8, "character": 14}, "max_tokens": 4},
                              timeout=60)
        assert res["cancelled"] is False
        await c.close()

    asyncio.run(send_all())


# ---- lifecycle ------------------------------------------------------------------------------------
def test_socket_permissions_stale_socket_and_second_daemon(tmp_path, tiny_dir):
    run = tmp_path / "completiond"
    sock = run / "daemon.sock"
    run.mkdir(mode=0o755)
    # a stale socket from a "crashed" daemon: bound, then the process is gone
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    s.close()
    assert sock.exists()
    proc = start_daemon(sock, tiny_dir)
    try:
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(run).st_mode) == 0o700
        second = start_daemon(sock, tiny_dir, wait=False)
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2 and b"already running" in err and b"Traceback" not in err
        assert sock.exists()  # the live daemon's socket is untouched
    finally:
        assert stop_daemon(proc) == 0  # SIGTERM: clean exit
    assert not sock.exists()


async def test_shutdown_method_and_tcp_token(tmp_path, tiny_dir):
    sock = tmp_path / "d.sock"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token_file = tmp_path / "token"
    proc = start_daemon(sock, tiny_dir, "--tcp", f"127.0.0.1:{port}", "--token-file", str(token_file))
    try:
        assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
        c = await Client.connect(host="127.0.0.1", port=port)
        with pytest.raises(DaemonError):
            await c.request("status", {})  # not authenticated yet
        with pytest.raises(DaemonError) as e:  # an error frame, then the close
            await c.request("initialize", {"token": "wrong"})
        assert e.value.code == -32600
        await c.close()
        c = await Client.connect(host="127.0.0.1", port=port)
        await c.request("initialize", {"token": token_file.read_text().strip(), "protocol": 1})
        assert (await c.request("status", {}))["clients"] == 0  # status does not count its asker
        await c.close()
        c = await Client.connect(sock)
        await c.request("shutdown", {})
        await c.close()
        assert proc.wait(timeout=30) == 0
        assert not sock.exists()
    finally:
        stop_daemon(proc)


def test_tcp_refuses_non_loopback(tmp_path, tiny_dir):
    proc = start_daemon(tmp_path / "d.sock", tiny_dir, "--tcp", "0.0.0.0:5000", "--token-file",
                        str(tmp_path / "t"), wait=False)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and b"loopback" in err
