"""completiond's int8 kernel (models/kernels/int8_mm.c) against torch's `_weight_int8pack_mm`, side by side.

The matmuls of one Qwen2.5-Coder-0.5B pass (24 x [q/k/v 1152x896, o 896x896, gate/up 9728x896,
down 896x4864] + the 151,936 x 896 output layer: 494 MB of int8), random weights, bf16 activations
as the daemon runs them, at 1..64 rows (a tree's nodes). Every matrix is read once per pass, as in
a real pass: 494 MB does not fit any cache, so this measures streaming the weights from memory.
The two kernels alternate pass by pass (this machine is shared); each cell is the fastest of --reps.

    python -m benchmarks.experiments int8_kernel --threads 2 --json benchmarks/results/int8-kernel-avx2.json \
        --plot benchmarks/results/int8-kernel-avx2.png
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch

from completiond.models.kernels import cpu_kernel
from completiond.models.device import cpu_features, cpu_name

LAYERS = 24
SHAPES = [(1152, 896), (896, 896), (9728, 896), (896, 4864)]  # [N, K] of q/k/v fused, o, gate/up fused, down
HEAD = (151936, 896)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="1,2,4,8,16,32,64")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if cpu_kernel.library() is None:
        print("int8_kernel: completiond's kernel does not run here (no AVX2/FMA, no C compiler, or "
              "COMPLETIOND_INT8_KERNEL=torch)", file=sys.stderr)
        return 2
    g = torch.Generator().manual_seed(0)
    weights = [(torch.randint(-127, 128, s, dtype=torch.int8, generator=g), torch.rand(s[0], generator=g) / 64)
               for s in SHAPES * LAYERS + [HEAD]]
    bf16_scales = [s.bfloat16() for _, s in weights]
    mb = sum(q.numel() for q, _ in weights) / 1e6
    kernels = {
        "completiond": lambda x, i: cpu_kernel.int8_mm(x, weights[i][0], weights[i][1]),
        "torch": lambda x, i: torch.ops.aten._weight_int8pack_mm(x, weights[i][0], bf16_scales[i]),
    }
    rows = [int(r) for r in args.rows.split(",")]
    ms: dict[str, dict[int, list[float]]] = {k: {m: [] for m in rows} for k in kernels}
    for rep in range(args.reps):
        for m in rows:
            xs = [torch.randn(m, q.shape[1], generator=g).bfloat16() for q, _ in weights]
            for name, run in kernels.items():
                t0 = time.perf_counter()
                for i, x in enumerate(xs):
                    run(x, i)
                ms[name][m].append((time.perf_counter() - t0) * 1000)
        print(f"rep {rep} done", file=sys.stderr)
    best = {k: {m: round(min(v), 2) for m, v in by.items()} for k, by in ms.items()}
    print(f"ms per pass's matmuls ({mb:.0f} MB int8, {cpu_name()} {'/'.join(cpu_features())}, {args.threads} threads)")
    print(f"{'rows':>6}{'completiond':>14}{'torch':>10}{'ratio':>8}{'GB/s ours':>11}")
    for m in rows:
        a, b = best["completiond"][m], best["torch"][m]
        print(f"{m:>6}{a:>14.1f}{b:>10.1f}{a / b:>8.2f}{mb / a:>11.1f}")
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]), "cpu": cpu_name(), "cpu_features": cpu_features(),
        "threads": args.threads, "torch": torch.__version__, "int8_mb_per_pass": round(mb, 1),
        "what": "every int8 matmul of one Qwen2.5-Coder-0.5B pass, random weights, bf16 activations",
        "ms_per_pass_fastest": best, "ms_all": ms, "load_average": list(os.getloadavg()),
        "ratio_completiond_to_torch": {m: round(best["completiond"][m] / best["torch"][m], 3) for m in rows},
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name, by in best.items():
            ax.plot(rows, [by[m] for m in rows], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("rows (tree nodes)")
        ax.set_ylabel("ms per pass's int8 matmuls")
        ax.set_title(f"int8 matmuls of a 0.5B pass, {cpu_name()} ({'/'.join(cpu_features())}), {args.threads} threads",
                     fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
