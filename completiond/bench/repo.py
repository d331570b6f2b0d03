"""Benchmark inputs: a repository (a directory or a PyPI sdist), cursor positions sampled in it, and
the scores of a completion against the real code.

Positions follow repository-level completion benchmarks: code lines only (no blank, comment or
docstring lines), the cursor at the line's start (after its indentation) or mid-line, the rest of
that line is the reference. The document the engine sees has that rest removed (what follows the
target line stays: the user is inserting a line), and the other files of the repository form the
workspace index.
"""

from __future__ import annotations

import io
import random
import subprocess
import sys
import tarfile
import tempfile
import tokenize
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..paths import cache_root
from ..service.workspace import iter_files, read_text_file

SOURCE_SUFFIXES = {".py"}


def resolve_repo(spec: str) -> tuple[Path, str]:
    """A directory, or `pypi:NAME==VERSION` downloaded with pip and unpacked into the cache."""
    if not spec.startswith("pypi:"):
        root = Path(spec).expanduser().resolve()
        if not root.is_dir():
            raise ValueError(f"--repo {spec}: not a directory")
        return root, str(root)
    req = spec[5:]
    if "==" not in req:
        raise ValueError(f"--repo {spec}: pin a version, e.g. pypi:toolz==1.0.0")
    dest = cache_root() / "bench-repos" / req.replace("==", "-")
    if not dest.is_dir():
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q", "-d", tmp, req]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise ValueError(f"pip could not download {req}: {done.stderr.strip().splitlines()[-1:]}")
            archive = next(Path(tmp).iterdir())
            part = dest.with_name(dest.name + ".partial")
            _unpack(archive, part)
            inner = list(part.iterdir())
            (inner[0] if len(inner) == 1 and inner[0].is_dir() else part).rename(dest)
    return dest, spec


def _unpack(archive: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    if archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as z:
            z.extractall(dest)
    else:
        with tarfile.open(archive) as t:
            t.extractall(dest, filter="data")


def source_files(root: Path) -> list[Path]:
    return [p for p in iter_files(root) if p.suffix in SOURCE_SUFFIXES and read_text_file(p) is not None]


@dataclass
class Cursor:
    file: Path
    line: int  # 0-based
    col: int  # cursor column (characters)
    kind: str  # "line-start" | "mid-line"
    reference: str  # the rest of the line after the cursor

    def document(self, text: str) -> tuple[str, int]:
        """The document with the reference removed, and the cursor offset in it."""
        lines = text.splitlines(keepends=True)
        start = sum(len(x) for x in lines[: self.line])
        cursor = start + self.col
        end = start + len(lines[self.line].rstrip("\r\n"))
        return text[:cursor] + text[end:], cursor


def code_lines(text: str) -> list[int]:
    """0-based lines holding code: not blank, not comments, not inside docstrings / strings."""
    skip: set[int] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
                skip.update(range(tok.start[0] - 1, tok.end[0]))
            elif tok.type == tokenize.COMMENT and not tok.line[: tok.start[1]].strip():
                skip.add(tok.start[0] - 1)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    out = []
    for i, line in enumerate(text.splitlines()):
        s = line.strip()
        if s and i not in skip and not s.startswith("#") and len(s) >= 4 and i >= 5:
            out.append(i)
    return out


def sample_positions(root: Path, n: int, cursor: str = "both", seed: int = 0, min_line: int = 0) -> list[Cursor]:
    """`n` cursors on code lines (0-based line `min_line` or later) of the repository's files."""
    rng = random.Random(seed)
    candidates: list[tuple[Path, int, str]] = []
    texts: dict[Path, str] = {}
    for f in source_files(root):
        texts[f] = read_text_file(f) or ""
        candidates += [(f, i, texts[f].splitlines()[i]) for i in code_lines(texts[f]) if i >= min_line]
    rng.shuffle(candidates)
    kinds = ["line-start", "mid-line"] if cursor == "both" else [cursor]
    out: list[Cursor] = []
    for f, i, line in candidates:
        kind = kinds[len(out) % len(kinds)]
        indent = len(line) - len(line.lstrip())
        if kind == "line-start":
            col = indent
        else:
            cuts = [j for j in range(indent + 1, len(line) - 2) if line[j - 1].isalnum() != line[j].isalnum()
                    or line[j - 1] in " .(,[=:"]
            if not cuts:
                continue
            col = rng.choice(cuts)
        ref = line[col:].rstrip()
        if len(ref) < 3:
            continue
        out.append(Cursor(f, i, col, kind, ref))
        if len(out) >= n:
            break
    return out


def first_line(text: str) -> str:
    return text.split("\n", 1)[0].rstrip()


def score(text: str, reference: str) -> dict:
    """One completion against the line it replaces: `exact` (its first line is that line), `exact_middle`
    (the whole completion is, no extra lines), `similarity` (edit similarity of the first line)."""
    line = first_line(text)
    return dict(exact=line == reference, exact_middle=text.rstrip() == reference,
                similarity=edit_similarity(line, reference))


def mean_scores(rows: list[dict]) -> dict:
    """`score` rows averaged: exact_line, exact_middle, edit_similarity."""
    n = len(rows)
    return dict(exact_line=round(sum(r["exact"] for r in rows) / n, 3),
                exact_middle=round(sum(r["exact_middle"] for r in rows) / n, 3),
                edit_similarity=round(sum(r["similarity"] for r in rows) / n, 3))


def edit_similarity(a: str, b: str) -> float:
    """1 - Levenshtein distance / longer length (1.0 for identical strings)."""
    if a == b:
        return 1.0
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return 1.0 - prev[-1] / max(len(a), len(b))
