"""A real Neovim (the plugin, completiond-lsp) on a daemon whose target is remote: another
completiond's `--http` (`--target openai:URL#model`). Ghost text streams in and Tab accepts it as
with a local target; the text is the one the server daemon gives its own editors."""

import asyncio
import sys

import pynvim
import pytest

import test_neovim as tn
from completiond.service.client import Client
from daemon_util import start_daemon, stop_daemon
from nvim_util import PLUGIN_ROOT, wait_for
from test_http import free_port
from test_neovim import workspace  # noqa: F401  (a fixture)


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_dir):
    tmp = tmp_path_factory.mktemp("nvim-remote-server")
    port = free_port()
    proc = start_daemon(tmp / "d.sock", tiny_dir, "--http", f"127.0.0.1:{port}", "--token-file", str(tmp / "token"))
    yield {"port": port, "sock": tmp / "d.sock", "token_file": tmp / "token"}
    stop_daemon(proc)


@pytest.fixture(scope="module")
def laptop_sock(tmp_path_factory, tiny_dir, server):
    sock = tmp_path_factory.mktemp("nvim-remote-laptop") / "d.sock"
    proc = start_daemon(sock, tiny_dir, "--target", f"openai:http://127.0.0.1:{server['port']}/v1#{tiny_dir}",
                        "--remote-token-file", str(server["token_file"]))
    yield sock
    stop_daemon(proc)


@pytest.fixture(scope="module")
def nvim(laptop_sock):
    n = pynvim.attach("child", argv=[tn.NVIM, "--embed", "--headless", "--clean", "-n"])
    n.exec_lua(tn.SETUP, str(PLUGIN_ROOT), sys.executable, str(laptop_sock), tn.DEBOUNCE_MS, tn.MAX_TOKENS)
    yield n
    try:
        n.command("qa!", async_=True)
    finally:
        n.close()


async def server_answer(sock) -> str:
    """The server daemon's own answer for the buffer and cursor, over its wire protocol."""
    c = await Client.connect(sock)
    try:
        await c.request("initialize", {"client": "t", "protocol": 1})
        text = "\n".join(tn.PY) + "\n"
        await c.request("document/open", {"uri": "file:///remote.py", "text": text, "version": 1})
        res = await c.request("complete", {"uri": "file:///remote.py", "max_tokens": tn.MAX_TOKENS,
                                           "position": {"line": 3, "character": len(tn.PY[3])}}, timeout=120)
        return res["text"]
    finally:
        await c.close()


def test_ghost_text_and_tab_through_a_remote_target(nvim, workspace, server):  # noqa: F811 (pynvim: no async test)
    s = tn.insert_at_end(nvim, workspace / "remote.py", tn.PY)
    g = s["ghost"]
    assert (g["row"], g["col"]) == (3, len(tn.PY[3])) and g["text"] and s["partials"] > 0
    assert tn.as_virtual_text(nvim.exec_lua(tn.SERVER_SUGGESTION)) == g["text"]
    assert tn.as_virtual_text(asyncio.run(server_answer(server["sock"]))) == g["text"]
    nvim.input("<Tab>")
    want = tn.inserted(tn.PY, s["row"], s["col"], g["text"])
    wait_for(lambda: tn.snap(nvim)["lines"] == want, timeout=20, what=f"buffer {want!r}")
