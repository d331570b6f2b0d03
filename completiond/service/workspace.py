"""Workspace files for prompt lookup: which files count, reading them safely, keeping the index fresh.

Skipped: .git and other VCS dirs, virtualenvs (named ones and any dir holding a `pyvenv.cfg`),
node_modules, build caches, anything .gitignore matches, binary files (a NUL byte or not UTF-8) and
files over the size cap. Every file read (sources and .gitignore) is a regular file inside its root,
size-capped, opened so that a FIFO, device or socket can never block the reader (files.read_regular);
a .gitignore symlinked out of the root is not read. A root indexes at most `max_files` files /
`max_bytes` bytes and watches at most `max_dirs` directories; what is left out is said in
`WorkspaceWatcher.capped`.

`WorkspaceWatcher` (watchdog) puts one non-recursive watch on each included directory, so an excluded
tree (a virtualenv, node_modules) costs no inotify watch and sends no events. Structural changes
(a directory created, moved or deleted, a .gitignore or pyvenv.cfg changed) re-walk the root; file
events re-index that file. All of it runs on the watcher's thread, never on a request.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pathspec

from ..core.speculation.index import TokenIndex
from ..files import read_regular

log = logging.getLogger(__name__)

SKIP_DIRS = {".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", "venv", "env", ".tox", ".nox",
             ".mypy_cache", ".pytest_cache", ".ruff_cache", ".idea", ".vscode", "build", "dist", ".eggs",
             "site-packages", ".cache"}
MAX_FILE_BYTES = 512 * 1024
MAX_GITIGNORE_BYTES = 256 * 1024
MAX_FILES = 5000  # per root
MAX_ROOT_BYTES = 32 * 1024 * 1024  # per root: tokenizing more would hold start-up for minutes
MAX_DIRS = 1000  # watched directories per root: each is one inotify watch and one watchdog thread
STRUCTURE_FILES = {".gitignore", "pyvenv.cfg"}  # a change to one of these re-walks the root


def read_text_file(path: Path, max_bytes: int = MAX_FILE_BYTES, root: Path | None = None) -> str | None:
    """The file's text, or None for binary, non-UTF-8, oversized or unreadable files, and for
    anything but a regular file (a FIFO would block the reader forever) or, given `root`
    (resolved), a file whose real path is outside it (files.read_regular)."""
    data = read_regular(path, max_bytes, root)
    if data is None:
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


class Ignore:
    """The fixed skip list plus .gitignore rules of a root: its own file now, nested ones as `walk` finds them."""

    def __init__(self, root: Path):
        self.root = root
        self.real_root = root.resolve()
        self.specs: dict[Path, pathspec.GitIgnoreSpec] = {}
        self.load(root / ".gitignore")

    def load(self, gitignore: Path) -> None:
        """Read a .gitignore: a regular file inside the root (a symlink out of it, a FIFO, one over
        MAX_GITIGNORE_BYTES count as no .gitignore); never blocks."""
        data = read_regular(gitignore, MAX_GITIGNORE_BYTES, self.real_root)
        if data is None:
            if os.path.lexists(gitignore):
                log.info("not reading %s (not a regular file inside the root, or over %d bytes)", gitignore,
                         MAX_GITIGNORE_BYTES)
            self.specs.pop(gitignore.parent, None)
            return
        self.specs[gitignore.parent] = pathspec.GitIgnoreSpec.from_lines(data.decode(errors="replace").splitlines())

    def skip(self, path: Path, is_dir: bool = False) -> bool:
        try:
            rel = path.relative_to(self.root)
        except ValueError:
            return True
        if SKIP_DIRS & set(rel.parts) or any(p.endswith(".egg-info") for p in rel.parts):
            return True
        for base, spec in self.specs.items():
            try:
                sub = path.relative_to(base).as_posix()
            except ValueError:
                continue
            if sub != "." and spec.match_file(sub + ("/" if is_dir else "")):
                return True
        return False

    def skip_dir(self, path: Path) -> bool:
        return self.skip(path, is_dir=True) or (path / "pyvenv.cfg").is_file()


def walk(root: Path, ignore: Ignore) -> Iterator[tuple[Path, list[Path]]]:
    """Included directories, depth-first in name order, each with its eligible files (no symlinks).

    Excluded directories are never entered; a nested .gitignore is loaded before its subtree is walked.
    """
    stack = [root]
    while stack:
        d = stack.pop()
        if d != root:
            ignore.load(d / ".gitignore")
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError:
            continue
        files, subdirs = [], []
        for e in entries:
            p = Path(e.path)
            try:
                if e.is_symlink():
                    continue
                if e.is_dir():
                    if not ignore.skip_dir(p):
                        subdirs.append(p)
                elif e.is_file() and not ignore.skip(p):
                    files.append(p)
            except OSError:  # vanished while we looked
                continue
        yield d, files
        stack.extend(reversed(subdirs))


def iter_files(root: Path, ignore: Ignore | None = None, max_files: int = MAX_FILES) -> Iterator[Path]:
    n = 0
    for _, files in walk(root, ignore or Ignore(root)):
        for p in files:
            if n >= max_files:
                return
            yield p
            n += 1


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def index_file(index: TokenIndex, tokenizer, path: Path, root: Path | None = None) -> bool:
    text = read_text_file(path, root=root)
    if text is None:
        index.remove_file(str(path))
        return False
    index.set_file(str(path), tokenizer.encode(text, add_special_tokens=False))
    return True


def index_workspace(index: TokenIndex, tokenizer, root: Path, exclude: set[Path] | None = None,
                    max_files: int = MAX_FILES, max_bytes: int = MAX_ROOT_BYTES) -> int:
    """Tokenize eligible files under root into the index, up to the caps; returns how many were indexed.
    As the watcher does: a file over MAX_FILE_BYTES is skipped before it counts against max_bytes (one
    huge file must not spend the budget of the rest), and only indexed files count."""
    n = total = 0
    root = root.resolve()
    for p in iter_files(root, max_files=max_files):
        if exclude and p.resolve() in exclude:
            continue
        size = _size(p)
        if size > MAX_FILE_BYTES or total + size > max_bytes:
            continue
        if index_file(index, tokenizer, p, root):
            n += 1
            total += size
    index.rebuild()
    return n


class WorkspaceWatcher:
    """Indexes roots, then follows file events with watchdog; rebuilds the merged index on its own thread.

    Per root, readable from any thread: `watched[root]` (directories with a watch), `indexed[root]`
    (path -> bytes of indexed files) and `capped[root]` (why some files or directories were left out;
    absent when nothing was).
    """

    def __init__(self, index: TokenIndex, tokenizer, debounce_s: float = 0.2, max_files: int = MAX_FILES,
                 max_bytes: int = MAX_ROOT_BYTES, max_dirs: int = MAX_DIRS):
        from watchdog.observers import Observer

        self.index, self.tokenizer, self.debounce_s = index, tokenizer, debounce_s
        self.max_files, self.max_bytes, self.max_dirs = max_files, max_bytes, max_dirs
        self.observer = Observer()
        self.observer.daemon = True
        self.roots: dict[Path, Ignore] = {}
        self.watched: dict[Path, dict[Path, object]] = {}  # root -> dir -> watchdog ObservedWatch
        self.indexed: dict[Path, dict[str, int]] = {}
        self.capped: dict[Path, str] = {}
        self._left_out: dict[Path, set[str]] = {}  # files over the cap
        self._dirs_over: dict[Path, bool] = {}
        self._handlers: dict[Path, object] = {}
        self._pending: dict[str, bool] = {}  # file paths to re-read
        self._dirty: set[Path] = set()  # roots to re-walk
        self._cv = threading.Condition()
        self._stop = False
        self._busy = False
        self._thread = threading.Thread(target=self._worker, name="workspace-index", daemon=True)
        self._thread.start()
        self.observer.start()

    def set_tokenizer(self, tokenizer) -> None:
        """Indexing starts once the tokenizer is known (a daemon's roots arrive while models load)."""
        with self._cv:
            self.tokenizer = tokenizer
            self._cv.notify()

    def add_root(self, root: Path) -> None:
        """Start indexing and watching root; returns at once (the walk runs on the watcher's thread)."""
        root = root.resolve()
        if root in self.roots or not root.is_dir():
            return
        self.roots[root] = Ignore(root)
        self.watched[root], self.indexed[root], self._left_out[root] = {}, {}, set()
        self._handlers[root] = self._handler(root)  # one handler serves every watch of the root
        self._mark(root)

    def status(self) -> dict[str, dict]:
        """Per root: indexed files and bytes, watched directories, and the cap message if one applied."""
        out = {}
        for r in list(self.roots):
            indexed = self.indexed[r].copy()  # the worker thread edits it
            out[str(r)] = {"files": len(indexed), "bytes": sum(indexed.values()),
                           "watched_dirs": len(self.watched[r]), "capped": self.capped.get(r)}
        return out

    def _handler(self, root: Path):
        from watchdog.events import FileSystemEventHandler

        watcher = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event) -> None:
                if event.event_type in ("opened", "closed", "closed_no_write"):
                    return
                if event.is_directory:
                    if event.event_type != "modified":  # a dir appeared, moved or went: re-walk
                        watcher._mark(root)
                    return
                for path in (event.src_path, getattr(event, "dest_path", "")):
                    if not path:
                        continue
                    p = Path(os.fsdecode(path))
                    if p.name in STRUCTURE_FILES:
                        watcher._mark(root)
                    watcher._queue(p)

        return Handler()

    def _mark(self, root: Path) -> None:
        with self._cv:
            self._dirty.add(root)
            self._cv.notify()

    def _queue(self, path: Path) -> None:
        with self._cv:
            self._pending[str(path)] = True
            self._cv.notify()

    def _root_of(self, path: Path) -> Path | None:
        return next((r for r in self.roots if path.is_relative_to(r)), None)

    def _update_capped(self, root: Path) -> None:
        parts = []
        if self._left_out[root]:
            parts.append(f"{len(self._left_out[root])} files not indexed (cap: {self.max_files} files, "
                         f"{self.max_bytes} bytes per root)")
        if self._dirs_over.get(root):
            parts.append(f"directories past the first {self.max_dirs} not watched or indexed")
        if parts:
            if root not in self.capped:
                log.warning("workspace %s over its cap: %s", root, "; ".join(parts))
            self.capped[root] = "; ".join(parts)
        else:
            self.capped.pop(root, None)

    def _sync(self, root: Path) -> None:
        """Re-walk root: watch exactly its included directories, index the in-cap prefix of its files."""
        ignore = Ignore(root)
        dirs: list[Path] = []
        files: list[Path] = []
        dirs_over = False
        for d, fs in walk(root, ignore):
            if len(dirs) >= self.max_dirs:
                dirs_over = True
                break
            dirs.append(d)
            files.extend(fs)
        self.roots[root] = ignore
        watched = self.watched[root]
        for d in [d for d in watched if d not in set(dirs)]:
            try:
                self.observer.unschedule(watched.pop(d))
            except (KeyError, OSError):  # its emitter already ended with the directory
                pass
        for d in dirs:
            if d not in watched:
                try:
                    watched[d] = self.observer.schedule(self._handlers[root], str(d), recursive=False)
                except OSError as e:  # gone or unreadable since the walk
                    log.debug("cannot watch %s: %s", d, e)
        old, new = self.indexed[root], {}
        total, over = 0, set()
        for p in files:
            key = str(p)
            size = _size(p)
            if size > MAX_FILE_BYTES:
                continue
            if len(new) >= self.max_files or total + size > self.max_bytes:
                over.add(str(p))
                continue
            if key in old or index_file(self.index, self.tokenizer, p, root):
                new[key] = size
                total += size
        for key in old.keys() - new.keys():
            self.index.remove_file(key)
        self.indexed[root], self._left_out[root], self._dirs_over[root] = new, over, dirs_over
        self._update_capped(root)

    def _apply(self, path: str) -> None:
        """Re-read one file after an event: indexed if still eligible and within its root's cap."""
        p = Path(path)
        root = self._root_of(p)
        indexed = self.indexed.get(root, {}) if root else {}
        eligible = (root is not None and p.parent in self.watched[root] and not self.roots[root].skip(p)
                    and p.is_file() and not p.is_symlink())
        size = _size(p) if eligible else 0
        if eligible and path not in indexed and size <= MAX_FILE_BYTES:
            if len(indexed) >= self.max_files or sum(indexed.values()) + size > self.max_bytes:
                self._left_out[root].add(path)
                eligible = False
        if eligible and index_file(self.index, self.tokenizer, p, root):
            indexed[path] = size
        else:
            self.index.remove_file(path)
            indexed.pop(path, None)
            if root is not None and not p.exists():
                self._left_out[root].discard(path)
        if root is not None:
            self._update_capped(root)

    def _worker(self) -> None:
        while True:
            with self._cv:
                while (self.tokenizer is None or not self._pending and not self._dirty) and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
            # let a burst of events settle, then take them all
            threading.Event().wait(self.debounce_s)
            with self._cv:
                batch, self._pending = self._pending, {}
                dirty, self._dirty = self._dirty, set()
                self._busy = True
            for root in dirty:
                try:
                    self._sync(root)
                except Exception:  # a tree that changes under the walk must not stop the watcher
                    log.exception("walking %s failed", root)
            for path in batch:
                try:
                    self._apply(path)
                except Exception:  # a file that vanishes or breaks mid-read must not stop the watcher
                    log.exception("indexing %s failed", path)
            self.index.rebuild()
            with self._cv:
                self._busy = False

    @property
    def idle(self) -> bool:
        with self._cv:
            return not self._pending and not self._dirty and not self._busy

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self.observer.stop()
