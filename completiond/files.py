"""Reading files completiond did not write (a workspace's sources and .gitignore) without hanging or
wandering: only regular files, size-capped, never through a FIFO, device or socket (a FIFO blocks
its reader forever), and, given a root, only files that lie inside it once symlinks are resolved.
Torch-free; used by the workspace indexer (service/) and the repository context (core/).
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
