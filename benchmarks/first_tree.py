"""The first pass as a verify step, measured: one engine, `ar` and `combined` with prompt lookup's tree
in the first pass (this commit's way: the prompt tokens the cache lacks, at most FIRST_TREE_TAIL, run
with the tree below them) and with the prompt prefilled first (the way before), the two `combined`
arms taking turns first position by position, each from the bench's warm state (all but the last
WARM_GAP prompt tokens cached; --warm-gap 1: a keystroke at the end of a file, whose prompt has no
suffix to recompute).

    python benchmarks/first_tree.py --target qwen2.5-coder-1.5b --quant int4 --repo pypi:toolz==1.0.0 \
        --positions 40 --json benchmarks/results/zen4/round21/first-tree-1.5b-int4-toolz.json

Measured (Zen 4, 40 toolz positions): no gain, so the next commit takes it out (docs/drafts.md
"The first pass as a verify step").
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from completiond.bench.cli import machine
from completiond.bench.modes import WARM_GAP, index_repo, open_position, prepare, warm
from completiond.bench.repo import resolve_repo, sample_positions
from completiond.core.engine import FIRST_TREE_TAIL, Engine, Request, draft_for
from completiond.models import load

ARMS = {"ar": ("ar", 0), "prefill-first": ("combined", 0), "tree-in-first-pass": ("combined", FIRST_TREE_TAIL)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-0.5b")
    ap.add_argument("--quant", default="auto")
    ap.add_argument("--draft", default="default", help="as `completiond bench --draft`")
    ap.add_argument("--repo", default="pypi:toolz==1.0.0")
    ap.add_argument("--positions", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warm-gap", type=int, default=WARM_GAP, help="prompt tokens the cache lacks at each start")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    target = load(a.target, "target", "cpu", "auto", a.quant)
    draft, unloaded = draft_for(a.draft, target)  # as a returning daemon: a draft measured slower stays out
    engine = Engine(target, draft)
    calibration = engine.calibrate_cached()
    root, label = resolve_repo(a.repo)
    files = index_repo(engine, root)
    prepared = sorted(prepare(engine, root, sample_positions(root, a.positions, "both", 0), True, 2048),
                      key=lambda p: str(p.file))
    runs: dict[str, list[dict]] = {k: [] for k in ARMS}
    identical = {k: 0 for k in ARMS}
    current = None
    for n, pp in enumerate(prepared):
        current = open_position(engine, files, pp, current)
        spec = list(ARMS)[1:] if n % 2 else list(ARMS)[:0:-1]
        ar = None
        for arm in ["ar", *spec]:
            mode, engine.first_tree_tail = ARMS[arm]
            warm(engine, pp.prompt, a.warm_gap)
            t0 = time.perf_counter()
            res = engine.complete(Request(prompt=pp.prompt, mode=mode, max_tokens=a.max_tokens, stops=pp.stops,
                                          heal=pp.heal))
            runs[arm].append({"ms": (time.perf_counter() - t0) * 1000, "first_ms": res.ms_first_token,
                              "passes": res.target_passes, "tokens": len(res.token_ids)})
            ar = res.token_ids if arm == "ar" else ar
            identical[arm] += res.token_ids == ar
        print(f"{n + 1}/{len(prepared)}", {k: round(sum(r["ms"] for r in v)) for k, v in runs.items()}, flush=True)
    engine.first_tree_tail = FIRST_TREE_TAIL
    summary = {}
    for arm, rs in runs.items():
        ms = [r["ms"] for r in rs]
        summary[arm] = {"p50_ms": round(statistics.median(ms), 1), "mean_ms": round(statistics.fmean(ms), 1),
                        "p50_first_token_ms": round(statistics.median(r["first_ms"] for r in rs), 1),
                        "passes": sum(r["passes"] for r in rs), "tokens": sum(r["tokens"] for r in rs),
                        "tokens_per_s": round(sum(r["tokens"] for r in rs) / sum(ms) * 1000, 2),
                        "identical_to_ar": identical[arm]}
    new, old = summary["tree-in-first-pass"], summary["prefill-first"]
    ratios = {"p50": round(new["p50_ms"] / old["p50_ms"], 3), "mean": round(new["mean_ms"] / old["mean_ms"], 3),
              "per_position_median": round(statistics.median(
                  x["ms"] / y["ms"] for x, y in zip(runs["tree-in-first-pass"], runs["prefill-first"])), 3)}
    out = {"command": "python benchmarks/first_tree.py " + " ".join(
               f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items() if v is not None),
           "machine": machine(target), "repo": label, "target": a.target, "quant": a.quant,
           "draft": None if draft is None else a.draft, "draft_unloaded": unloaded,
           "warm_gap": a.warm_gap, "calibration": calibration, "positions": len(prepared), "summary": summary,
           "tree_in_first_pass_over_prefill_first_ms": ratios, "runs": runs}
    print(json.dumps({k: out[k] for k in ("summary", "tree_in_first_pass_over_prefill_first_ms")}, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
