"""Where completiond keeps its files (torch-free: the LSP process imports this)."""

from __future__ import annotations

import os
from pathlib import Path

from platformdirs import user_cache_dir


def cache_root() -> Path:
    """The cache directory: converted models, assembled GGUF files, calibration; COMPLETIOND_CACHE overrides."""
    return Path(os.environ.get("COMPLETIOND_CACHE", user_cache_dir("completiond")))
