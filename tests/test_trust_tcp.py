"""Issue 38 item 2: idle unauthenticated TCP connections cannot lock out a client that holds the token.

When the waiting room (connections that have not sent initialize with the token) is full, the
oldest waiting connection is dropped, not the newcomer.
"""

import asyncio

import pytest

from completiond.service.client import Client
from completiond.service.transport import MAX_PENDING_AUTH
from daemon_util import daemon_status, read_frames, start_daemon, stop_daemon
from test_daemon_tcp import free_port

IDLE = 200


@pytest.fixture(scope="module")
def tcp_daemon(tmp_path_factory, tiny_dir):
    tmp = tmp_path_factory.mktemp("tcp-lockout")
    port, token_file = free_port(), tmp / "token"
    # a long deadline: the idle connections are not closed by it while the test runs
    proc = start_daemon(tmp / "d.sock", tiny_dir, "--tcp", f"127.0.0.1:{port}", "--token-file", str(token_file),
                        "--auth-timeout", "120")
    yield {"port": port, "token": token_file.read_text().strip(), "sock": tmp / "d.sock"}
    assert stop_daemon(proc) == 0


async def authenticate(d: dict) -> None:
    c = await Client.connect(host="127.0.0.1", port=d["port"])
    try:
        info = await c.request("initialize", {"token": d["token"], "protocol": 1}, timeout=30)
        assert info["protocol"] == 1
        assert (await c.request("status", {}, timeout=30))["state"] == "ready"
    finally:
        await c.close()


async def test_200_idle_connections_do_not_lock_out_the_token_holder(tcp_daemon):
    conns = await asyncio.gather(*(asyncio.open_connection("127.0.0.1", tcp_daemon["port"]) for _ in range(IDLE)))
    frames: list[list] = [[] for _ in conns]
    readers = [asyncio.create_task(read_frames(r, out)) for (r, _), out in zip(conns, frames)]
    try:
        await asyncio.sleep(1.0)  # all accepted and waiting
        await authenticate(tcp_daemon)
        # the oldest idle ones were dropped with one error frame each; the waiting room stays bounded
        await asyncio.sleep(1.0)
        dropped = sum(any("too many connections waiting" in f[2]["message"] for f in fs) for fs in frames)
        assert dropped >= IDLE - MAX_PENDING_AUTH
        assert daemon_status(tcp_daemon["sock"])["clients"] <= MAX_PENDING_AUTH + 1
    finally:
        for _, w in conns:
            w.close()
        for t in readers:
            t.cancel()


async def test_the_token_holder_is_served_while_idle_connections_keep_coming(tcp_daemon):
    """Any local user can keep opening idle connections; a client with the token still gets in, every time."""
    stop = asyncio.Event()
    opened: list[asyncio.StreamWriter] = []

    async def flood() -> None:
        while not stop.is_set():
            try:
                _, w = await asyncio.open_connection("127.0.0.1", tcp_daemon["port"])
                opened.append(w)
            except OSError:
                await asyncio.sleep(0.01)
            if len(opened) > IDLE:  # keep ~200 open on our side: close the oldest
                opened.pop(0).close()

    flooders = [asyncio.create_task(flood()) for _ in range(4)]
    try:
        await asyncio.sleep(1.0)
        for _ in range(5):
            await asyncio.wait_for(authenticate(tcp_daemon), 60)
    finally:
        stop.set()
        await asyncio.gather(*flooders)
        for w in opened:
            w.close()
