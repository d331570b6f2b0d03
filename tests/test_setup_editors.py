"""`completiond setup neovim | vscode` (issue 39 item 6): the plugin lands where the editor loads it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nvim_util import PLUGIN_ROOT, find_nvim

ROOT = Path(__file__).resolve().parents[1]
NVIM = find_nvim()


def completiond(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "completiond", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, cwd=ROOT)


@pytest.mark.skipif(NVIM is None, reason="no Neovim")
def test_setup_neovim_links_the_plugin_and_neovim_loads_it_with_the_printed_line(tmp_path):
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CONFIG_HOME": str(tmp_path / "config"),
           "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = completiond("setup", "neovim", env=env)
    assert done.returncode == 0, done.stderr
    dest = tmp_path / "data" / "nvim" / "site" / "pack" / "completiond" / "start" / "completiond"
    assert dest.is_symlink() and dest.resolve() == PLUGIN_ROOT.resolve()
    line = done.stdout.strip().splitlines()[-1].strip()
    assert line.startswith("require('completiond').setup("), done.stdout
    # a fresh Neovim whose init.lua is that one line: the plugin loads from the pack path
    init = tmp_path / "config" / "nvim" / "init.lua"
    init.parent.mkdir(parents=True)
    init.write_text(line + "\n")
    probe = ("lua io.stdout:write(vim.inspect({ ok = require('completiond').config ~= nil,"
             " cmd = vim.fn.exists(':CompletiondStatus'),"
             " file = vim.api.nvim_get_runtime_file('lua/completiond/init.lua', false)[1] }))")
    out = subprocess.run([NVIM, "--headless", "-c", probe, "-c", "qa!"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, **env})
    text = out.stdout + out.stderr
    assert "ok = true" in text and "cmd = 2" in text and str(dest) in text, text
    # again: nothing to do; a different folder there is left alone without --force
    again = completiond("setup", "neovim", env=env)
    assert again.returncode == 0 and "already linked" in again.stdout
    dest.unlink()
    dest.mkdir()
    refused = completiond("setup", "neovim", env=env)
    assert refused.returncode == 2 and "--force" in refused.stderr and refused.stderr.count("\n") == 1
    copied = completiond("setup", "neovim", "--copy", "--force", env=env)
    assert copied.returncode == 0 and (dest / "lua" / "completiond" / "init.lua").is_file() and not dest.is_symlink()


def test_setup_vscode_without_code_prints_where_the_vsix_is(tmp_path):
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("npm is needed for the VS Code extension (Node 20)")
    bin_dir = tmp_path / "bin"  # PATH with node and npm but no `code`
    bin_dir.mkdir()
    for tool in ("node", "npm", "npx"):
        if shutil.which(tool):
            (bin_dir / tool).symlink_to(shutil.which(tool))
    env = {"PATH": f"{bin_dir}:/bin"}
    done = completiond("setup", "vscode", env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    vsix = ROOT / "editors" / "vscode" / "completiond.vsix"
    assert vsix.is_file() and vsix.stat().st_size > 10_000
    assert "`code` is not on PATH" in done.stdout and f"code --install-extension {vsix}" in done.stdout, done.stdout
