"""Neovim tells the truth about the daemon (issue 38 item 6, issue 39 item 3): a real Neovim, the real
completiond-lsp, and no daemon at first: the plugin starts one (tiny model; its load takes seconds
here: torch import, conversion, calibration). Progress shows in the message area from the first
seconds, the loaded model once ready, and a stopped daemon at once, then progress again."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from nvim_util import PLUGIN_ROOT, find_nvim, wait_for

import pynvim  # noqa: E402

NVIM = find_nvim()

SETUP = """
local root, py, sock, target = ...
vim.opt.rtp:prepend(root)
require('completiond').setup({
  cmd = { py, '-m', 'completiond_lsp.server' },
  socket = sock, autostart = true, target = target, draft = 'self:1', dtype = 'float32',
  max_tokens = 8, debounce_ms = 30,
})
"""


def messages(n) -> str:
    return n.exec_lua("return vim.api.nvim_exec2('messages', { output = true }).output")


def state(n) -> dict:
    return n.exec_lua("local c = require('completiond'); local cl = c.client(0)"
                      "; local s = cl and c.status[cl.id] or {}"
                      "; return { state = s.state or '', message = s.message or '', target = s.target or '',"
                      " device = s.device or '', line = c.status_line() }")


def stop_daemon(sock) -> None:
    subprocess.run([sys.executable, "-m", "completiond", "stop", "--socket", str(sock)], capture_output=True,
                   timeout=60)


@pytest.mark.skipif(NVIM is None, reason="no Neovim")
def test_progress_from_the_first_seconds_model_when_ready_and_a_lost_daemon(tmp_path, tiny_dir):
    sock = tmp_path / "d.sock"
    (tmp_path / ".git").mkdir()
    n = pynvim.attach("child", argv=[NVIM, "--embed", "--headless", "--clean", "-n"])
    try:
        n.command("set columns=240")  # whole messages (the plugin cuts them to one screen line)
        n.exec_lua(SETUP, str(PLUGIN_ROOT), sys.executable, str(sock), str(tiny_dir))
        t0 = time.monotonic()
        n.command(f"edit {tmp_path / 'a.py'}")
        n.current.buffer[:] = ["def add(a, b):", "    return a + b", ""]
        # within 2 s of opening the file, a progress line in the message area (not only statusline())
        first = wait_for(lambda: "completiond: " in messages(n) and messages(n), timeout=2.0, what="progress")
        assert time.monotonic() - t0 <= 2.5
        assert "starting" in first
        # the daemon's own phases follow (each kept in :messages), then the model once ready
        st = wait_for(lambda: (lambda s: s if s["state"] == "ready" else None)(state(n)), timeout=300,
                      what="ready")
        log = messages(n)
        assert "starting the daemon" in log and ("importing torch" in log or "loading target" in log), log
        assert f"ready: {tiny_dir} on cpu" in log, log
        assert st["target"] == str(tiny_dir) and st["device"] == "cpu", st
        assert str(tiny_dir) in st["line"] and "device cpu" in st["line"] and "auto" not in st["line"], st
        n.command("checkhealth completiond")
        health = "\n".join(n.current.buffer[:])
        n.command("tabclose" if n.eval("tabpagenr('$')") > 1 else "enew!")
        assert f"ready; target {tiny_dir}" in health and "device cpu" in health, health
        # the daemon goes away: Neovim says so at once, then shows the new daemon's progress and model
        n.command(f"buffer {tmp_path / 'a.py'}")
        before = len(messages(n).splitlines())
        stop_daemon(sock)
        t1 = time.monotonic()
        wait_for(lambda: "daemon stopped" in "\n".join(messages(n).splitlines()[before:]), timeout=5,
                 what="daemon stopped")
        assert time.monotonic() - t1 <= 3.0
        after = "\n".join(messages(n).splitlines()[before:])
        assert "restarting" in after, after
        wait_for(lambda: (lambda s: s if s["state"] == "ready" else None)(state(n)), timeout=300, what="ready again")
        after = "\n".join(messages(n).splitlines()[before:])
        assert "starting the daemon" in after and f"ready: {tiny_dir} on cpu" in after, after
    finally:
        try:
            n.command("qa!", async_=True)
        finally:
            n.close()
        stop_daemon(sock)
