"""What would make a decode or verify pass cheaper on this CPU? Kernel probes beside completiond's
int8 kernel (models/kernels/int8_mm.c, float32 activations), not part of the product.

- 5-bit weights (`kernel_probe/q5_mm.c`): the Qwen2.5-Coder GGUFs store most matrices as Q5_0
  (5 bits + a scale per 32 weights), 0.69-0.75x the bytes of int8. A one-node pass is memory bound,
  so fewer bytes could make it cheaper, if decoding them costs less than the bytes save.
- int16 activations (`models/kernels/a16_mm.c`, a probe here until it measured faster on some AVX2 hosts; now
  the native layer's kernel where cpu_kernel's calibration picks it): vpmaddwd does 16 int16
  multiply-adds per instruction, exactly in int32, where a float FMA does 8.
- One core's ceilings (`ceilings` in bench.c): float FMAs with operands in registers, with one
  256-bit or 128-bit load each, and the int8 kernel on 6 rows with its weights in cache.

Both keep the int8 kernel's tiles and batch-invariant arithmetic. This script builds them with
int8_mm.c, times all three on the same matrices, repeats the whole timing --runs times (the machine
is shared: the median ratio per row count is the result) and writes JSON and a plot.

    python -m benchmarks.experiments kernel_probe --runs 5 --json benchmarks/results/kernel-probe-avx2.json --plot benchmarks/results/kernel-probe-avx2.png

(`benchmarks/results/q5-probe-avx2.*` came from this script before the int16 probe, as
`benchmarks/q5_probe.py`, at commit 3ff12ee.)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from tqdm import tqdm  # noqa: E402

import completiond  # noqa: E402
from completiond.models.device import cpu_features, cpu_name  # noqa: E402

HERE = Path(__file__).parent
KERNELS = Path(completiond.__file__).parent / "models" / "kernels"  # the installed package's kernel sources
SOURCES = [HERE / "kernel_probe" / n for n in ("bench.c", "q5_mm.c")] + [
    KERNELS / n for n in ("int8_mm.c", "a16_mm.c", "a8_mm.c", "mm.c")]


def cpu_family_model() -> str:
    """/proc/cpuinfo's family and model: a VM's "AMD EPYC" (family 23, model 1 is QEMU's generic
    EPYC) says little about the host, whose cores these numbers describe."""
    try:
        info = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in
                Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines() if ":" in line)}
        return f"family {info['cpu family']}, model {info['model']}"
    except (OSError, KeyError):
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="whole timings (each the best of 15 per kernel)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path)
    a = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "kernel_probe"
        subprocess.run(["gcc", "-O3", "-mavx2", "-mfma", "-fopenmp", "-ffp-contract=off",
                        "-I", str(KERNELS), "-o", str(exe),
                        *map(str, SOURCES), "-lm"], check=True)
        for _ in tqdm(range(a.runs), desc="kernel probe", unit="run"):
            lines = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines()
            runs.append([json.loads(x) for x in lines])
    q5_check, a16_check = runs[0][0], runs[0][1]
    rows = []
    for i, first in enumerate(runs[0][4:]):
        per_run = [run[4 + i] for run in runs]
        row = {"rows": first["rows"]}
        for kernel in ("int8", "q5", "a16"):
            row[f"{kernel}_ms"] = round(median(r[f"{kernel}_ms"] for r in per_run), 3)
        for kernel in ("q5", "a16"):  # the ratio within each run, then the median over runs
            ratios = [r[f"{kernel}_ms"] / r["int8_ms"] for r in per_run]
            row[f"{kernel}_over_int8"] = round(median(ratios), 3)
            row[f"{kernel}_over_int8_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
        rows.append(row)
    stream = [run[2]["read_gb_per_s"] for run in runs]
    ceilings = {k: round(median(run[3][k] for run in runs), 2) for k in runs[0][3]}
    out = {"machine": f"{cpu_name()} ({'/'.join(cpu_features()) or 'no AVX2'}), 2 threads",
           "command": " ".join(["python", *sys.argv]), "matrices": "12 x [4864, 896]",
           "runs": a.runs, **q5_check, **a16_check, "read_gb_per_s": round(median(stream), 2),
           "one_core": ceilings, "cpu_family_model": cpu_family_model(),
           "int8_gb_per_s_1_row": round(12 * 4864 * 896 / rows[0]["int8_ms"] / 1e6, 2), "rows": rows}
    print(json.dumps(out, indent=2))
    if a.json:
        a.json.write_text(json.dumps(out, indent=2) + "\n")
    if a.plot:
        fig, ax = plt.subplots(figsize=(5, 3.2))
        xs = [r["rows"] for r in rows]
        ax.plot(xs, [r["int8_ms"] for r in rows], "o-", label="int8 x float32 (completiond kernel)")
        ax.plot(xs, [r["q5_ms"] for r in rows], "s-", label="5-bit x float32 (probe)")
        ax.plot(xs, [r["a16_ms"] for r in rows], "^-", label="int8 x int16 activations (probe)")
        ax.set_xlabel("rows (tree nodes)")
        ax.set_ylabel(f"ms for 12 matrices (median of {a.runs} runs)")
        ax.set_title(out["machine"], fontsize=8)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(a.plot, dpi=120)


if __name__ == "__main__":
    main()
