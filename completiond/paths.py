"""Where completiond keeps its files and its socket (torch-free: the LSP process imports this)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from platformdirs import user_cache_dir


def cache_root() -> Path:
    """The cache directory: converted models, assembled GGUF files, calibration; COMPLETIOND_CACHE overrides."""
    return Path(os.environ.get("COMPLETIOND_CACHE", user_cache_dir("completiond")))


def socket_path() -> Path:
    """$COMPLETIOND_SOCKET, else $XDG_RUNTIME_DIR/completiond/daemon.sock, else a 0700 per-user temp dir."""
    if os.environ.get("COMPLETIOND_SOCKET"):
        return Path(os.environ["COMPLETIOND_SOCKET"])
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "completiond" / "daemon.sock"
    return Path(tempfile.gettempdir()) / f"completiond-{os.getuid()}" / "daemon.sock"
