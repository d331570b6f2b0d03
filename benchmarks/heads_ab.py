"""Drafts on the target's hidden states, side by side in one run (issue 16): one process, one loaded
target, the same positions, one engine per draft (none, EAGLE-style heads, Medusa heads), each
running `ar` and its modes with the bench's warm-cache setup (`completiond.bench.modes`).

    python benchmarks/heads_ab.py --repo pypi:toolz==1.0.0 --positions 16 \\
        --json benchmarks/results/heads/ab-toolz.json --plot benchmarks/results/heads/ab-toolz.png

Per engine and mode: tokens/s, speed-up over that engine's own `ar`, accepted tokens per verify
pass, acceptance by depth, identical-to-`ar` rate, the draft's proposal cost (ms).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from completiond.bench.modes import run_modes  # noqa: E402
from completiond.bench.report import summarize_modes  # noqa: E402
from completiond.bench.repo import resolve_repo, sample_positions  # noqa: E402
from completiond.core.engine import Engine  # noqa: E402
from completiond.models import load, load_draft  # noqa: E402
from completiond.models.device import cpu_name  # noqa: E402


def arm_modes(draft: str) -> list[str]:
    return ["ar", "pld"] if draft == "none" else ["ar", "draft", "combined"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", default="pypi:toolz==1.0.0")
    ap.add_argument("--target", default="qwen2.5-coder-0.5b")
    ap.add_argument("--positions", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--drafts", default="none,eagle,medusa",
                    help="comma list of --draft specs, one engine each (medusa:PATH / eagle:PATH: a heads file)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    a = ap.parse_args()
    root, label = resolve_repo(a.repo)
    target = load(a.target, "target", "auto", "auto", "auto")
    positions = sample_positions(root, a.positions, "both", a.seed)  # as `completiond bench`
    arms = {}
    for name in a.drafts.split(","):
        modes = arm_modes(name)
        engine = Engine(target, load_draft(name, target))
        engine.calibrate()
        prepared = run_modes(engine, root, positions, modes, a.max_tokens)
        summary = summarize_modes(prepared, modes)
        p = engine.heads
        arms[name] = {"modes": summary, "proposal_ms": round(p.step_ms.value, 3) if p is not None else None}
        print(name, json.dumps({m: {k: r.get(k) for k in ("tokens_per_s", "speedup_vs_ar", "mean_accepted",
                                                         "identical_rate")} for m, r in summary.items()}), flush=True)
    result = {"date": datetime.date.today().isoformat(), "command": " ".join(["python"] + sys.argv),
              "repo": label, "cpu": cpu_name(), "threads": os.cpu_count(), "load_average": os.getloadavg(),
              "target": target.name, "quant": target.meta.get("quant", "none"), "positions": len(positions),
              "arms": arms}
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    if a.plot:
        plot(result, Path(a.plot))
    return 0


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    names, speed = [], []
    for arm, r in result["arms"].items():
        for mode, m in r["modes"].items():
            if mode != "ar":
                names.append(f"{arm}\n{mode}")
                speed.append(m["speedup_vs_ar"])
                if m.get("acceptance_by_depth"):
                    ax2.plot(range(1, len(m["acceptance_by_depth"][:8]) + 1), m["acceptance_by_depth"][:8],
                             marker="o", label=f"{arm} {mode}")
    ax1.bar(names, speed)
    ax1.axhline(1.0, color="grey", lw=0.8)
    ax1.set_ylabel("tokens/s vs ar (same engine)")
    ax2.set_xlabel("tree depth")
    ax2.set_ylabel("accepted per verify pass")
    ax2.legend(fontsize=7)
    fig.suptitle(f"{result['target']} {result['quant']}, {result['repo']}, {result['cpu']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
