"""Whole target passes of two checkouts side by side: an older one (a `git worktree` of it) and this
one, each in its own process (its own kernel library), alternated round by round, on a quiet machine
and beside busy processes, OpenMP waiting as the daemon has it (OMP_WAIT_POLICY=PASSIVE). Each cell
is the fastest round's mean pass (benchmarks/experiments/omp_wait.py's child).

    git worktree add /tmp/old <commit>
    python -m benchmarks.checkout_ab /tmp/old --target qwen2.5-coder-0.5b --json out.json
    python -m benchmarks.checkout_ab /tmp/old --target qwen2.5-coder-1.5b --quant int4 --sizes 1,4,8 --load 0
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.experiments.omp_wait import measure

HERE = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old", type=Path, help="the older checkout (its repository root)")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--quant", default="int8", help="the target's weights (int8, int4)")
    ap.add_argument("--settle", action="store_true", help="time passes after the weights moved into 2 MB pages")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=1536)
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    ap.add_argument("--passes", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--load", type=int, default=1, help="busy processes beside us in the loaded cells")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    trees = {"old": args.old.resolve(), "new": HERE}
    commits = {k: subprocess.run(["git", "-C", str(p), "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True).stdout.strip() for k, p in trees.items()}
    env = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None}
    cells = measure({name: {**env, "PYTHONPATH": str(tree)} for name, tree in trees.items()}, args, alternate=True)
    print(f"\nms per pass ({args.target}, {args.threads} threads, {args.context} tokens of context; old {commits['old']}, "
          f"new {commits['new']}; fastest of {args.rounds} rounds of {args.passes} passes)")
    for key, by in cells.items():
        print(f"{key:40s}" + "".join(f"{by[n]:>10.1f}" for n in args.sizes))
    if args.json:
        from completiond.models.device import cpu_name
        args.json.write_text(json.dumps({
            "command": "python " + " ".join(sys.argv), "cpu": cpu_name(), "threads": args.threads,
            "target": args.target, "quant": args.quant, "settled": args.settle, "context": args.context, "commits": commits,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "ms_per_pass": {k: {str(n): round(v, 1) for n, v in by.items()} for k, by in cells.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
