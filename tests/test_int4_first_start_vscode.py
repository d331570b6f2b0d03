"""VS Code (code-server + headless Chromium, `editors/vscode/test/e2e.sh`) with `completiond.target =
'qwen2.5-coder-1.5b@int4'` on a cache where that model is not converted: while the daemon starts, the
status bar shows the converting phase with its progress; then ghost text comes, the status bar names
the model, and the daemon says the int4 weights answered.

The real completiond-lsp autostarts the daemon on a socket of this test's own (so the daemon outlives
the editor for the check below, then is stopped here) and the real 1.5B conversion (~70-115 s at idle
priority on 2 cores) runs into a scratch cache of this test's own (tests/int4_first_start.py). Skips
where the editor or the real models are missing, fails there under COMPLETIOND_E2E_REQUIRED=1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import int4_first_start as first
from daemon_util import daemon_status
from nvim_util import wait_for
from test_vscode_e2e import CHROMIUM, CODE_SERVER, EXT, editor  # noqa: F401  (editor: the skip/fail fixture)

pytestmark = pytest.mark.real_model
# the status bar while it converts: "qwen2.5-coder-1.5b@int4: converting qwen2.5-coder-1.5b@int4 43 % (21 s)"
CONVERTING = re.compile(r"converting " + re.escape(first.TARGET) + r" (\d+) % \((\d+) s\)")


def run_until_ghost(tmp_path: Path, target: str, sock: Path, cache: Path) -> str:
    """e2e.sh up to its `inline` stage (ghost text, accepted with Tab) with `target` set; its output."""
    lsp = shutil.which("completiond-lsp") or str(Path(sys.executable).parent / "completiond-lsp")
    assert Path(lsp).exists(), "completiond-lsp is not installed (pip install -e .)"
    settings = {"completiond.target": target, "completiond.socket": str(sock)}
    env = {**os.environ, "COMPLETIOND_CACHE": str(cache), "COMPLETIOND_LSP": lsp,
           "COMPLETIOND_E2E_SETTINGS": json.dumps(settings), "CODE_SERVER": str(CODE_SERVER),
           "CHROMIUM": str(CHROMIUM), "E2E_UNTIL": "inline", "E2E_TIMEOUT_MS": "900000",
           "E2E_SCREENSHOT": str(tmp_path / "inline.png")}
    done = subprocess.run(["bash", str(EXT / "test" / "e2e.sh")], cwd=EXT, env=env, capture_output=True,
                          text=True, timeout=1500)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "stage inline: ok" in out, out[-6000:]
    return out


def test_named_int4_target_converts_with_progress_then_answers(editor, tmp_path):  # noqa: F811
    first.require_real_models()
    cache = first.scratch_cache(tmp_path / "cache")
    sock = tmp_path / "d.sock"
    try:
        out = run_until_ghost(tmp_path, first.TARGET, sock, cache)
        # the daemon the editor's server started (it outlives the editor), once it counted the answer
        st = wait_for(lambda: (st := daemon_status(sock))["requests_served"] >= 1 and st, timeout=300,
                      interval=0.2, what="the answer")
    finally:
        subprocess.run([sys.executable, "-m", "completiond", "stop", "--socket", str(sock)], capture_output=True,
                       timeout=60)
    shown = [json.loads(m) for m in re.findall(r"\] status: (\".*\")$", out, re.M)]
    print("\n".join(shown))
    converting = [(text, float(m.group(1))) for text in shown if (m := CONVERTING.search(text))]
    first.check_converting(converting)
    after = re.search(r"status after the ghost: (\".*?\") — ", out)
    assert after and json.loads(after.group(1)).startswith(f"{first.TARGET} · cpu"), out[-3000:]
    first.check_daemon(st, cache)
