"""The tree-size controller before and after it kept pass costs per exact tree size, side by side.

Before: costs measured and kept at 1, 2, 4, 8, ... nodes, interpolated in between (a 3-node pass
was estimated between 2 and 4 nodes; on AVX2 it costs what 4 do). After: `TreeBudget` as shipped
(every size it runs is kept exactly; calibration adds 3, 5, 6, 7, 12). One process, one engine and
its caches, the bench's positions and warm-cache setup (`completiond.bench.modes`); per position the
two budgets take turns (the order alternates), each after the same warm-up, so the shared machine's
noise hits both alike. Per budget: completion ms (p50, total), tokens/s, passes by tree size,
tokens identical to the other budget's (greedy: must be all).

    python benchmarks/budget_ab.py --repo pypi:boltons==25.0.0 --positions 16 --mode pld \\
        --json benchmarks/results/budget-ab-boltons.json --plot benchmarks/results/budget-ab-boltons.png
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from completiond.bench.modes import index_repo, open_position, prepare, warm  # noqa: E402
from completiond.bench.repo import resolve_repo, sample_positions  # noqa: E402
from completiond.core.budget import CALIBRATION_SIZES, SIZES, Ewma, TreeBudget  # noqa: E402
from completiond.core.engine import Engine, Request  # noqa: E402
from completiond.models import load  # noqa: E402
from completiond.models.device import cpu_features, cpu_name  # noqa: E402


class PowersOfTwoBudget(TreeBudget):
    """The controller as it was (up to commit 66bcd99): a pass updates its size's estimate only
    when the size is one of SIZES; other sizes interpolate."""

    def observe_pass(self, n: int, ms: float) -> None:
        import bisect

        size = SIZES[min(bisect.bisect_left(SIZES, n), len(SIZES) - 1)]
        if size not in self._cost:
            self._cost[size] = Ewma(ms)
        elif n == size:
            self._cost[size].add(ms)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True)
    ap.add_argument("--positions", type=int, default=16)
    ap.add_argument("--mode", default="pld")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    root, label = resolve_repo(a.repo)
    target = load("default", "target", "cpu", "auto", "auto")
    engine = Engine(target, None)
    budgets = {"powers of two (before)": PowersOfTwoBudget(), "exact sizes (after)": TreeBudget()}
    sizes = {"powers of two (before)": SIZES, "exact sizes (after)": CALIBRATION_SIZES}
    for name, b in budgets.items():
        engine.budget = b
        engine.calibrate(sizes[name])
    prepared = prepare(engine, root, sample_positions(root, a.positions, "both", 0), True, 2048)
    files = index_repo(engine, root)
    runs: dict[str, list[dict]] = {k: [] for k in budgets}
    sizes_seen: dict[str, collections.Counter] = {k: collections.Counter() for k in budgets}
    forward = engine.runner.forward
    current = None
    for i, pp in enumerate(sorted(prepared, key=lambda p: str(p.file))):
        current = open_position(engine, files, pp, current)
        order = list(budgets) if i % 2 == 0 else list(budgets)[::-1]
        for name in order:
            engine.budget = budgets[name]
            warm(engine, pp.prompt)

            def counted(ids, *args, _name=name, **kw):
                sizes_seen[_name][len(ids)] += 1
                return forward(ids, *args, **kw)

            engine.runner.forward = counted
            t0 = time.perf_counter()
            res = engine.complete(Request(prompt=pp.prompt, mode=a.mode, max_tokens=a.max_tokens, stops=pp.stops,
                                          heal=pp.heal))
            ms = (time.perf_counter() - t0) * 1000
            engine.runner.forward = forward
            runs[name].append({"ms": round(ms, 1), "tokens": len(res.token_ids), "ids": res.token_ids})
            print(f"{i:2d} {name:24s} {ms:8.1f} ms {len(res.token_ids):3d} tokens", file=sys.stderr)
    before, after = (runs[k] for k in budgets)
    out = {
        "repo": label, "machine": f"{cpu_name()} ({'/'.join(cpu_features()) or 'no AVX2'}), {a.threads} threads",
        "date": datetime.date.today().isoformat(), "command": "python " + " ".join(sys.argv),
        "target": target.name, "mode": a.mode, "positions": len(prepared),
        "identical": sum(x["ids"] == y["ids"] for x, y in zip(before, after)),
        "budgets": {},
    }
    for name, rs in runs.items():
        total_ms, tokens = sum(r["ms"] for r in rs), sum(r["tokens"] for r in rs)
        out["budgets"][name] = {
            "p50_ms": round(statistics.median(r["ms"] for r in rs), 1), "total_ms": round(total_ms, 1),
            "tokens_per_s": round(tokens / total_ms * 1000, 2),
            "passes_by_tree_size": dict(sorted(sizes_seen[name].items())),
            "pass_cost_ms": {str(n): round(c, 1) for n, c in budgets[name].costs().items()},
        }
    out["p50_ratio_after_over_before"] = round(out["budgets"]["exact sizes (after)"]["p50_ms"]
                                               / out["budgets"]["powers of two (before)"]["p50_ms"], 3)
    out["per_position_ms_ratio_median"] = round(statistics.median(y["ms"] / x["ms"] for x, y in zip(before, after)), 3)
    print(json.dumps(out, indent=2))
    if a.json:
        a.json.write_text(json.dumps(out, indent=2) + "\n")
    if a.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
        for name, rs in runs.items():
            left.plot(range(len(rs)), [r["ms"] for r in rs], "o-", label=name)
            seen = sizes_seen[name]
            xs = sorted(seen)
            right.plot(xs, [seen[n] for n in xs], "s-", label=name)
        left.set_xlabel("position")
        left.set_ylabel(f"`{a.mode}` completion ms")
        right.set_xlabel("tree size (nodes, incl. prefill chunks)")
        right.set_ylabel("passes")
        right.set_xlim(0, 17)
        left.legend(fontsize=7)
        fig.suptitle(f"{label}: {out['machine']}", fontsize=8)
        fig.tight_layout()
        fig.savefig(a.plot, dpi=120)


if __name__ == "__main__":
    main()
