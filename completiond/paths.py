"""Where completiond keeps its files and its socket (torch-free: the LSP process imports this)."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from platformdirs import user_cache_dir


class UnsafeDirError(Exception):
    """A folder completiond would trust (its cache, its socket's folder) may be changed by someone else."""


def cache_root() -> Path:
    """The cache directory: converted models, assembled GGUF files, calibration; COMPLETIOND_CACHE overrides.
    Only the path: `cache_dir.checked()` creates it 0700 and refuses it when it is not private."""
    return Path(os.environ.get("COMPLETIOND_CACHE", user_cache_dir("completiond")))


def socket_path() -> Path:
    """$COMPLETIOND_SOCKET, else $XDG_RUNTIME_DIR/completiond/daemon.sock, else a 0700 per-user temp dir."""
    if os.environ.get("COMPLETIOND_SOCKET"):
        return Path(os.environ["COMPLETIOND_SOCKET"])
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "completiond" / "daemon.sock"
    return Path(tempfile.gettempdir()) / f"completiond-{os.getuid()}" / "daemon.sock"


def private_dir(path: Path, what: str, tighten: bool = False) -> Path:
    """Create `path` (mode 0700, parents as usual) if missing, and refuse it (UnsafeDirError, one line)
    unless it is a directory owned by this user that neither group nor others can write: whoever can
    write it can plant files that completiond loads (a kernel library, a socket clients trust).
    tighten: a folder completiond named and made (the per-user socket folder), so a group/other
    permission bit is removed instead of refused."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.stat(path)  # a symlinked cache root is fine: the folder it names is what is checked
    except OSError as e:
        raise UnsafeDirError(f"{what} {path}: {e.strerror or e}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirError(f"{what} {path} is not a directory")
    if st.st_uid != os.getuid():
        raise UnsafeDirError(f"{what} {path} belongs to another user (uid {st.st_uid}); refusing it "
                             f"(choose a folder of your own)")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077 and tighten:
        os.chmod(path, 0o700)
    elif mode & 0o022:
        raise UnsafeDirError(f"{what} {path} is writable by group or others (mode {mode:o}); "
                             f"run `chmod go-w {path}`")
    return path
