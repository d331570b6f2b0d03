"""Quality of `completiond bench` runs side by side: exact line, exact middle and edit similarity of
each run's `ar` mode, and tokens per completion, one group of bars per JSON.

    python benchmarks/quality_plot.py benchmarks/results/quality/*.json --out benchmarks/results/quality/quality.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

METRICS = ("exact_match", "exact_middle", "edit_similarity")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="bench JSONs (their `ar` mode is read)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    runs = [json.loads(p.read_text()) for p in a.runs]
    labels = [p.stem.removeprefix("quality-") for p in a.runs]
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 4.5), gridspec_kw={"width_ratios": [3, 1]})
    width = 0.8 / len(METRICS)
    for k, metric in enumerate(METRICS):
        values = [r["modes"]["ar"][metric] for r in runs]
        left.bar([i + k * width for i in range(len(runs))], values, width, label=metric.replace("_", " "))
    left.set_xticks([i + width for i in range(len(runs))], labels, rotation=20, ha="right", fontsize=8)
    left.set_ylim(0, 1)
    left.legend()
    left.set_title("completion quality (ar, same positions per repository)")
    per = [r["modes"]["ar"]["tokens"] / r["positions"] for r in runs]
    right.bar(range(len(runs)), per)
    right.set_xticks(range(len(runs)), labels, rotation=20, ha="right", fontsize=8)
    right.set_title("tokens per completion")
    fig.suptitle(runs[0]["machine"], fontsize=9)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)


if __name__ == "__main__":
    main()
