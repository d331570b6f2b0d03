"""Bars of startup-draft-unloaded-1.5b.json (benchmarks/startup.py, this checkout against itself with
the 0.5B draft loaded): each run's start -> ready, RSS after an editor opens a file, and the daemon's
CPU seconds for that open + completion.

    python benchmarks/results/zen4/startup_plot.py benchmarks/results/zen4/startup-draft-unloaded-1.5b.json
"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

path = Path(sys.argv[1])
d = json.loads(path.read_text())
labels = {"this": f"--draft {d['drafts']['this']} (left unloaded)", "baseline": f"--draft {d['drafts']['baseline']}"}
metrics = [("start_to_ready_s", "start -> ready (s)", lambda r: r["start_to_ready_s"]),
           ("rss", "RSS after an editor opens a file (MB)", lambda r: r["rss_after_editor_open_mb"]["VmRSS"]),
           ("cpu", "daemon CPU for that open + completion (s)", lambda r: r["cpu_s_editor_open"])]
fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
for ax, (_, title, get) in zip(axes, metrics):
    for i, key in enumerate(("this", "baseline")):
        values = [get(r) for r in d[key]["runs"]]
        ax.bar([i + 0.25 * (j - 1) for j in range(len(values))], values, width=0.22, color=f"C{i}", label=labels[key])
    ax.set_xticks([0, 1], ["unloaded", "loaded"])
    ax.set_title(title, fontsize=9)
axes[0].legend(fontsize=7, loc="lower right")
fig.suptitle(f"{d['target']} {d['quant']}, {d['cpu']}, {d['cores']} cores: each bar one daemon", fontsize=9)
fig.tight_layout()
fig.savefig(path.with_suffix(".png"), dpi=110)
print(path.with_suffix(".png"))
