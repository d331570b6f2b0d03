"""Repository context for a completion: which other files the model sees before the current one.

Other open buffers come first (what the user works on now, most recently edited first), then
workspace files that the current file imports (by module name). The order depends only on those
files, not on the cursor, so the prompt's head, and with it the reusable KV cache, stays put
while the user types in the current file.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from ...files import read_regular
from . import ContextFile

IMPORT = re.compile(r"^\s*(?:from\s+([.\w]+)\s+import|import\s+([.\w]+))", re.M)
MAX_FILES = 4
MAX_CHARS = 8000  # per file, before the token budget cuts it further


def imported_modules(text: str, path: str = "") -> list[str]:
    """Dotted module names the text imports (Python), in order of appearance, without duplicates;
    relative imports (`from .util import x` in pkg/main.py) resolved against `path` (pkg.util)."""
    package = list(PurePosixPath(path).parent.parts) if path else []
    seen: list[str] = []
    for m in IMPORT.finditer(text[:200_000]):
        name = m.group(1) or m.group(2)
        level = len(name) - len(name.lstrip("."))
        if level:
            if level - 1 > len(package) or not name[level:]:
                continue  # beyond the workspace, or `from . import x` (x may be any name)
            name = ".".join(package[: len(package) - (level - 1)] + [name[level:]])
        if name and name not in seen:
            seen.append(name)
    return seen


def module_paths(workspace: Iterable[tuple[str, Path]]) -> dict[str, tuple[str, Path]]:
    """Dotted module name -> (relative path, absolute path) of the workspace's Python files.

    A file is known by its path from the workspace root (pkg/sub/mod.py: pkg.sub.mod) and from any
    folder above it that is not a package (src/pkg/mod.py: pkg.mod too), never by a tail inside a
    package: `import operator` must not find pkg/curried/operator.py."""
    files = [(PurePosixPath(rel), rel, abs_path) for rel, abs_path in workspace]
    packages = {p.parent for p, _, _ in files if p.name == "__init__.py"}
    out: dict[str, tuple[str, Path]] = {}
    for p, rel, abs_path in files:
        if p.suffix != ".py":
            continue
        parts = p.with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        for k in range(len(parts)):
            if k == 0 or PurePosixPath(*p.parts[:k]) not in packages:
                out.setdefault(".".join(parts[k:]), (rel, abs_path))
    return out


def related_files(path: str, text: str, open_buffers: Iterable[tuple[str, str]],
                  workspace: Iterable[tuple[str, Path]] = ()) -> list[ContextFile]:
    """Up to MAX_FILES context files for the file at `path` (a repository-relative path).

    open_buffers: (relative path, text) of the other open documents, most recent first;
    workspace: (relative path, absolute path) of indexed workspace files.
    """
    out: list[ContextFile] = []
    taken = {path}
    for rel, body in open_buffers:
        if rel not in taken and len(out) < MAX_FILES:
            out.append(ContextFile(rel, body[:MAX_CHARS]))
            taken.add(rel)
    if len(out) >= MAX_FILES:
        return out
    wanted = imported_modules(text, path)
    if not wanted:
        return out
    by_module = module_paths(workspace)
    for name in wanted:
        hit = by_module.get(name)
        if hit and hit[0] not in taken and len(out) < MAX_FILES:
            # not a FIFO swapped in since it was indexed: reading one would block the engine thread
            data = read_regular(hit[1], 4 * MAX_CHARS, head=True)
            if data is None:
                continue
            body = data.decode("utf-8", errors="replace")[:MAX_CHARS]
            out.append(ContextFile(hit[0], body))
            taken.add(hit[0])
    return out


def locate(uri: str, roots: Iterable[Path]) -> tuple[str, str]:
    """(path shown to the model, repository name) for a document: relative to the workspace root
    that holds it, else its file name under its directory's name."""
    from urllib.parse import unquote, urlparse

    parsed = urlparse(uri)
    path = Path(unquote(parsed.path)) if parsed.scheme == "file" else Path(parsed.path or uri)
    for root in roots:
        if path.is_relative_to(root):
            return path.relative_to(root).as_posix(), root.name
    return path.name, path.parent.name or "workspace"
