"""What the prompt's length adds to a verify pass: the daemon's target (lean runner, refined output
layer) at each tree size on KV caches of several lengths, contexts and sizes interleaved rep by rep
in one process (this machine's noise hits them alike), ms per pass (fastest and median of the reps).
The difference between two contexts at one size is attention over the extra keys (the weights are
the same); at n nodes every node attends to every key, so it grows with n.

    python -m benchmarks.experiments context_cost --target qwen2.5-coder-1.5b --quant int4 \
        --json benchmarks/results/w4head/context-cost-1.5b-int4.json --plot benchmarks/results/w4head/context-cost-1.5b-int4.png
    python -m benchmarks.experiments context_cost --target qwen2.5-coder-0.5b --contexts 64,2048 --attention float32,bf16 ...
    python -m benchmarks.experiments context_cost --target qwen2.5-coder-1.5b --quant int4 --w4-zmm on,off ...
    python -m benchmarks.experiments context_cost --target qwen2.5-coder-0.5b --contexts 64,1536 --value-pairs on,off ...
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

import torch

from completiond.core.forward.runner import Runner
from completiond.models.loader import load
from completiond.models import pages
from completiond.models.kernels import cpu_kernel
from benchmarks.pass_cost import cpu_info, fill_cache, tree


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--quant", default="auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--contexts", default="64,512,2048")
    ap.add_argument("--sizes", default="1,2,4,8")
    ap.add_argument("--attention", default="", help="comma list of cpu_kernel.ATTENTION modes to interleave too "
                    "(default: this process's)")
    ap.add_argument("--w4-zmm", default="", help="on,off: the kernels' 512-bit code (cpu_kernel.zmm) "
                    "interleaved too (default: this process's)")
    ap.add_argument("--value-pairs", default="", help="on,off: bf16 attention's value sums in bf16 pairs of keys "
                    "or float32 (completiond_value_pairs) interleaved too (default: on)")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    lm = load(a.target, quant=a.quant)
    pages.settle()  # time passes over the weights in 2 MB pages, as a daemon has them once moved
    contexts, sizes = [int(c) for c in a.contexts.split(",")], [int(s) for s in a.sizes.split(",")]
    attention = [m for m in a.attention.split(",") if m] or [cpu_kernel.attention()]
    zmm = [z for z in a.w4_zmm.split(",") if z]
    pairs = [v for v in a.value_pairs.split(",") if v]
    # a mode: an attention kind, and " zmm on" / " zmm off" where --w4-zmm interleaves them, then
    # " pairs on" / " pairs off" where --value-pairs does
    modes = [m + (f" zmm {z}" if zmm else "") + (f" pairs {v}" if pairs else "")
             for m in attention for z in (zmm or [""]) for v in (pairs or [""])]
    r = Runner(lm, max(contexts) + 256, backend="lean")
    ms: dict[tuple[str, int, int], list[float]] = {(m, c, n): [] for m in modes for c in contexts for n in sizes}
    chosen = cpu_kernel.attention
    for rep in range(a.reps + 1):  # rep 0 warms up
        for m in modes:
            m_, _, v = m.partition(" pairs ")
            kind, _, z = m_.partition(" zmm ")
            cpu_kernel.attention = lambda: kind  # read on every pass
            if v:
                cpu_kernel.library().completiond_value_pairs(int(v == "on"))
            if z:  # on / off, or on:N (512-bit int4 tiles from N rows)
                cpu_kernel.library().completiond_zmm(int(z.startswith("on")))
                cpu_kernel.library().completiond_w4_zmm_rows(int(z.partition(":")[2] or cpu_kernel.zmm_rows()))
            for c in contexts:
                fill_cache(r, c)
                for n in sizes:
                    done = r.run_pass([i * 7919 % 150000 for i in range(n)], tree(n), range(n))
                    if rep:
                        ms[m, c, n].append(done.ms)
                    r.rollback(c)
    cpu_kernel.attention = chosen
    if pairs:
        cpu_kernel.library().completiond_value_pairs(1)
    if zmm:
        cpu_kernel.library().completiond_zmm(int(cpu_kernel.zmm()))
        cpu_kernel.library().completiond_w4_zmm_rows(cpu_kernel.zmm_rows())
    lo, hi = str(contexts[0]), str(contexts[-1])
    by_mode = {}
    for m in modes:
        table = {str(c): {str(n): {"min": round(min(ms[m, c, n]), 2), "median": round(statistics.median(ms[m, c, n]), 2)}
                          for n in sizes} for c in contexts}
        for c in contexts:
            print(f"{m:12s} context {c:5d}: " + "  ".join(f"{n} nodes {table[str(c)][str(n)]['median']:6.1f}" for n in sizes))
        added = {str(n): round(table[hi][str(n)]["median"] - table[lo][str(n)]["median"], 2) for n in sizes}
        print(f"{m:12s} context {hi} over {lo}, ms added (median): {added}")
        by_mode[m] = {"ms_per_pass": table, f"added_by_{hi}_over_{lo}": added}
    out = {"command": "python " + " ".join(sys.argv), "date": datetime.date.today().isoformat(), "cpu": cpu_info(),
           "target": a.target, "quant": lm.meta.get("quant", "none"), "threads": a.threads, "reps": a.reps,
           **(by_mode[modes[0]] if len(modes) == 1 else {"modes": by_mode})}
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=2) + "\n")
    if a.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        for m in modes:
            for c in contexts:
                ax.plot(sizes, [by_mode[m]["ms_per_pass"][str(c)][str(n)]["median"] for n in sizes], marker="o",
                        label=f"{c} tokens of context" + (f", {m}" if len(modes) > 1 else ""))
        ax.set_xlabel("tree nodes")
        ax.set_ylabel("ms per pass (median)")
        ax.set_title(f"{a.target} ({out['quant']}), {a.threads} threads")
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.plot, dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
