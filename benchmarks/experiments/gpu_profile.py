"""Where a graph-replayed pass spends its time on CUDA (Qwen2.5-Coder 1.5B shapes, random bf16 weights,
1,536 tokens of context): torch.profiler over passes of 1 and 8 nodes (kernels per pass, GPU time in
kernels, the top kernels), the replay alone against the whole `Runner.forward`, and, as an
experiment, the same fixed-shape pass compiled by torch.compile (elementwise ops fused) before its
graph is captured. Run by hand on a lent GPU:

    python -m benchmarks.experiments gpu_profile --json benchmarks/results/gpu/profile.json [--compile]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

from benchmarks.gpu_pass_cost import SHAPES, model, pass_ms  # noqa: E402
from benchmarks.pass_cost import fill_cache, tree  # noqa: E402

from completiond.core.forward import graphs  # noqa: E402
from completiond.core.forward.runner import Runner  # noqa: E402
from completiond.models.loaded import LoadedModel  # noqa: E402


def median_ms(r: Runner, n: int, context: int, reps: int) -> float:
    return sorted(pass_ms(r, n, context, reps))[reps // 2]


def replay_ms(r: Runner, n: int, reps: int) -> float:
    """The graph replay of the last pass of n nodes alone (inputs already in place), synced."""
    g = next(iter(v for k, v in r.graphs.graphs.items() if k[0] == n))
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        g.graph.replay()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1000)
    return sorted(times)[len(times) // 2]


def profile(r: Runner, n: int, context: int, reps: int = 10) -> dict:
    from torch.profiler import ProfilerActivity, profile as prof
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if r.device.type == "cuda" else [])
    with prof(activities=acts) as p:
        for _ in range(reps):
            r.forward([0] * n, tree(n), range(n))
            r.rollback(context)
    events = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    table = p.key_averages().table(sort_by="cuda_time_total" if r.device.type == "cuda" else "cpu_time_total",
                                   row_limit=14)
    print(table, flush=True)
    return {"kernels_per_pass": len(events) / reps,
            "gpu_ms_in_kernels_per_pass": sum(e.device_time for e in events) / reps / 1000,
            "table": table}


class Compiled:
    """The lean decoder's call compiled by torch.compile; what PassGraphs reads of it, passed through."""

    def __init__(self, base):
        self.base, self.layers, self._rope = base, base.layers, base._rope
        self.fn = torch.compile(base.__call__, dynamic=False)

    def __call__(self, **kw):
        return self.fn(**kw)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--context", type=int, default=1536)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b", choices=sorted(SHAPES))
    ap.add_argument("--compile", action="store_true", help="also the torch.compile experiment")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    lm = LoadedModel(name=a.target, model=model(SHAPES[a.target], dev), tokenizer=None, device=dev,
                     dtype=torch.bfloat16)
    r = Runner(lm, capacity=a.context + 256, backend="lean", cuda_graphs=True)
    fill_cache(r, a.context)
    out: dict = {}
    with torch.inference_mode():
        for n in (1, 8):
            median_ms(r, n, a.context, 3)  # capture
            row = {"forward_ms": median_ms(r, n, a.context, a.reps)}
            if dev.type == "cuda":
                row["replay_ms"] = replay_ms(r, n, a.reps)
            row |= profile(r, n, a.context)
            out[f"graphs {n}"] = row
            print(n, {k: v for k, v in row.items() if k != "table"}, flush=True)
        if a.compile:
            before = r.forward([0] * 8, tree(8), range(8))
            r.rollback(a.context)
            t0 = time.perf_counter()
            r.graphs = graphs.PassGraphs(Compiled(r.base), dev, capture=dev.type == "cuda")
            for n in (1, 8):
                median_ms(r, n, a.context, 2)  # compile + capture
                row = {"first_ms": round((time.perf_counter() - t0) * 1000), "failed": r.graphs.failed,
                       "forward_ms": median_ms(r, n, a.context, a.reps)}
                if dev.type == "cuda" and not r.graphs.failed:
                    row["replay_ms"] = replay_ms(r, n, a.reps)
                if n == 8:  # the same logits as the uncompiled pass, up to bf16 rounding
                    row["max_abs_logit_diff"] = float((r.forward([0] * 8, tree(8), range(8)) - before).abs().max())
                    r.rollback(a.context)
                out[f"compiled+graphs {n}"] = row
                print("compiled", n, row, flush=True)
                t0 = time.perf_counter()
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python", *sys.argv]),
            "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
            "torch": torch.__version__, "context": a.context, "target": a.target, "results": out}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
