"""Would 5-bit weights make a decode pass cheaper on this CPU? A probe, not part of the product.

The Qwen2.5-Coder GGUFs store most matrices as Q5_0 (5 bits + a scale per 32 weights), 0.69-0.75x the
bytes of completiond's int8. A one-node pass is memory bound (it streams its int8 weights at ~90 % of
what 2 threads can read here), so fewer bytes could make it cheaper, if decoding them costs less than
the bytes save. `q5_probe/q5_mm.c` is such a kernel with the int8 kernel's tiles and batch-invariant
arithmetic; this script builds it with `completiond/core/int8_mm.c`, times both on the same matrices
and writes JSON and a plot.

    python benchmarks/q5_probe.py --json benchmarks/results/q5-probe-avx2.json --plot benchmarks/results/q5-probe-avx2.png
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from completiond.models.device import cpu_features, cpu_name  # noqa: E402

HERE = Path(__file__).parent
SOURCES = [HERE / "q5_probe" / "bench.c", HERE / "q5_probe" / "q5_mm.c", HERE.parent / "completiond" / "core" / "int8_mm.c"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "q5_probe"
        subprocess.run(["gcc", "-O3", "-mavx2", "-mfma", "-fopenmp", "-ffp-contract=off", "-o", str(exe),
                        *map(str, SOURCES), "-lm"], check=True)
        lines = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines()
    check, stream, rows = json.loads(lines[0]), json.loads(lines[1]), [json.loads(x) for x in lines[2:]]
    stream.pop("checksum")
    for r in rows:
        r["q5_over_int8"] = round(r["q5_ms"] / r["int8_ms"], 3)
    out = {"machine": f"{cpu_name()} ({'/'.join(cpu_features()) or 'no AVX2'}), 2 threads", "command": "python benchmarks/q5_probe.py", "matrices": "12 x [4864, 896]",
           **check, **stream, "int8_gb_per_s_1_row": round(12 * 4864 * 896 / rows[0]["int8_ms"] / 1e6, 2),
           "rows": rows}
    print(json.dumps(out, indent=2))
    if a.json:
        a.json.write_text(json.dumps(out, indent=2) + "\n")
    if a.plot:
        fig, ax = plt.subplots(figsize=(5, 3.2))
        xs = [r["rows"] for r in rows]
        ax.plot(xs, [r["int8_ms"] for r in rows], "o-", label="int8 (completiond kernel)")
        ax.plot(xs, [r["q5_ms"] for r in rows], "s-", label="5-bit blocks (probe)")
        ax.set_xlabel("rows (tree nodes)")
        ax.set_ylabel("ms for 12 matrices")
        ax.set_title(out["machine"], fontsize=8)
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.plot, dpi=120)


if __name__ == "__main__":
    main()
