"""Workspace files for prompt lookup: which files count, reading them safely, keeping the index fresh.

Skipped: .git and other VCS dirs, virtualenvs, node_modules and build caches, anything .gitignore
matches, binary files (a NUL byte or not UTF-8) and files over the size cap. `WorkspaceWatcher`
(watchdog) applies create / modify / delete / move events; index rebuilds run on its thread, never on
a request.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pathspec

from .index import TokenIndex

log = logging.getLogger(__name__)

SKIP_DIRS = {".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", "venv", "env", ".tox", ".nox",
             ".mypy_cache", ".pytest_cache", ".ruff_cache", ".idea", ".vscode", "build", "dist", ".eggs",
             "site-packages", ".cache"}
MAX_FILE_BYTES = 512 * 1024
MAX_FILES = 5000


def read_text_file(path: Path, max_bytes: int = MAX_FILE_BYTES) -> str | None:
    """The file's text, or None for binary, non-UTF-8, oversized or unreadable files."""
    try:
        if not path.is_file() or path.stat().st_size > max_bytes:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


class Ignore:
    """.gitignore rules of a root (top-level file and nested ones), plus the fixed skip list."""

    def __init__(self, root: Path):
        self.root = root
        self.specs: list[tuple[Path, pathspec.PathSpec]] = []
        for gi in [root / ".gitignore"] + sorted(p for p in root.rglob(".gitignore") if p.parent != root
                                                  and not (SKIP_DIRS & set(p.relative_to(root).parts))):
            try:
                lines = gi.read_text(errors="replace").splitlines()
            except OSError:
                continue
            self.specs.append((gi.parent, pathspec.PathSpec.from_lines("gitwildmatch", lines)))

    def skip(self, path: Path, is_dir: bool = False) -> bool:
        try:
            rel = path.relative_to(self.root)
        except ValueError:
            return True
        if SKIP_DIRS & set(rel.parts) or any(p.endswith(".egg-info") for p in rel.parts):
            return True
        for base, spec in self.specs:
            try:
                sub = path.relative_to(base).as_posix()
            except ValueError:
                continue
            if spec.match_file(sub + ("/" if is_dir else "")):
                return True
        return False


def iter_files(root: Path, ignore: Ignore | None = None, max_files: int = MAX_FILES) -> Iterator[Path]:
    ignore = ignore or Ignore(root)
    n = 0
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        dirnames[:] = sorted(x for x in dirnames if not ignore.skip(d / x, is_dir=True))
        for name in sorted(filenames):
            p = d / name
            if ignore.skip(p) or p.is_symlink():
                continue
            yield p
            n += 1
            if n >= max_files:
                return


def index_file(index: TokenIndex, tokenizer, path: Path) -> bool:
    text = read_text_file(path)
    if text is None:
        index.remove_file(str(path))
        return False
    index.set_file(str(path), tokenizer.encode(text, add_special_tokens=False))
    return True


def index_workspace(index: TokenIndex, tokenizer, root: Path, exclude: set[Path] | None = None) -> int:
    """Tokenize every eligible file under root into the index; returns how many were indexed."""
    n = 0
    for p in iter_files(root.resolve()):
        if exclude and p.resolve() in exclude:
            continue
        n += index_file(index, tokenizer, p)
    index.rebuild()
    return n


class WorkspaceWatcher:
    """Indexes roots, then follows file events with watchdog; rebuilds the merged index on its own thread."""

    def __init__(self, index: TokenIndex, tokenizer, debounce_s: float = 0.2):
        from watchdog.observers import Observer

        self.index, self.tokenizer, self.debounce_s = index, tokenizer, debounce_s
        self.observer = Observer()
        self.observer.daemon = True
        self.roots: dict[Path, Ignore] = {}
        self._pending: dict[str, bool] = {}  # path -> exists
        self._cv = threading.Condition()
        self._stop = False
        self._busy = False
        self._thread = threading.Thread(target=self._worker, name="workspace-index", daemon=True)
        self._thread.start()
        self.observer.start()

    def add_root(self, root: Path) -> None:
        root = root.resolve()
        if root in self.roots or not root.is_dir():
            return
        from watchdog.events import FileSystemEventHandler

        watcher = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event):
                if event.event_type in ("opened", "closed", "closed_no_write"):
                    return
                for path in (event.src_path, getattr(event, "dest_path", "")):
                    if path:
                        watcher._queue(Path(os.fsdecode(path)), root)

        self.roots[root] = Ignore(root)
        self.observer.schedule(Handler(), str(root), recursive=True)
        with self._cv:
            for p in iter_files(root, self.roots[root]):
                self._pending[str(p)] = True
            self._cv.notify()

    def _queue(self, path: Path, root: Path) -> None:
        if path.name == ".gitignore":
            self.roots[root] = Ignore(root)
        if self.roots[root].skip(path) and str(path) not in self.index.files:
            return
        with self._cv:
            self._pending[str(path)] = True
            self._cv.notify()

    def _worker(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
            # let a burst of events settle, then take them all
            threading.Event().wait(self.debounce_s)
            with self._cv:
                batch, self._pending = self._pending, {}
                self._busy = True
            for path in batch:
                p = Path(path)
                root = next((r for r in self.roots if p.is_relative_to(r)), None)
                try:
                    if root is None or self.roots[root].skip(p) or not p.is_file():
                        self.index.remove_file(path)
                    else:
                        index_file(self.index, self.tokenizer, p)
                except Exception:  # a file that vanishes or breaks mid-read must not stop the watcher
                    log.exception("indexing %s failed", path)
            self.index.rebuild()
            with self._cv:
                self._busy = False

    @property
    def idle(self) -> bool:
        with self._cv:
            return not self._pending and not self._busy

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self.observer.stop()
