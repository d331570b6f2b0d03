"""Alternatives: how often `complete n=3` has two or more distinct suggestions, and what
it costs against the single suggestion, side by side on one engine at the same positions.

At every position (sampled from a repository as `completiond bench` samples them, the prompt the
daemon builds) the caches are warmed to the prompt's last 8 tokens (an editor session: earlier
keystrokes), then n=1 and n=3 run in turn, their order alternating by position so drift in the
machine's load falls on both. The main suggestion of n=3 must be token-identical to n=1.

    python -m benchmarks.experiments alternatives --target qwen2.5-coder-0.5b --repo pypi:toolz==1.0.0 \\
        --positions 40 --json benchmarks/results/alternatives-0.5b.json

Time-based: the JSON names the CPU and the load average before and after; ratios are per position.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from completiond.bench.modes import index_repo, open_position, prepare, warm  # noqa: E402
from completiond.bench.repo import resolve_repo, sample_positions  # noqa: E402
from completiond.core.engine import Engine, Request  # noqa: E402
from completiond.models.loader import load  # noqa: E402
from completiond.models.device import cpu_name  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-0.5b")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--repo", default="pypi:toolz==1.0.0")
    ap.add_argument("--positions", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mode", default="pld", help="the main suggestion's mode (alternatives use prompt lookup)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--n", type=int, default=3)
    ap.add_argument("--json", type=Path, required=True)
    a = ap.parse_args()

    root, label = resolve_repo(a.repo)
    target = load(a.target, "target", "auto", a.dtype)
    engine = Engine(target, None)
    calibration = engine.calibrate_cached()
    positions = sample_positions(root, a.positions, seed=a.seed)
    files = index_repo(engine, root)
    prepared = prepare(engine, root, positions, multiline=True, max_prompt=2048)
    rows: list[dict] = []
    current = None
    load_before = os.getloadavg()
    for i, pp in enumerate(prepared):
        current = open_position(engine, files, pp, current)
        runs = {}
        for n in ((1, a.n) if i % 2 == 0 else (a.n, 1)):
            warm(engine, pp.prompt)
            runs[n] = engine.complete(Request(prompt=pp.prompt, mode=a.mode, max_tokens=a.max_tokens,
                                              stops=pp.stops, heal=pp.heal, n=n))
        one, several = runs[1], runs[a.n]
        rows.append({
            "file": str(pp.file.relative_to(root)), "kind": positions[i].kind,
            "identical": several.token_ids == one.token_ids,
            "suggestions": 1 + len(several.alternatives),
            "ms_single": round(one.ms_total, 1), "ms_several": round(several.ms_total, 1),
            "ratio": round(several.ms_total / max(one.ms_total, 1e-6), 3),
            "passes_single": one.target_passes, "passes_several": several.target_passes,
            "tokens_single": len(one.token_ids),
            "texts": [one.text] + [x.text for x in several.alternatives],
            "alternatives_stopped_by": [x.stopped_by for x in several.alternatives],
        })
        print(f"{i + 1}/{len(prepared)} {rows[-1]['suggestions']} suggestions, {rows[-1]['ms_single']:.0f} ms vs "
              f"{rows[-1]['ms_several']:.0f} ms, identical={rows[-1]['identical']}", flush=True)
        write(a, label, target, engine, calibration, load_before, rows)


def write(a, label, target, engine, calibration, load_before, rows) -> None:
    ms1 = [r["ms_single"] for r in rows]
    msn = [r["ms_several"] for r in rows]
    summary = {
        "positions": len(rows),
        "identical_main": sum(r["identical"] for r in rows),
        "share_2plus_distinct": round(sum(r["suggestions"] >= 2 for r in rows) / len(rows), 3),
        "share_3_distinct": round(sum(r["suggestions"] >= 3 for r in rows) / len(rows), 3),
        "ms_single_p50": round(statistics.median(ms1), 1), "ms_several_p50": round(statistics.median(msn), 1),
        "latency_ratio_of_sums": round(sum(msn) / sum(ms1), 3),
        "latency_ratio_p50": round(statistics.median(r["ratio"] for r in rows), 3),
        "passes_ratio_of_sums": round(sum(r["passes_several"] for r in rows)
                                      / max(1, sum(r["passes_single"] for r in rows)), 3),
    }
    out = {
        "command": "python -m benchmarks.experiments alternatives " + " ".join(sys.argv[1:]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_name(), "threads": __import__("torch").get_num_threads(),
        "loadavg_before": [round(x, 2) for x in load_before], "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "target": target.name, "dtype": str(target.dtype).replace("torch.", ""), "mode": a.mode,
        "n": a.n, "max_tokens": a.max_tokens, "repo": label, "calibration": calibration,
        "planned_positions": a.positions, "summary": summary, "rows": rows,
    }
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
