"""Does a draft (the 0.5B, or heads: --draft eagle:PATH) pay for the 1.5B? Modes side by side on
the same positions, one engine, with what each speculative step cost: every draft proposal (ms,
candidates, longest) and target pass (ms, nodes) of `combined`, and the StepGate's measured ms per
emitted token with and without the draft.

Prompts are cut to --prompt-tokens (512: short prefills, so that a run takes minutes); each mode
starts from the same warm caches as `completiond bench` (the prompt minus its last 8 tokens).

    python -m benchmarks.experiments draft_steps --positions 16 --modes ar,pld,combined \
        --json benchmarks/results/draft-steps-1.5b.json --plot benchmarks/results/draft-steps-1.5b.png
    python -m benchmarks.experiments draft_steps --positions 16 --modes ar,pld,combined --no-gate \
        --json benchmarks/results/draft-steps-1.5b-no-gate.json --plot ...   # the draft's own `pays` only
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from completiond.bench.cli import machine
from completiond.bench.modes import index_repo, open_position, prepare, warm
from completiond.bench.repo import resolve_repo, sample_positions
from completiond.core.engine import Engine, Request
from completiond.models.loader import load, load_draft


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="default")
    ap.add_argument("--repo", default="pypi:toolz==1.0.0")
    ap.add_argument("--positions", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--modes", default="ar,pld,combined")
    ap.add_argument("--branch", type=int, default=4, help="draft tree: nodes fed per draft pass")
    ap.add_argument("--no-gate", action="store_true", help="the draft runs whenever its own `pays` says so")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None, help="PNG: ms per position, modes side by side")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    modes = a.modes.split(",")
    target = load(a.target, "target", "cpu", "auto", "auto")
    draft = load_draft(a.draft, target)
    engine = Engine(target, draft, draft_branch=a.branch)
    engine.calibrate_cached()
    if a.no_gate:
        from completiond.core.speculation.gate import StepGate

        StepGate.allows = lambda self: True
    root, label = resolve_repo(a.repo)
    files = index_repo(engine, root)
    prepared = prepare(engine, root, sample_positions(root, a.positions, "both", 0), True, a.prompt_tokens)
    steps: list[tuple] = []  # this completion's proposals and passes
    drafter = engine.draft or engine.heads  # a draft model, or heads on the target's hidden states
    if drafter is not None:
        propose = drafter.propose

        def timed_propose(*args, **kw):
            t0 = time.perf_counter()
            out = propose(*args, **kw)
            steps.append(("draft", round((time.perf_counter() - t0) * 1000, 1), len(out),
                          max((len(c.tokens) for c in out), default=0)))
            return out
        drafter.propose = timed_propose
    run_pass = engine.runner.run_pass

    def timed_pass(ids, *args, **kw):
        out = run_pass(ids, *args, **kw)
        steps.append(("target", round(out.ms, 1), len(ids)))
        return out
    engine.runner.run_pass = timed_pass
    rows, total, current = [], {m: 0.0 for m in modes}, None
    for i, pp in enumerate(prepared):
        current = open_position(engine, files, pp, current)
        for mode in modes:
            warm(engine, pp.prompt)
            steps.clear()
            t0 = time.perf_counter()
            res = engine.complete(Request(prompt=pp.prompt, mode=mode, max_tokens=64, stops=pp.stops, heal=pp.heal))
            ms = (time.perf_counter() - t0) * 1000
            total[mode] += ms
            rows.append({"position": i, "mode": mode, "ms": round(ms, 1), "tokens": len(res.token_ids),
                         "steps": list(steps) if mode != "ar" else []})
            print(f"{i:3d} {mode:9s} {ms:7.1f} ms  {len(res.token_ids):3d} tokens", flush=True)
    out = {"command": "python -m benchmarks.experiments draft_steps " + " ".join(
               f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items() if v not in (None, False)),
           "machine": machine(target), "target": target.name, "draft": getattr(draft, "name", None),
           "draft_quant": draft.meta.get("quant") if draft is not None and hasattr(draft, "meta") else None,
           "pass_cost_ms": {str(k): round(v, 1) for k, v in engine.budget.costs().items()},
           "draft_step_ms": round(drafter.step_ms.value, 2) if drafter else None,
           "total_ms": {m: round(v) for m, v in total.items()},
           "vs_ar": {m: round(total["ar"] / v, 3) for m, v in total.items()} if "ar" in total else None,
           "gate": {n: g.status() for n, g in engine.gates.items()}, "runs": rows}
    print(json.dumps({k: out[k] for k in ("total_ms", "vs_ar", "draft_step_ms", "gate")}))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    if a.plot:
        plot(out, modes, Path(a.plot))


def plot(out: dict, modes: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    positions = sorted({r["position"] for r in out["runs"]})
    ms = {(r["position"], r["mode"]): r["ms"] for r in out["runs"]}
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / len(modes)
    for j, mode in enumerate(modes):
        ax.bar([p + j * width for p in positions], [ms[p, mode] for p in positions], width,
               label=f"{mode}: {out['total_ms'][mode]} ms in all")
    ax.set_xlabel("position")
    ax.set_ylabel("ms per completion")
    ax.set_title(f"{out['target']} + {out['draft']} draft, {out['machine']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
