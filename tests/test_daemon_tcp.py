"""TCP mode (issue 13 point 6): the token file, whose roots a peer may use, unauthenticated peers."""

import asyncio
import os
import socket
import subprocess
import sys

import pytest

from completiond.service.client import Client, DaemonError
from daemon_util import read_frames, start_daemon, stop_daemon

AUTH_S = 3.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tcp_daemon(tmp_path_factory, tiny_dir):
    tmp = tmp_path_factory.mktemp("tcp")
    allowed, secret = tmp / "allowed", tmp / "secret"
    allowed.mkdir()
    secret.mkdir(mode=0o700)
    (secret / "s.py").write_text("key = zqv_secret_marker(hunter2_password)\n")
    port, token_file = free_port(), tmp / "token"
    proc = start_daemon(tmp / "d.sock", tiny_dir, "--tcp", f"127.0.0.1:{port}", "--token-file", str(token_file),
                        "--workspace", str(allowed), "--auth-timeout", str(AUTH_S))
    yield {"port": port, "token": token_file.read_text().strip(), "secret": secret, "allowed": allowed,
           "sock": tmp / "d.sock"}
    assert stop_daemon(proc) == 0


async def test_wrong_token_gets_an_error_frame_then_the_close(tcp_daemon):
    c = await Client.connect(host="127.0.0.1", port=tcp_daemon["port"])
    with pytest.raises(DaemonError) as e:
        await c.request("initialize", {"token": "wrong", "protocol": 1}, timeout=30)
    assert e.value.code == -32600 and "token" in e.value.message
    await asyncio.wait_for(c.closed.wait(), 30)  # and then the daemon hangs up
    await c.close()


async def test_tcp_peer_cannot_make_the_daemon_read_a_root_its_owner_did_not_configure(tcp_daemon):
    c = await Client.connect(host="127.0.0.1", port=tcp_daemon["port"])
    secret, allowed = tcp_daemon["secret"], tcp_daemon["allowed"]
    info = await c.request("initialize", {"token": tcp_daemon["token"], "protocol": 1,
                                          "workspace_roots": [str(secret), str(allowed / ".." / "secret"),
                                                              str(allowed)]}, timeout=60)
    assert info["ignored_roots"] == [str(secret), str(allowed / ".." / "secret")]
    await c.request("document/open", {"uri": "file:///q.py", "text": "x = zqv_secret_marker(", "version": 1})
    st = await c.request("status", {})
    assert str(secret) not in st["workspace_roots"] and str(allowed) in st["workspace_roots"]
    look = await c.request("debug/lookup", {"uri": "file:///q.py", "position": {"line": 0, "character": 22}},
                           timeout=60)
    assert not any("hunter2" in t for t in look["candidates"])
    await c.close()


async def test_unix_socket_peer_keeps_adding_its_roots(tcp_daemon, tmp_path):
    (tmp_path / "w.py").write_text("pass\n")
    c = await Client.connect(tcp_daemon["sock"])
    info = await c.request("initialize", {"protocol": 1, "workspace_roots": [str(tmp_path)]}, timeout=60)
    assert info["ignored_roots"] == []
    assert str(tmp_path) in (await c.request("status", {}))["workspace_roots"]
    await c.close()


async def test_unauthenticated_peers_have_a_deadline_and_a_cap(tcp_daemon):
    port = tcp_daemon["port"]
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(20)]  # cap is 16
    frames = await asyncio.wait_for(asyncio.gather(*(read_frames(r) for r, _ in conns)), 60)
    messages = [f[2]["message"] for fs in frames for f in fs]
    assert any("too many connections waiting" in m for m in messages)
    # the rest were closed for saying nothing: each with an error frame, none left open
    assert sum("no valid initialize within" in m for m in messages) >= 1
    assert len(messages) == 20
    for _, w in conns:
        w.close()
    # an authenticated client is unaffected
    c = await Client.connect(host="127.0.0.1", port=port)
    await c.request("initialize", {"token": tcp_daemon["token"], "protocol": 1}, timeout=30)
    await c.request("status", {})
    await c.close()


async def test_big_frames_before_initialize_are_cut_off(tcp_daemon):
    r, w = await asyncio.open_connection("127.0.0.1", tcp_daemon["port"])
    # the start of a 16 MB string, never finished: more than a peer may send before it authenticates
    w.write(b"\xdb" + (16 * 1024 * 1024 - 10).to_bytes(4, "big") + b"x" * (300 * 1024))
    try:
        await w.drain()
    except ConnectionError:
        pass
    frames = await asyncio.wait_for(read_frames(r), 30)
    assert frames and "before initialize" in frames[0][2]["message"]
    w.close()


def serve_with_token(tmp_path, token_file, tiny_dir):
    cmd = [sys.executable, "-m", "completiond", "serve", "--socket", str(tmp_path / "d.sock"), "--target",
           str(tiny_dir), "--tcp", f"127.0.0.1:{free_port()}", "--token-file", str(token_file)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_token_file_readable_by_others_is_refused(tmp_path, tiny_dir):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    os.chmod(token, 0o644)
    res = serve_with_token(tmp_path, token, tiny_dir)
    assert res.returncode == 2 and "readable" in res.stderr and "chmod 600" in res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another user needs root")
def test_token_file_of_another_user_is_refused(tmp_path, tiny_dir):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    os.chmod(token, 0o600)
    os.chown(token, 65534, 65534)
    res = serve_with_token(tmp_path, token, tiny_dir)
    assert res.returncode == 2 and "another user" in res.stderr and "Traceback" not in res.stderr
