"""int4 (w4_mm.c) against int8 weights (a8 / a16 kernels): the 1.5B's four layer shapes, `--layers`
layers of distinct random weights read from memory, ms per layer at each row count, fastest of 5,
kernels interleaved rep by rep (docs/kernels.md "int4 weights").

    python -m benchmarks.experiments w4_matmul --layers 6 --threads 2
    python -m benchmarks.experiments w4_matmul --kinds w4+avx512-vnni --zmm on,off --rows 3,4,5,8,16 --json OUT.json
        (the 512-bit code, cpu_kernel.zmm(), against the 256-bit code: docs/kernels.md "512-bit tiles";
        on:N runs the 512-bit tiles from N rows, on alone from this CPU's timed choice)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from completiond.models import quant
from completiond.models.kernels import cpu_kernel as ck
from benchmarks.pass_cost import cpu_info

SHAPES = [(2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960)]  # qkv, o, gate + up, down


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--kinds", default="int8+avx512-vnni,int16+avx512-vnni,w4+avx512-vnni,w4",
                    help="kernel kinds side by side (those this CPU runs)")
    ap.add_argument("--zmm", default="", help="on,off: each kind with the kernels' 512-bit code on and off, "
                    "interleaved (default: this process's choice)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    int8, int4 = [], []
    for _ in range(a.layers):
        for n, k in SHAPES:
            int8.append((torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g), torch.rand(n, generator=g)))
            int4.append(quant.pack_w4(torch.randn(n, k, generator=g)))
    kinds = [k for k in a.kinds.split(",") if k in ck.kinds_here()]
    lib = ck.library()
    zmm = [z for z in a.zmm.split(",") if z]

    # name -> (weights, matmul, 512-bit code on / off / as chosen)
    runs = {kind + (f" zmm {z}" if z else ""):
            (int4, lambda x, m, kind=kind: ck.w4_mm(x, m[0], m[1], kind), z) if kind.startswith("w4") else
            (int8, lambda x, m, kind=kind: ck.int8_mm(x, m[0], m[1], kind), z)
            for kind in kinds for z in (zmm or [""])}
    table = {}
    for rows in map(int, a.rows.split(",")):
        xs = {k: torch.randn(rows, k, generator=g) for k in (1536, 8960)}
        best = {name: float("inf") for name in runs}
        for _ in range(5):
            for name, (mats, run, z) in runs.items():
                if z:  # on / off, or on:N (512-bit tiles from N rows; on alone: this CPU's choice)
                    lib.completiond_zmm(int(z.startswith("on")))
                    lib.completiond_w4_zmm_rows(int(z.partition(":")[2] or ck.zmm_rows()))
                t0 = time.perf_counter()
                for m, (_, k) in zip(mats, SHAPES * a.layers):
                    run(xs[k], m)
                best[name] = min(best[name], (time.perf_counter() - t0) * 1000 / a.layers)
        print(rows, "  ".join(f"{name} {ms:.2f}" for name, ms in best.items()), flush=True)
        table[str(rows)] = {name: round(ms, 3) for name, ms in best.items()}
    if zmm:
        lib.completiond_zmm(int(ck.zmm()))
        lib.completiond_w4_zmm_rows(ck.zmm_rows())
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"command": "python " + " ".join(sys.argv), "cpu": cpu_info(), "threads": a.threads,
                                      "layers": a.layers, "ms_per_layer_fastest_of_5": table}, indent=2) + "\n")


if __name__ == "__main__":
    main()
