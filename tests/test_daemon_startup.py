"""Start-up: the socket is up and `status` answers while the models load; requests sent meanwhile
are answered once they are in, in the order sent; a load that fails is one line and exit 2."""

import asyncio
import subprocess
import sys
import threading

import pytest

import tiny
from completiond.service.client import Client, DaemonError
from completiond.service.daemon import Daemon
from completiond.core.engine import Engine
from daemon_util import daemon_status, wait_for_socket

SRC = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n"
URI = "file:///w/m.py"


async def serve_with(loader, sock):
    daemon = Daemon(loader, {"target": "tiny", "draft": None, "device": "cpu", "state": "loading",
                             "socket": str(sock)})
    task = asyncio.create_task(daemon.serve(sock))
    for _ in range(200):
        if sock.exists():
            break
        await asyncio.sleep(0.01)
    return daemon, task


async def test_status_answers_while_loading_and_requests_wait_in_order(tmp_path):
    release = threading.Event()
    loaded = tiny.loaded(tiny.gemma_config())

    def loader(index, phase):  # stands where the real model load runs: blocked until the test says so
        phase("loading target tiny")
        assert release.wait(60)
        phase("calibrating")
        return Engine(loaded, index=index), {"dtype": "float32"}

    sock = tmp_path / "d.sock"
    daemon, task = await serve_with(loader, sock)
    try:
        c = await Client.connect(sock)
        info = await c.request("initialize", {"client": "t", "protocol": 1, "workspace_roots": []})
        assert info["state"] == "loading" and info["target"] == "tiny"
        await c.request("document/open", {"uri": URI, "text": SRC, "version": 1, "language_id": "python"})
        st = await c.request("status", {})
        assert st["state"] == "loading" and st["phase"] == "loading target tiny" and st["error"] is None
        assert [p["phase"] for p in st["phases_done"]] == ["starting"]
        # sent while loading: it waits, and the edit sent after it is applied after it (frame order)
        _, first = c.send_request("complete", {"uri": URI, "position": {"line": 4, "character": 14},
                                               "version": 1, "max_tokens": 4, "mode": "ar"})
        await c.notify("document/change", {"uri": URI, "version": 2, "changes": [{"text": SRC + "x"}]})
        await asyncio.sleep(0.3)
        assert not first.done()
        release.set()
        res = await asyncio.wait_for(first, 60)
        assert res["cancelled"] is False and len(res["tokens"]) > 0
        st = await c.request("status", {})
        assert st["state"] == "ready" and st["dtype"] == "float32" and "phase" not in st
        await c.close()
    finally:
        release.set()
        daemon.stopping.set()
        await asyncio.wait_for(task, 30)


async def test_failed_load_answers_waiting_requests_and_stops(tmp_path):
    release = threading.Event()

    def loader(index, phase):
        phase("loading target nowhere")
        assert release.wait(60)
        raise OSError("no model at /nowhere")

    sock = tmp_path / "d.sock"
    daemon, task = await serve_with(loader, sock)
    c = await Client.connect(sock)
    _, waiting = c.send_request("lookup", {"uri": URI, "position": {"line": 0, "character": 0}})
    await asyncio.sleep(0.2)
    release.set()
    with pytest.raises(DaemonError, match="models failed to load: no model at /nowhere"):
        await asyncio.wait_for(waiting, 30)
    await asyncio.wait_for(task, 30)
    assert daemon.error == "no model at /nowhere" and not sock.exists()


def test_serve_status_from_the_first_second_then_ready(tmp_path, tiny_dir):
    """The real process: the socket answers `status` before the (transformers) load has finished."""
    sock = tmp_path / "d.sock"
    cmd = [sys.executable, "-m", "completiond", "serve", "--socket", str(sock), "--target", str(tiny_dir),
           "--draft", "none", "--dtype", "float32", "--log-level", "INFO"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_socket(sock, proc)
        seen = [daemon_status(sock)]
        while seen[-1]["state"] != "ready":
            assert seen[-1]["state"] == "loading" and seen[-1]["phase"], seen[-1]
            seen.append(daemon_status(sock))
        # transformers alone takes seconds to import, after the socket is up: the first answer is "loading"
        assert seen[0]["state"] == "loading" and seen[-1]["dtype"] == "float32", seen
        assert any(st["phase"].startswith(("importing torch", "loading target")) for st in seen[:-1])
        assert seen[-1]["clients"] == 0
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    phases = [line.split("start-up: ", 1)[1] for line in err.splitlines() if "start-up: " in line]
    assert any(p.startswith("loading target") for p in phases) and any(p.startswith("ready after") for p in phases)


def test_serve_unknown_model_is_one_line_and_exit_2(tmp_path):
    sock = tmp_path / "d.sock"
    out = subprocess.run([sys.executable, "-m", "completiond", "serve", "--socket", str(sock), "--target",
                          str(tmp_path / "no-such-model"), "--log-level", "ERROR"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("completiond: ") and "Traceback" not in out.stderr
    assert not sock.exists()
