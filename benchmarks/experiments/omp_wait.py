"""Target pass cost with OpenMP's threads spinning or sleeping while they wait, on a quiet machine
and beside a competing process (what a laptop running a build or a browser tab looks like to us).

libgomp's default lets a waiting thread spin before it sleeps; our passes open ~5 parallel regions a
layer, so when another process holds a core, the thread that waits for the descheduled one spins
through its whole time slice. Each setting runs in its own process (libgomp reads the variable when
torch loads it), settings interleaved round by round; each cell is the fastest round's mean pass.
The competitor is a busy loop per core (`--load N` of them, plain Python: no OpenMP of its own).

    python -m benchmarks.experiments omp_wait --target qwen2.5-coder-1.5b --threads 2 \
        --json benchmarks/results/omp-wait-1.5b.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# None: unset (libgomp's default: spin 300,000 times, then sleep)
SETTINGS = {"libgomp default": {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": None},
            "active (spin)": {"OMP_WAIT_POLICY": "active", "GOMP_SPINCOUNT": None},
            "passive (sleep)": {"OMP_WAIT_POLICY": "passive", "GOMP_SPINCOUNT": None},
            "spin 20000 then sleep": {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": "20000"},
            "spin 5000 then sleep": {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": "5000"},
            "spin 2000 then sleep": {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": "2000"},
            "spin 200 then sleep": {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": "200"}}

CHILD = r"""
import importlib.util, json, sys, time, torch
spec = importlib.util.spec_from_file_location("pass_cost", {pass_cost!r})  # by path: PYTHONPATH picks completiond
pass_cost = importlib.util.module_from_spec(spec); spec.loader.exec_module(pass_cost)
fill_cache, tree = pass_cost.fill_cache, pass_cost.tree
from completiond.models.loader import load
from completiond.models.loaded import LoadedModel
from completiond.core.forward.runner import Runner
torch.set_num_threads({threads})
loaded = load({target!r}, quant={quant!r})
if {settle!r}:
    from completiond.models import pages
    pages.settle()  # the weights in 2 MB pages, as a daemon's are once it has run a while
lm = LoadedModel(name={target!r}, model=loaded.model, tokenizer=None, device=torch.device("cpu"), dtype=loaded.dtype)
r = Runner(lm, capacity={context} + 64, backend="lean")
fill_cache(r, {context})
out = {{}}
for n in {sizes}:
    r.forward(list(range(100, 100 + n)), tree(n), range(n)); r.rollback({context})
    t = time.perf_counter()
    for _ in range({passes}):
        r.forward(list(range(100, 100 + n)), tree(n), range(n)); r.rollback({context})
    out[n] = (time.perf_counter() - t) / {passes} * 1000
print(json.dumps(out))
"""


def run(env_extra: dict[str, str | None], args) -> dict[int, float]:
    code = CHILD.format(pass_cost=str(Path(__file__).resolve().parents[1] / "pass_cost.py"), threads=args.threads, target=args.target,
                        context=args.context, sizes=args.sizes, passes=args.passes,
                        quant=getattr(args, "quant", "int8"), settle=getattr(args, "settle", False))
    env = {k: v for k, v in {**os.environ, **env_extra}.items() if v is not None}
    # -P: no working directory on sys.path, so PYTHONPATH decides which completiond runs
    done = subprocess.run([sys.executable, "-P", "-c", code], env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def measure(variants: dict[str, dict[str, str | None]], args, alternate: bool = False) -> dict[str, dict[int, float]]:
    """Each variant's environment in its own child, variants in turn, round by round, on a quiet
    machine and beside args.load busy processes; each cell the fastest round's ms per pass by size.
    alternate: reverse the variants' order every other round (two variants: neither always first)."""
    cells: dict[str, dict[int, float]] = {}
    for rnd in range(args.rounds):
        for loaded in (False, True):
            hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load if loaded else 0)]
            try:
                order = list(variants.items())
                for name, env in (order[::-1] if alternate and rnd % 2 else order):
                    key = f"{name}, {'beside ' + str(args.load) + ' busy processes' if loaded else 'quiet'}"
                    got = run(env, args)
                    best = cells.setdefault(key, {})
                    for n, ms in got.items():
                        best[n] = min(best.get(n, float("inf")), ms)
                    print(f"round {rnd}: {key}: " + ", ".join(f"{n} nodes {ms:.1f} ms" for n, ms in got.items()),
                          file=sys.stderr)
            finally:
                for h in hogs:
                    h.kill()
    return cells


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=1536)
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    ap.add_argument("--passes", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--load", type=int, default=2, help="busy processes beside us in the loaded cells")
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma list of SETTINGS' names")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    cells = measure({name: SETTINGS[name] for name in args.settings.split(",")}, args)
    print(f"\nms per pass ({args.target}, {args.threads} threads, {args.context} tokens of context; fastest of "
          f"{args.rounds} rounds of {args.passes} passes)")
    for key, by in cells.items():
        print(f"{key:50s}" + "".join(f"{by[n]:>10.1f}" for n in args.sizes))
    if args.json:
        from completiond.models.device import cpu_name
        args.json.write_text(json.dumps({
            "command": "python " + " ".join(sys.argv), "cpu": cpu_name(), "threads": args.threads,
            "target": args.target, "context": args.context, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "ms_per_pass": {k: {str(n): round(v, 1) for n, v in by.items()} for k, by in cells.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
