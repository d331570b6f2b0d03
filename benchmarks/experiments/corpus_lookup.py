"""Would a code corpus beyond the workspace add guesses prompt lookup lacks? (REST-style, measured)

The goal was 2x the 1.5B's own `ar` tokens/s; prompt lookup over the buffers and the workspace
cannot give it even when its best continuation is chosen after the fact (docs/drafts.md, "What
prompt lookup could give at most"). Retrieval from a large code corpus (REST, He et al. 2024) is
the other cheap proposer: the most frequent continuation of the context's longest suffix found in
the corpus. The corpus here is what every machine with Python has: the standard library's sources
(tests left out), tokenized by the target's tokenizer.

For every position of the target's `ar` output this keeps prompt lookup's ranked continuations and
the corpus's (how many of their tokens the target wrote next), then replays decoding with the best
candidate chosen after the fact (an upper bound no proposer reaches), once from prompt lookup's
candidates and once with the corpus's added, each node count priced by a bench JSON's pass costs.

    python -m benchmarks.experiments corpus_lookup --target qwen2.5-coder-1.5b --quant int4 --repo pypi:toolz==1.0.0 \
        --costs benchmarks/results/zen4/round23/targets-toolz.json \
        --json benchmarks/results/zen4/round24/corpus-lookup-toolz.json
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.experiments.pld_replay import after_the_fact, collect, scored  # noqa: E402

from completiond.bench.cli import machine  # noqa: E402
from completiond.core.engine import Engine  # noqa: E402
from completiond.models.loader import load  # noqa: E402
from completiond.paths import cache_root  # noqa: E402

BITS = 20  # bits per token in a key (Qwen's ids are below 2**18)
NONE = (1 << BITS) - 1  # a file boundary, and the tokens before the corpus's start
MAX_SUFFIX = 6  # tokens of the context's suffix matched (two keys of 3)
SAMPLE = 4096  # occurrences read to count continuations


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test"}
    return sorted(f for f in root.rglob("*.py") if not skip & set(f.relative_to(root).parts))


def corpus_tokens(tokenizer, files: list[Path], name: str) -> np.ndarray:
    """The files' token ids, each file followed by -1; cached under the cache root."""
    path = cache_root() / "bench-corpus" / f"{name}-{len(files)}.npy"
    if path.exists():
        return np.load(path)
    enc = tokenizer.backend_tokenizer.encode_batch([f.read_text(errors="replace") for f in files],
                                                   add_special_tokens=False)
    arr = np.concatenate([x for e in enc for x in (np.asarray(e.ids, np.int32), np.array([-1], np.int32))])
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, arr)
    return arr


class SuffixIndex:
    """Every corpus position p keyed by the tokens before it, nearest first (p-1, p-2, p-3 in the
    first key, p-4 .. p-6 in the second) and sorted: the positions whose preceding tokens equal the
    context's last L tokens are one range, found by binary search for L = 1, 2, ... 6."""

    def __init__(self, tokens: np.ndarray):
        self.tokens = tokens
        t = np.where(tokens < 0, NONE, tokens).astype(np.int64)
        pad = np.concatenate([np.full(MAX_SUFFIX, NONE, np.int64), t])
        before = [pad[MAX_SUFFIX - j: MAX_SUFFIX - j + len(t)] for j in range(1, MAX_SUFFIX + 1)]  # t[p - j]
        k1 = (before[0] << 2 * BITS) | (before[1] << BITS) | before[2]
        k2 = (before[3] << 2 * BITS) | (before[4] << BITS) | before[5]
        self.order = np.lexsort((k2, k1))
        self.k1, self.k2 = k1[self.order], k2[self.order]

    def lookup(self, context: list[int], max_len: int, min_match: int = 2,
               min_share: float = 0.5) -> tuple[list[int], int]:
        """(the most frequent continuation, extended while its next token's share stays >= min_share;
        the suffix length matched)."""
        last = [int(x) for x in context[-MAX_SUFFIX:]][::-1]  # nearest first
        lo, hi, match = 0, len(self.order), 0
        for n in range(1, len(last) + 1):
            keys, start = (self.k1, 0) if n <= 3 else (self.k2, 3)
            key = sum(last[start + j] << (2 - j) * BITS for j in range(n - start))
            span = 1 << (2 - (n - start - 1)) * BITS
            a, b = np.searchsorted(keys[lo:hi], [key, key + span]) + lo
            if b <= a:
                break
            lo, hi, match = int(a), int(b), n
        if match < min_match:
            return [], match
        pos = self.order[lo:hi]
        if len(pos) > SAMPLE:
            pos = pos[np.linspace(0, len(pos) - 1, SAMPLE).astype(np.int64)]
        out: list[int] = []
        for d in range(max_len):
            nxt = self.tokens[np.minimum(pos + d, len(self.tokens) - 1)]
            ids, counts = np.unique(nxt[nxt >= 0], return_counts=True)
            if not len(ids) or (d > 0 and counts.max() < min_share * len(pos)):
                break
            out.append(int(ids[counts.argmax()]))
            pos = pos[nxt == out[-1]]
        return out, match


class Timed:
    """`SuffixIndex.lookup` for pld_replay.collect's `extra`, each call's µs and suffix kept."""

    def __init__(self, corpus: SuffixIndex):
        self.corpus, self.us, self.match = corpus, [], []

    def __call__(self, view: list[int]) -> tuple[list[int], int]:
        t0 = time.perf_counter()
        tokens, match = self.corpus.lookup(view, 16)
        self.us.append((time.perf_counter() - t0) * 1e6)
        self.match.append(match)
        return tokens, match


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--quant", default="auto")
    ap.add_argument("--repo", default="pypi:toolz==1.0.0")
    ap.add_argument("--positions", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--costs", required=True, help="a bench JSON whose target's pass_cost_ms prices the replay")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    target = load(a.target, "target", "cpu", "auto", a.quant)
    files = stdlib_files()
    t0 = time.perf_counter()
    tokens = corpus_tokens(target.tokenizer, files, f"stdlib-{sys.version_info[0]}.{sys.version_info[1]}-{a.target}")
    corpus = SuffixIndex(tokens)
    built_s = time.perf_counter() - t0
    engine = Engine(target, None)
    engine.calibrate_cached()
    timed = Timed(corpus)
    data = collect(engine, a.repo, a.positions, a.max_tokens, extra=timed)
    plain = [{"tokens": p["tokens"], "steps": p["steps"]} for p in data]
    more = [{"tokens": p["tokens"], "steps": [c + ([x] if x[1] else []) for c, x in zip(p["steps"], p["extra"])]}
            for p in data]
    steps = [(c, x) for p in data for c, x in zip(p["steps"], p["extra"])]  # (pld's candidates, the corpus's)

    bench = json.load(open(a.costs))
    info = next(v for k, v in bench["by_target"].items() if k.split("@")[0] == a.target)
    costs = {int(k): v for k, v in info["pass_cost_ms"].items()}
    decode = sum(p["tokens"] - 1 for p in data)
    first_ms = info["modes"]["ar"]["p50_first_token_ms"]
    rows = {}
    for name, runs in (("prompt lookup", plain), ("prompt lookup + stdlib", more)):
        r = rows[name] = scored(runs, after_the_fact, costs, first_ms)
        print(f"after the fact, {name:24s} passes {r['passes']:4d} tokens/pass {r['tokens_per_pass']:.2f} "
              f"decoding {r['decode_speedup']:.2f}x, with the first token {r['with_first_token_speedup']:.2f}x")
    n = len(steps)
    right = [any(c[2] for c in cands) for cands, _ in steps]
    counts = {
        "offsets": n,
        "pld_has_candidates": sum(bool(cands) for cands, _ in steps),
        "pld_leading_first_token_right": sum(bool(cands and cands[0][2]) for cands, _ in steps),
        "pld_some_candidate_right": sum(right),
        "corpus_first_token_right": sum(x[2] > 0 for _, x in steps),
        "corpus_right_where_no_pld_candidate_is": sum(x[2] > 0 and not r for (_, x), r in zip(steps, right)),
        "corpus_tokens_agreed_there": sum(x[2] for (_, x), r in zip(steps, right) if not r),
        "corpus_match_length_histogram": {str(m): timed.match.count(m) for m in range(MAX_SUFFIX + 1)},
        "lookup_us_median": round(float(np.median(timed.us)), 1),
    }
    for k, v in counts.items():
        print(f"{k:42s} {v}")
    out = {"command": "python -m benchmarks.experiments corpus_lookup " + " ".join(
               f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items() if v is not None),
           "machine": machine(target), "repo": a.repo, "target": a.target, "quant": a.quant,
           "positions": len(data), "decode_tokens": decode, "pass_cost_ms": costs, "first_token_ms": first_ms,
           "corpus": {"what": "the standard library's .py files, tests left out", "files": len(files),
                      "tokens": int((tokens >= 0).sum()), "tokenize_and_index_s": round(built_s, 1)},
           "after_the_fact": rows, "offsets": counts}
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 3.5))
        labels = ["prompt lookup's\nleading token right", "some prompt lookup\ncandidate right",
                  "stdlib's token\nright", "stdlib right where\nno prompt lookup is"]
        vals = [counts["pld_leading_first_token_right"], counts["pld_some_candidate_right"],
                counts["corpus_first_token_right"], counts["corpus_right_where_no_pld_candidate_is"]]
        ax.bar(labels, [v / n for v in vals], color=["C0", "C0", "C1", "C1"])
        ax.set_ylabel(f"share of {n} offsets")
        ax.set_title(f"{a.target} `ar` on {a.repo}: whose next token is right", fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
        fig.tight_layout()
        fig.savefig(a.plot, dpi=120)


if __name__ == "__main__":
    main()
