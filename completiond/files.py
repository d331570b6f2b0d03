"""Reading files completiond did not write (a workspace's sources and .gitignore) without hanging or
wandering: only regular files, size-capped, never through a FIFO, device or socket (a FIFO blocks
its reader forever), and, given a root, only files that lie inside it once symlinks are resolved.
Torch-free; used by the workspace indexer (service/) and the repository context (core/), and for
the daemon's token files (read_secret: the same rules plus owner and mode), and cache stamps
written atomically (write_atomic).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def read_regular(path: Path, max_bytes: int, root: Path | None = None, head: bool = False) -> bytes | None:
    """The bytes of `path`, or None where it is not a regular file of at most max_bytes (or not
    readable, or, given `root` (resolved), its real path is outside root). head: a longer file
    gives its first max_bytes instead of None.

    Without a root a symlink is not followed at all; with one, one that stays inside root is. The
    file is opened O_NONBLOCK (opening a FIFO does not wait for a writer) and checked with fstat
    before the first read, so a file swapped for a FIFO after a stat still cannot block."""
    try:
        if root is not None:
            real = Path(os.path.realpath(path))
            if not real.is_relative_to(root):
                return None
            path = real
        if not stat.S_ISREG(os.lstat(path).st_mode):  # not even opened: a device's open may act
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):  # gone, unreadable, a symlink (ELOOP), a NUL in the name
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes and not head:
            return None
        chunks, n = [], 0
        while n <= max_bytes and (chunk := os.read(fd, min(1 << 20, max_bytes + 1 - n))):
            chunks.append(chunk)
            n += len(chunk)
        data = b"".join(chunks)
        if n > max_bytes:  # longer than the cap (or grew past it while read)
            return data[:max_bytes] if head else None
        return data
    except OSError:
        return None
    finally:
        os.close(fd)


MAX_SECRET_BYTES = 4096  # a token file: a token is tens of bytes


def read_secret(path: Path, what: str, max_bytes: int = MAX_SECRET_BYTES) -> str:
    """The stripped text of a token file, read as the workspace's files are (no symlink followed,
    opened O_NONBLOCK so a FIFO cannot hang the caller, fstat before any read, at most max_bytes),
    and only if this user owns it and nobody else may read or write it (mode 0600 or tighter).
    ValueError with one line saying why not; FileNotFoundError when it does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as e:  # ELOOP: a symlink; EACCES; a NUL in the name is a ValueError of its own
        raise ValueError(f"{what} {path}: {e.strerror} (a regular file of ours is needed)") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{what} {path} is not a regular file")
        if st.st_uid != os.getuid():
            raise ValueError(f"{what} {path} belongs to another user (uid {st.st_uid}); refusing it")
        if st.st_mode & 0o077:
            raise ValueError(f"{what} {path} is readable or writable by others (mode "
                             f"{stat.S_IMODE(st.st_mode):o}); run `chmod 600 {path}`")
        if st.st_size > max_bytes:
            raise ValueError(f"{what} {path} is {st.st_size} bytes: a token file holds at most {max_bytes}")
        data = os.read(fd, max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise ValueError(f"{what} {path} is over {max_bytes} bytes")
    try:
        token = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ValueError(f"{what} {path} is not UTF-8 text") from None
    if not token:
        raise ValueError(f"{what} {path} is empty")
    return token


def write_atomic(path: Path, text: str) -> None:
    """Write `path` through a temp file beside it and a rename: a reader sees the old text or the
    new, never half; a symlink or hard link at `path` is replaced, not written through."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
