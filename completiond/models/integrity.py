"""Digests of derived cache files, checked only when a file's stat stamp changes (torch-free).

Every file a conversion writes gets its sha256 recorded with it in the folder's `digests.json`,
with the stamp (size, mtime, inode, ctime) it had then. A normal start only stats the files: a
stamp that still matches means the file has not been written since it was hashed. A changed stamp
(a copy, a restore, a write, a truncation) makes it hash the file again: the same digest re-stamps
it, another one marks it damaged and the caller rebuilds it. ctime is in the stamp because it
cannot be set back by `touch`: a file written in place with its old mtime restored is still caught.

Work in progress lives in `<name>.<pid>-<start>.<random>.partial` next to its destination; a
partial whose process is gone (pid not running, or running but started at another time: a reused
pid) is removed by the next process that looks.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

MANIFEST = "digests.json"
FORMAT = 1


def stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def read_manifest(folder: Path) -> dict[str, dict]:
    """{file name: {"sha256", "stamp"}}; empty when missing or unreadable (every file then counts as unrecorded)."""
    try:
        got = json.loads((folder / MANIFEST).read_text())
        return dict(got["files"]) if got.get("format") == FORMAT else {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def write_manifest(folder: Path, files: dict[str, dict]) -> None:
    """Atomically (temp file + rename); an unwritable folder only means hashing again next time."""
    tmp = folder / f".{MANIFEST}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps({"format": FORMAT, "files": files}, indent=1, sort_keys=True))
        os.replace(tmp, folder / MANIFEST)
    except OSError:
        tmp.unlink(missing_ok=True)


def record(folder: Path, digests: dict[str, str]) -> None:
    """Record these files' digests (computed as they were written) with their current stamps."""
    files = read_manifest(folder)
    for name, sha in digests.items():
        files[name] = {"sha256": sha, "stamp": stamp(folder / name)}
    write_manifest(folder, files)


def unchanged(folder: Path, names: list[str]) -> bool:
    """Every file recorded and its stamp as recorded: a normal start's check (stat only, no hashing,
    no writing, no lock)."""
    files = read_manifest(folder)
    try:
        return all(isinstance(files.get(n), dict) and files[n].get("stamp") == stamp(folder / n) for n in names)
    except OSError:
        return False


def check(folder: Path, names: list[str]) -> dict[str, str]:
    """The files among `names` that cannot be trusted, with why ("missing", "unrecorded",
    "damaged"); {} when all are intact. Hashes only files whose stamp changed, and re-stamps the
    ones that still match their digest."""
    files = read_manifest(folder)
    bad: dict[str, str] = {}
    restamped = False
    for name in names:
        path = folder / name
        entry = files.get(name)
        try:
            now = stamp(path)
        except OSError:
            bad[name] = "missing"
            continue
        if not isinstance(entry, dict) or "sha256" not in entry:
            bad[name] = "unrecorded"
        elif entry.get("stamp") != now:
            try:
                same = sha256_file(path) == entry["sha256"]
            except OSError:
                same = False
            if same:
                entry["stamp"] = now
                restamped = True
            else:
                bad[name] = "damaged"
    if restamped:
        write_manifest(folder, files)
    return bad


def partial_name(name: str) -> str:
    """A unique work-in-progress name for `name` that records this process (pid and start time)."""
    return f"{name}.{os.getpid()}-{_start_time(os.getpid())}.{os.urandom(4).hex()}.partial"


def make_partial_dir(parent: Path, name: str) -> Path:
    parent.mkdir(parents=True, exist_ok=True)
    path = parent / partial_name(name)
    path.mkdir(mode=0o700)
    return path


def make_partial_file(parent: Path, name: str) -> tuple[int, str]:
    """(fd, path) of a new partial file, like tempfile.mkstemp but named by partial_name."""
    parent.mkdir(parents=True, exist_ok=True)
    path = parent / partial_name(name)
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600), str(path)


def remove_stale_partials(parent: Path, name: str, locked: bool = False) -> list[Path]:
    """Remove `name`'s partials whose process is gone. `locked`: the caller holds the lock every
    writer of `name` takes, so partials in the old unnamed form (no pid) are stale too. Returns
    what it removed."""
    removed = []
    try:
        candidates = list(parent.glob(f"{name}.*.partial"))
    except OSError:
        return removed
    for p in candidates:
        owner = p.name[len(name) + 1:-len(".partial")].split(".")[0]
        pid, _, start = owner.partition("-")
        alive = pid.isdigit() and start.isdigit() and _start_time(int(pid)) == int(start)
        if alive or (not locked and not (pid.isdigit() and start.isdigit())):
            continue
        try:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
            removed.append(p)
        except OSError:
            pass
    return removed


def _start_time(pid: int) -> int:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22); -1 when it
    does not run (or there is no /proc: then partials are only removed under the lock)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return -1



def forget(folder: Path, names: list[str]) -> None:
    """Drop these files' records: the next check calls them unrecorded and they are rebuilt."""
    files = read_manifest(folder)
    if any(files.pop(n, None) is not None for n in list(names)):
        write_manifest(folder, files)
