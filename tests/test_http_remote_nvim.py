"""A real Neovim (the plugin, completiond-lsp) on a daemon whose target is remote: another
completiond's `--http` (`--target openai:URL#model`). Ghost text streams in and Tab accepts it as
with a local target; the text is the one the server daemon gives its own editors. test_neovim.py's
own tests run here too (imported: pytest runs them with this module's fixtures), all but
test_cursor_move_and_insert_leave_clear: the tiny model has no FIM tokens, so a remote target sends
the prompt without the line's rest (`suffix` is empty) and, mid-line, the server answers for another
document than the laptop's (nothing, before the `:`); a FIM model's prompt carries it. A server that is
down, answers 500 or stays silent shows as a warning and in :checkhealth, and typing goes on."""

import asyncio
import sys

import pynvim
import pytest

import test_neovim as tn
from completiond.service.client import Client
from daemon_util import start_daemon, stop_daemon
from nvim_util import PLUGIN_ROOT, wait_for
from test_http import free_port
from test_http_remote import failing_target
from test_neovim import (  # noqa: F401  (a fixture and the shared tests)
    test_accept_line_inserts_up_to_the_line_break,
    test_accept_word_inserts_the_first_word,
    test_dismiss_then_tab_is_a_real_tab,
    test_fast_typing_sends_few_requests_and_no_stale_text,
    test_ghost_text_streams_in_at_the_cursor,
    test_positions_with_non_ascii_text,
    test_tab_accepts_a_multiline_suggestion,
    test_tab_accepts_exactly_the_suggestion,
    test_typing_the_suggestion_keeps_the_rest,
    workspace,
)


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
def daemon_sock(laptop_sock):
    return laptop_sock  # the name test_neovim's tests ask for


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


# vim.notify recorded (the plugin's warnings), then the buffer set up like test_neovim's.
NOTES = """
_G.completiond_notes = {}
vim.notify = function(msg, level) table.insert(_G.completiond_notes, { msg = msg, level = level }) end
"""


@pytest.mark.parametrize("failure", ["down", "500", "silent"])
def test_a_failing_server_is_shown_and_typing_goes_on(tmp_path, tiny_dir, workspace, failure):  # noqa: F811
    url, words, srv = failing_target(failure)
    proc = start_daemon(tmp_path / "d.sock", tiny_dir, "--target", f"openai:{url}#{tiny_dir}", "--remote-timeout", "2")
    n = pynvim.attach("child", argv=[tn.NVIM, "--embed", "--headless", "--clean", "-n"])
    try:
        n.exec_lua(tn.SETUP, str(PLUGIN_ROOT), sys.executable, str(tmp_path / "d.sock"), tn.DEBOUNCE_MS, tn.MAX_TOKENS)
        n.exec_lua(NOTES)
        tn.open_buffer(n, workspace / f"fail-{failure}.py", tn.PY)
        n.input("GA")
        if failure == "silent":  # while the server keeps the request waiting, the editor takes keys
            n.input("  x")
            wait_for(lambda: tn.snap(n)["lines"][3] == tn.PY[3] + "  x", timeout=5, what="typed while waiting")
        note = wait_for(lambda: n.exec_lua("for _, m in ipairs(_G.completiond_notes) do "
                                           "if m.msg:find('remote target', 1, true) then return m end end"),
                        timeout=30, what="a warning about the server")
        assert words in note["msg"] and url in note["msg"] and note["level"] == 3  # vim.log.levels.WARN
        s = wait_for(lambda: (lambda t: t if not t["busy"] else None)(tn.snap(n)), timeout=10, what="not busy")
        assert s["nmarks"] == 0 and s["mode"] == "i"  # no ghost text, still inserting
        n.input("y")
        wait_for(lambda: tn.snap(n)["lines"][3].endswith("y"), timeout=5, what="typing goes on")
        n.input("<Esc>")
        health = tn.checkhealth_text(n)
        assert "ERROR" in health and words in health, health
    finally:
        try:
            n.command("qa!", async_=True)
        finally:
            n.close()
        stop_daemon(proc)
        if srv is not None:
            srv.shutdown()
