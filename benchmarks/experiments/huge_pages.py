"""Weights in 4 KB pages (the file mapped) against 2 MB pages (moved by models.pages): the same
target loaded twice in one process, whole passes of the daemon's runner at each tree size and
context, the two interleaved rep by rep (this VM's memory speed drifts over minutes), median ms.
Also the load time of each and how long the move took (docs/kernels.md "The weights in 2 MB pages").

    python -m benchmarks.experiments huge_pages --target qwen2.5-coder-1.5b --quant int4 \
        --json benchmarks/results/pages/huge-pages-1.5b-int4.json --plot benchmarks/results/pages/huge-pages-1.5b-int4.png
    python -m benchmarks.experiments huge_pages --target qwen2.5-coder-0.5b ...
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

import torch

from completiond.core.forward.runner import Runner
from completiond.models.loader import load
from completiond.models import pages
from benchmarks.pass_cost import cpu_info, fill_cache, tree


def anon_huge_mb() -> int:
    return int(re.search(r"AnonHugePages:\s+(\d+)", Path("/proc/self/smaps_rollup").read_text()).group(1)) // 1024


def loaded(target: str, quant: str, huge: bool) -> tuple[object, dict]:
    os.environ["COMPLETIOND_HUGE_PAGES"] = "auto" if huge else "0"
    before = anon_huge_mb()
    t = time.perf_counter()
    lm = load(target, quant=quant)
    load_s = time.perf_counter() - t
    pages.settle()
    info = {"load_s": round(load_s, 2), "moved_s": round(time.perf_counter() - t - load_s, 2),
            "weights": lm.meta.get("weights"), "anon_huge_mb": anon_huge_mb() - before}
    os.environ.pop("COMPLETIOND_HUGE_PAGES")
    return lm, info


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--quant", default="auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--contexts", default="64,2048")
    ap.add_argument("--sizes", default="1,2,4,8")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    contexts, sizes = [int(c) for c in a.contexts.split(",")], [int(s) for s in a.sizes.split(",")]
    models, loads = {}, {}
    for kind, huge in (("4 KB pages", False), ("2 MB pages", True)):
        models[kind], loads[kind] = loaded(a.target, a.quant, huge)
        print(f"{kind}: {loads[kind]}")
    runners = {k: Runner(lm, max(contexts) + 256, backend="lean") for k, lm in models.items()}
    ms: dict[tuple[str, int, int], list[float]] = {(k, c, n): [] for k in runners for c in contexts for n in sizes}
    for rep in range(a.reps + 1):  # rep 0 warms up
        for c in contexts:
            for k, r in (runners.items() if rep % 2 else reversed(runners.items())):
                fill_cache(r, c)
                for n in sizes:
                    done = r.run_pass([i * 7919 % 150000 for i in range(n)], tree(n), range(n))
                    if rep:
                        ms[k, c, n].append(done.ms)
                    r.rollback(c)
    table = {k: {str(c): {str(n): round(statistics.median(ms[k, c, n]), 2) for n in sizes} for c in contexts}
             for k in runners}
    ratio = {str(c): {str(n): round(table["2 MB pages"][str(c)][str(n)] / table["4 KB pages"][str(c)][str(n)], 3)
                      for n in sizes} for c in contexts}
    for c in contexts:
        for k in runners:
            print(f"{k} context {c:5d}: " + "  ".join(f"{n} nodes {table[k][str(c)][str(n)]:6.1f}" for n in sizes))
        print(f"2 MB / 4 KB   context {c:5d}: " + "  ".join(f"{n} nodes {ratio[str(c)][str(n)]:6.3f}" for n in sizes))
    out = {"command": "python " + " ".join(sys.argv), "date": datetime.datetime.now().isoformat(timespec="seconds"),
           "cpu": cpu_info(), "threads": a.threads, "target": a.target, "quant": models["4 KB pages"].meta.get("quant"),
           "reps": a.reps, "load": loads, "median_ms": table, "ratio_2mb_over_4kb": ratio}
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    if a.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(contexts), figsize=(5 * len(contexts), 4), squeeze=False)
        for ax, c in zip(axes[0], contexts):
            for k in runners:
                ax.plot(sizes, [table[k][str(c)][str(n)] for n in sizes], marker="o", label=k)
            ax.set_title(f"{a.target} {out['quant']}, {c} tokens of context")
            ax.set_xlabel("tree nodes")
            ax.set_ylabel("ms per pass (median)")
            ax.legend()
        fig.suptitle(out["cpu"].get("model", "") if isinstance(out["cpu"], dict) else str(out["cpu"]), fontsize=8)
        fig.tight_layout()
        a.plot.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(a.plot, dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
