"""Token index for prompt lookup: where does the current suffix of tokens occur, and what follows?

Each document (an open buffer or a workspace file) is held as an int32 token array plus a sorted
array of its n-gram keys (NGRAM tokens packed into one int64), so finding every occurrence of the
context's last n-gram is a binary search. Workspace files are merged into one frozen segment that
is rebuilt off the request path; open buffers are small segments of their own, replaced on edit.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

NGRAM = 3
BITS = 20  # bits per token in a key: ids must stay below 2**20 (the default target has 2**18)
CUT_EVERY = 8  # an open buffer is tokenized in pieces cut after lines whose crc32 % CUT_EVERY == 0
MAX_PIECE_LINES = 64  # (and after this many lines): an edit re-tokenizes its piece only


def pieces(text: str) -> list[str]:
    """`text` cut after the lines its content picks (so a line inserted above does not move the
    cuts below it): pieces of about CUT_EVERY lines that join back to `text`."""
    out, piece = [], []
    for line in text.splitlines(keepends=True):
        piece.append(line)
        if zlib.crc32(line.encode("utf-8", "surrogatepass")) % CUT_EVERY == 0 or len(piece) >= MAX_PIECE_LINES:
            out.append("".join(piece))
            piece = []
    if piece:
        out.append("".join(piece))
    return out


def ngram_keys(tokens: np.ndarray, n: int = NGRAM) -> np.ndarray:
    """keys[i] packs tokens[i : i + n]; shape [len - n + 1]."""
    t = tokens.astype(np.int64)
    if len(t) < n:
        return np.zeros(0, dtype=np.int64)
    key = t[: len(t) - n + 1].copy()
    for j in range(1, n):
        key = (key << BITS) | t[j: len(t) - n + 1 + j]
    return key


@dataclass
class Segment:
    """Several documents concatenated (separated by -1) with their sorted n-gram keys."""
    tokens: np.ndarray  # [T] int32
    keys: np.ndarray  # [K] sorted int64
    starts: np.ndarray  # [K] int64: position of each key's first token

    @classmethod
    def build(cls, docs: list[np.ndarray]) -> "Segment":
        if not docs:
            return cls(np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.int64))
        sep = np.array([-1], dtype=np.int32)
        tokens = np.concatenate([x for d in docs for x in (d.astype(np.int32), sep)])
        keys = ngram_keys(np.maximum(tokens, 0))
        starts = np.arange(len(keys), dtype=np.int64)
        # an n-gram that spans a separator matches nothing real: drop it
        ok = np.ones(len(keys), dtype=bool)
        for j in range(NGRAM):
            ok &= tokens[j: j + len(keys)] >= 0
        keys, starts = keys[ok], starts[ok]
        order = np.argsort(keys, kind="stable")
        return cls(tokens, keys[order], starts[order])

    def find(self, key: int) -> np.ndarray:
        lo, hi = np.searchsorted(self.keys, [key, key + 1])
        return self.starts[lo:hi]


class TokenIndex:
    """Open documents and workspace files, tokenized, searchable by n-gram."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.open_docs: dict[str, Segment] = {}
        self.files: dict[str, np.ndarray] = {}
        self._workspace = Segment.build([])
        self._dirty = False
        self._pieces: dict[str, dict[str, list[int]]] = {}  # uri -> its last text's pieces, tokenized

    def set_open_text(self, uri: str, text: str, encode: Callable[[str], list[int]]) -> None:
        """`set_open` from a buffer's text, tokenizing only the pieces (see `pieces`) that the last
        text of `uri` did not have: a keystroke in a 50 KB buffer costs one piece (~0.1 ms), not the
        whole buffer (~25 ms on 2 cores, on the keystroke's critical path). Across a cut the tokens
        may differ from the whole text's: prompt lookup only proposes, the target verifies."""
        old, cut = self._pieces.get(uri, {}), pieces(text)
        new = {p: old[p] if p in old else encode(p) for p in cut}
        self._pieces[uri] = new
        self.set_open(uri, np.concatenate([np.asarray(new[p], dtype=np.int32) for p in cut]) if cut
                      else np.zeros(0, np.int32))

    def set_open(self, uri: str, tokens: list[int] | np.ndarray) -> None:
        seg = Segment.build([np.asarray(tokens, dtype=np.int32)])
        with self._lock:
            self.open_docs[uri] = seg

    def close(self, uri: str) -> None:
        with self._lock:
            self.open_docs.pop(uri, None)
        self._pieces.pop(uri, None)

    def set_file(self, path: str, tokens: list[int] | np.ndarray) -> None:
        with self._lock:
            self.files[path] = np.asarray(tokens, dtype=np.int32)
            self._dirty = True

    def remove_file(self, path: str) -> None:
        with self._lock:
            if self.files.pop(path, None) is not None:
                self._dirty = True

    def rebuild(self) -> None:
        """Merge workspace files into one segment; call off the request path (a watcher thread)."""
        with self._lock:
            if not self._dirty:
                return
            docs = list(self.files.values())
            self._dirty = False
        seg = Segment.build(docs)
        with self._lock:
            self._workspace = seg

    def segments(self) -> list[Segment]:
        """Open buffers, then the workspace (merged inline here while it is small)."""
        with self._lock:
            inline = self._dirty and sum(len(f) for f in self.files.values()) < 200_000
        if inline:
            self.rebuild()
        with self._lock:
            return list(self.open_docs.values()) + [self._workspace]

    @property
    def n_files(self) -> int:
        return len(self.files)


def continuations(context: np.ndarray, segments: list[Segment], max_len: int, max_candidates: int,
                  min_match: int = 2, max_hits: int = 64) -> list[tuple[list[int], int]]:
    """Distinct continuations of the context's suffix found in the context itself and the segments.

    Returns [(tokens, match length)], longest backward match first (ties: more frequent first).
    Matches of NGRAM tokens are found by key; shorter suffixes (down to min_match) by a scan of the
    context only.
    """
    found: dict[tuple[int, ...], list[int]] = {}  # continuation -> [best match length, count]

    def add(tokens: np.ndarray, end: int, match: int) -> None:
        cont = tuple(int(t) for t in tokens[end: end + max_len])
        if cont and cont[0] >= 0:
            cut = cont.index(-1) if -1 in cont else len(cont)
            cont = cont[:cut]
            best = found.setdefault(cont, [0, 0])
            best[0] = max(best[0], match)
            best[1] += 1

    n = len(context)
    if n >= NGRAM:
        key = int(ngram_keys(context[-NGRAM:])[0])
        ctx_keys = ngram_keys(context[:-1])  # occurrences strictly before the suffix itself
        hits = np.nonzero(ctx_keys == key)[0][-max_hits:]
        for s in hits[::-1]:
            add(context, int(s) + NGRAM, _match_len(context, int(s) + NGRAM, context, n))
        for seg in segments:
            for s in seg.find(key)[:max_hits]:
                add(seg.tokens, int(s) + NGRAM, _match_len(seg.tokens, int(s) + NGRAM, context, n))
    if not found and n >= min_match:
        for m in range(min(NGRAM, n) - 1, min_match - 1, -1):
            suffix = context[-m:]
            win = np.lib.stride_tricks.sliding_window_view(context[:-1], m)
            hits = np.nonzero((win == suffix).all(1))[0][-max_hits:]
            for s in hits[::-1]:
                add(context, int(s) + m, m)
            if found:
                break
    ranked = sorted(found.items(), key=lambda kv: (-kv[1][0], -kv[1][1]))
    return [(list(c), m) for c, (m, _) in ranked[:max_candidates]]


def _match_len(tokens: np.ndarray, end: int, context: np.ndarray, n: int, cap: int = 32) -> int:
    """How many tokens before `end` in `tokens` equal the context's last tokens (at most cap)."""
    m = 0
    while m < cap and m < end and m < n and tokens[end - 1 - m] == context[n - 1 - m]:
        m += 1
    return m
