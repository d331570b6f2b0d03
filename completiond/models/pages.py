"""A runtime weights file mapped at a 2 MB boundary, then moved into 2 MB pages behind the passes.

A pass streams every weight, ~1 GB for the int4 1.5B. Mapped from the file, the weights sit in 4 KB
pages (this kernel gives ext4 files no huge pages: FilePmdMapped stays 0), so the stream needs a
new TLB entry every 4 KB, and in a VM each miss walks two page tables. In anonymous memory with
transparent huge pages the same passes cost 6-13 % less for the int4 1.5B and 3-13 % less for
the 0.5B on this 2-core Zen 5 (benchmarks.experiments huge_pages; docs/kernels.md "2 MB pages").

Reading the file into huge pages at start would delay `ready`: on this VM a fresh process's first
1.2 GB of huge pages took 4.5 s to allocate (memory the host had not backed yet), later ones 0.08 s.
So the file is mapped as before, at a 2 MB-aligned address, and `move` then copies it a chunk
at a time into huge pages and puts each chunk in place with `mremap`: the addresses (every tensor
view) stay the same, and a pass reading a chunk while it moves reads the same bytes from the old
pages or the new ones. The daemon moves them in a low-priority thread after the load, a chunk at
a time in pauses of the passes (`move_later`), so completions are not held up; benchmarks wait for
it (`settle`).

The price: the weights become private anonymous memory, resident until exit, where the mapping's
clean pages could be dropped and shared with another process holding the same model. Where Linux
does not give huge pages (another OS, transparent huge pages `[never]`, `MADV_POPULATE_WRITE`
missing before 5.14) or `COMPLETIOND_HUGE_PAGES=0`, the file stays mapped as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import mmap
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

log = logging.getLogger(__name__)

HUGE = 2 << 20
CHUNK = 4 * HUGE  # moved at a time, between passes: a completion that comes meanwhile shares the CPU for ~10-30 ms
QUIET = 0.5  # s without a pass before each chunk moves: the move keeps out of a completion's way
_POPULATE_WRITE = 23  # MADV_POPULATE_WRITE (Linux 5.14); Python's mmap module does not name it
_MREMAP_MAYMOVE, _MREMAP_FIXED, _MAP_FIXED = 1, 2, 0x10
_FAILED = ctypes.c_void_p(-1).value
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")

# by path: why a file mapped here stays in 4 KB pages, or its Mapping until move_later takes it
_why: dict[str, str] = {}
_pending: dict[str, "Mapping"] = {}
_moving: list[threading.Thread] = []
_passes = {"running": 0, "ended": 0.0}  # passes in flight (any model, any thread), and when the last one ended
_passes_lock = threading.Lock()


@contextmanager
def passing() -> Iterator[None]:
    """Around every pass (Runner.forward): moves wait until passes have stopped for QUIET s."""
    with _passes_lock:
        _passes["running"] += 1
    try:
        yield
    finally:
        with _passes_lock:
            _passes["running"] -= 1
            _passes["ended"] = time.monotonic()


def _wait_for_quiet() -> None:
    while _passes["running"] or time.monotonic() - _passes["ended"] < QUIET:
        time.sleep(0.05)


def unavailable() -> str | None:
    """Why weights cannot move into 2 MB pages in this process, or None where they can."""
    if os.environ.get("COMPLETIOND_HUGE_PAGES", "auto") in ("0", "off", "no", "false"):
        return "COMPLETIOND_HUGE_PAGES=0"
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return "no transparent huge pages on this OS"
    try:
        modes = THP.read_text()
    except OSError:
        return f"no {THP}"
    if "[never]" in modes:
        return "transparent huge pages are off ([never])"
    return None


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = libc.mremap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


def _checked(value: int | None, what: str) -> int:
    if value is None or value == _FAILED or value == -1:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return value


class Mapping:
    """`size` bytes of a file mapped privately (copy on write, as torch.from_file) at a 2 MB-aligned
    address, unmapped when the last tensor over it goes."""

    def __init__(self, path: Path, size: int):
        self.libc = _libc()
        self.path, self.size = path, size
        self.span = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
        self.addr = self._aligned(self.span, path)
        self.moved = 0  # bytes from the start now in 2 MB pages

    def _aligned(self, span: int, path: Path | None) -> int:
        """A 2 MB-aligned address of `span` bytes: path's bytes, or anonymous memory advised for huge pages."""
        libc, rw = self.libc, mmap.PROT_READ | mmap.PROT_WRITE
        room = _checked(libc.mmap(None, span + HUGE, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0), "mmap")
        at = (room + HUGE - 1) // HUGE * HUGE
        try:
            if path is None:
                _checked(libc.mmap(at, span, rw, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED, -1, 0), "mmap")
                _checked(libc.madvise(at, span, mmap.MADV_HUGEPAGE), "madvise(MADV_HUGEPAGE)")
                _checked(libc.madvise(at, span, _POPULATE_WRITE), "madvise(MADV_POPULATE_WRITE)")
            else:
                fd = os.open(path, os.O_RDONLY)
                try:
                    _checked(libc.mmap(at, span, rw, mmap.MAP_PRIVATE | _MAP_FIXED, fd, 0), f"mmap {path.name}")
                finally:
                    os.close(fd)
        except OSError:
            libc.munmap(room, span + HUGE)
            raise
        if at > room:
            libc.munmap(room, at - room)  # the room around it
        libc.munmap(at + span, room + span + HUGE - (at + span))
        return at

    def tensor(self) -> torch.Tensor:
        """The bytes as a uint8 tensor; it keeps this mapping alive."""
        view = (ctypes.c_uint8 * self.size).from_address(self.addr)
        view.owner = self  # frombuffer holds the view, the view holds the mapping
        return torch.frombuffer(view, dtype=torch.uint8)

    def move(self, between: Callable[[], None] = lambda: None, chunks: int | None = None) -> None:
        """Copy the file's whole 2 MB chunks into huge pages, CHUNK bytes at a time, each put in place
        by mremap at the same address (the last part under 2 MB stays mapped); `between` runs
        before each chunk (the daemon's move waits there for a pause in the passes); `chunks`: at
        most that many now."""
        whole = self.size // HUGE * HUGE
        while self.moved < whole and chunks != 0:
            chunks = None if chunks is None else chunks - 1
            between()
            n = min(CHUNK, whole - self.moved)
            new = self._aligned(n, None)
            try:
                ctypes.memmove(new, self.addr + self.moved, n)
                _checked(self.libc.mremap(new, n, n, _MREMAP_MAYMOVE | _MREMAP_FIXED, self.addr + self.moved), "mremap")
            except OSError:
                self.libc.munmap(new, n)
                raise
            self.moved += n

    def __del__(self) -> None:
        if getattr(self, "addr", None):
            self.libc.munmap(self.addr, self.span)


def map_file(path: Path, size: int) -> torch.Tensor | None:
    """The file's first `size` bytes as a uint8 tensor mapped at a 2 MB boundary, for move_later; None
    where the weights cannot move into huge pages (the caller maps the file; move_later says why)."""
    why = unavailable()
    if why is None:
        try:
            m = Mapping(path, size)
            _pending[str(path)] = m
            return m.tensor()
        except OSError as e:
            why = str(e)
    _why[str(path)] = why
    return None


def move_later(path: Path, meta: dict) -> str:
    """Start moving the file map_file mapped into 2 MB pages, in a thread at the lowest CPU priority
    that moves a chunk only after QUIET s without a pass (a process that is always busy, e.g. a
    one-shot `complete`, never moves), and return what holds it now; the thread sets
    meta["weights"] when done."""
    m = _pending.pop(str(path), None)
    if m is None:
        return f"mapped (4 KB pages: {_why.get(str(path), 'not mapped by pages.map_file')})"

    used = weakref.ref(m)  # the thread holds it only while a chunk moves (move_while_used)

    def run() -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # this thread only (Linux)
        except OSError:
            pass
        meta["weights"] = move_while_used(used, _wait_for_quiet)

    t = threading.Thread(target=run, name="completiond-huge-pages", daemon=True)
    _moving[:] = [*(u for u in _moving if u.is_alive()), t]
    t.start()
    return "mapped (4 KB pages, moving into 2 MB pages)"


def move_while_used(used: weakref.ref, between: Callable[[], None] = lambda: None) -> str:
    """`move`, a chunk at a time, holding the mapping only while a chunk moves: once no tensor is left
    over it (its model was released, e.g. by a daemon that switched models) the rest is not moved,
    and the mapping goes at once."""
    while True:
        between()
        m = used()
        if m is None:
            return "released before its move into 2 MB pages ended"
        if m.moved >= m.size // HUGE * HUGE:
            return move(m)  # nothing left to move: what holds it now
        try:
            m.move(chunks=1)
        except OSError:
            return move(m)  # tried once more: the failure is said (and logged) there
        del m


def move(m: Mapping, between: Callable[[], None] = lambda: None) -> str:
    """Move `m` into 2 MB pages and say what holds it; a failure keeps the rest mapped."""
    try:
        m.move(between)
        if m.moved == 0:
            return "mapped (4 KB pages: under 2 MB)"
        huge = huge_bytes(m.addr, m.moved)
        if huge < m.moved:  # MADV_POPULATE_WRITE fell back to 4 KB pages where the kernel had no 2 MB ones
            return f"moved after the load, {huge / 2**30:.2f} of {m.moved / 2**30:.2f} GiB in 2 MB pages"
        return f"2 MB pages ({m.moved / 2**30:.2f} GiB moved after the load)"
    except OSError as e:
        log.warning("the weights in %s stay in 4 KB pages from byte %d: %s", m.path.name, m.moved, e)
        return f"mapped (2 MB pages up to byte {m.moved}, then 4 KB pages: {e})"


def huge_bytes(addr: int, size: int) -> int:
    """Bytes in huge pages among this process's mappings within [addr, addr + size) (/proc/self/smaps)."""
    total, inside = 0, False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(" ", 1)[0]
                if "-" in head:  # a mapping's first line: "lo-hi perms ...", its fields follow
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    inside = addr <= lo and hi <= addr + size
                elif inside and line.startswith("AnonHugePages:"):
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return size  # cannot tell: say what was asked for
    return total


def settle(timeout: float | None = None) -> None:
    """Wait for the moves move_later started (benchmarks time passes after them)."""
    for t in list(_moving):
        t.join(timeout)
