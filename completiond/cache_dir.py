"""The cache folder completiond trusts: private folders, and code it loads only if it wrote it.

Whoever can write the cache can make completiond run code: the int8 kernel compiled into
`kernels/` is loaded with ctypes. So the root (COMPLETIOND_CACHE or the per-user cache dir) and its
folders are created 0700 and refused when another user owns them or group/others can write them
(`paths.private_dir`, the check the socket's folder gets), and a file completiond executes is
loaded only when `verified()`: a sidecar `<file>.sha256`, written atomically by this user's process
right after it built the file, holds its sha256 and the (device, inode) it was written for, so a
library put there by hand, or a library and sidecar copied in from another cache, does not count
(that costs a copied cache one rebuild).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .paths import UnsafeDirError, cache_root, private_dir

__all__ = ["UnsafeDirError", "checked", "check_cache", "record", "verified", "locked"]

FOLDERS = ("kernels", "models", "gguf", "calibration")
SIDECAR = ".sha256"
MAX_SIDECAR_BYTES = 4096


def checked(*parts: str) -> Path:
    """cache_root()/parts..., each level created 0700 if missing and checked (UnsafeDirError if not private)."""
    path = private_dir(cache_root(), "cache folder")
    for part in parts:
        path = private_dir(path / part, "cache folder")
    return path


def check_cache() -> Path:
    """What the CLI checks before it loads anything: the root and every folder directly under it
    (the usual ones created 0700 now, before code elsewhere makes them with the umask's mode)."""
    root = checked()
    for name in FOLDERS:
        private_dir(root / name, "cache folder")
    with os.scandir(root) as entries:
        for e in entries:
            if e.is_dir():
                private_dir(Path(e.path), "cache folder")
    return root


@contextmanager
def locked(folder: Path) -> Iterator[None]:
    """An exclusive flock on the folder itself: builds into it (check, compile, record) run one at a time."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + SIDECAR)


def _sha256(fd: int) -> str:
    h = hashlib.sha256()
    while chunk := os.read(fd, 1 << 20):
        h.update(chunk)
    return h.hexdigest()


def _open_own_regular(path: Path) -> tuple[int, os.stat_result]:
    """An fd on `path` if it is a regular file of this user's that group/others cannot write (not a
    symlink, FIFO or device: O_NOFOLLOW | O_NONBLOCK, then fstat); ValueError says why not."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ValueError("missing") from None
    except OSError as e:  # ELOOP: a symlink
        raise ValueError(e.strerror or str(e)) from None
    st = os.fstat(fd)
    why = ("not a regular file" if not stat.S_ISREG(st.st_mode) else
           f"owned by uid {st.st_uid}" if st.st_uid != os.getuid() else
           "writable by group or others" if st.st_mode & 0o022 else None)
    if why:
        os.close(fd)
        raise ValueError(why)
    return fd, st


def record(path: Path) -> None:
    """Write `path`'s digest and identity beside it (atomically), after this process built it."""
    fd, st = _open_own_regular(path)
    try:
        digest = _sha256(fd)
    finally:
        os.close(fd)
    text = json.dumps({"sha256": digest, "size": st.st_size, "dev": st.st_dev, "ino": st.st_ino})
    side = _sidecar(path)
    tmp = side.with_name(f".{side.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, side)
    finally:
        tmp.unlink(missing_ok=True)


def verified(path: Path) -> str | None:
    """None when `path` is the very file this user's process recorded, byte for byte; else why not."""
    try:
        fd, st = _open_own_regular(_sidecar(path))
    except ValueError as e:
        return f"no digest recorded for it ({_sidecar(path).name}: {e})"
    try:
        saved = json.loads(os.read(fd, MAX_SIDECAR_BYTES))
        want = (saved["sha256"], saved["size"], saved["dev"], saved["ino"])
    except (ValueError, KeyError, TypeError, OSError):
        return f"its digest file {_sidecar(path).name} is damaged"
    finally:
        os.close(fd)
    try:
        fd, st = _open_own_regular(path)
    except ValueError as e:
        return str(e)
    try:
        if (st.st_size, st.st_dev, st.st_ino) != want[1:]:
            return "it is not the file this user's build recorded (copied or replaced)"
        if _sha256(fd) != want[0]:
            return "its sha256 differs from the one recorded when it was built"
    finally:
        os.close(fd)
    return None
