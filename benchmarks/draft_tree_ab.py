"""Draft as a chain vs as a tree, side by side in one process (this machine is noisy).

For each repository: the same sampled positions, each run as `ar`, `draft` with a chain
(DraftModel.branch = 1) and `draft` with a tree (branch = 4), interleaved per position so that
noise hits all three alike; adaptive tree sizes as in the product, warm caches as in `bench`.

    python benchmarks/draft_tree_ab.py --repos pypi:toolz==1.0.0 pypi:boltons==25.0.0 --positions 12 \
        --json benchmarks/results/draft-tree-ab.json --plot benchmarks/results/draft-tree-ab.png
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
from pathlib import Path

import torch

from completiond.bench.modes import prepare, warm
from completiond.bench.repo import resolve_repo, sample_positions
from completiond.core.engine import Engine, Request
from completiond.models import load, load_draft

CONFIGS = {"ar": ("ar", 4), "draft-chain": ("draft", 1), "draft-tree": ("draft", 4)}


@torch.inference_mode()
def run_repo(target, draft, repo: str, positions: int, max_tokens: int) -> dict:
    root, label = resolve_repo(repo)
    engines = {}
    for name, (mode, branch) in CONFIGS.items():
        e = Engine(target, draft, draft_branch=branch)
        e.calibrate()
        engines[name] = (e, mode)
    prompts = prepare(engines["ar"][0], root, sample_positions(root, positions, "both", 0), multiline=True, max_prompt=3072)
    totals = {name: {"ms": 0.0, "tokens": 0, "passes": 0, "identical": 0} for name in CONFIGS}
    for p in prompts:
        ref = None
        for name, (e, mode) in engines.items():
            warm(e, p.prompt)
            r = e.complete(Request(prompt=p.prompt, mode=mode, max_tokens=max_tokens, stops=p.stops))
            ref = r.token_ids if ref is None else ref
            t = totals[name]
            t["ms"] += r.ms_total
            t["tokens"] += len(r.token_ids)
            t["passes"] += r.target_passes
            t["identical"] += r.token_ids == ref
    base = totals["ar"]["ms"]
    return {"repo": label, "positions": len(prompts), "configs": {
        name: {"tokens_per_s": round(t["tokens"] / t["ms"] * 1000, 2), "speedup_vs_ar": round(base / t["ms"], 3),
               "tokens_per_pass": round(t["tokens"] / max(1, t["passes"]), 3),
               "identical_to_ar": f"{t['identical']}/{len(prompts)}"} for name, t in totals.items()}}


def plot(result: dict, path: Path) -> None:
    """Tokens/s relative to `ar` (outputs may differ in length at bf16 near-ties, so this is the rate;
    `speedup_vs_ar` in the JSON is the ratio of total times)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.8 / len(CONFIGS)
    for i, name in enumerate(CONFIGS):
        xs = [j + i * width for j in range(len(result["repos"]))]
        ax.bar(xs, [r["configs"][name]["tokens_per_s"] / r["configs"]["ar"]["tokens_per_s"]
                    for r in result["repos"]], width, label=name)
    ax.set_xticks([j + width for j in range(len(result["repos"]))], [r["repo"] for r in result["repos"]])
    ax.set_ylabel("tokens/s relative to ar (one run)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repos", nargs="+", default=["pypi:toolz==1.0.0", "pypi:boltons==25.0.0"])
    ap.add_argument("--positions", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    a = ap.parse_args()
    target = load("default")
    draft = load_draft("default", target)
    result = {"date": datetime.date.today().isoformat(), "target": target.name, "draft": draft.name,
              "command": "python " + " ".join(shlex.quote(x) for x in sys.argv),
              "repos": [run_repo(target, draft, r, a.positions, a.max_tokens) for r in a.repos]}
    text = json.dumps(result, indent=2)
    print(text)
    if a.json:
        Path(a.json).write_text(text + "\n")
    if a.plot:
        plot(result, Path(a.plot))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
