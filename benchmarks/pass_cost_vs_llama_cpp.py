"""Target pass cost by tree size, ours against llama.cpp on the same GGUF, interleaved in one run.

Ours: the target as `completiond complete` loads it (default: Qwen2.5-Coder-0.5B, lean forward,
int8 weights with bf16 activations on CPUs where bf16 is fast), a tree of n nodes with logits at
every node, rolled back after each pass. llama.cpp: node-llama-cpp's prebuilt build (the ggml CPU
variant for this machine), one batch of n tokens with the next-token output at every one (llama.cpp
has no tree attention here; a chain of n costs it what a tree of n would). Both hold the same real
context (the first --context tokens of a source file), use the same threads, and are timed by the
wall clock rep by rep, sizes interleaved; each cell is the fastest of the reps (noise only adds).

    python -m benchmarks.pass_cost_vs_llama_cpp --threads 2 \
        --json benchmarks/results/pass-cost-vs-llama-cpp.json --plot benchmarks/results/pass-cost-vs-llama-cpp.png
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch

from completiond.bench.peers import LlamaCppPeer
from completiond.core.engine import Engine
from completiond.models.loader import load
from completiond.models.device import cpu_name

from benchmarks.pass_cost import SIZES, tree  # noqa: E402  (the same sizes and tree shape as our own pass-cost table)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="default")
    ap.add_argument("--quant", default="auto")
    ap.add_argument("--context", type=int, default=1536)
    ap.add_argument("--file", type=Path, default=Path(__file__).resolve().parents[1] / "completiond/core/engine.py",
                    help="source of the context tokens")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    target = load(a.target, "target", "cpu", "auto", a.quant)
    gguf = target.meta.get("gguf")
    if not gguf:
        print("pass_cost_vs_llama_cpp: the target was not loaded from a GGUF file", file=sys.stderr)
        return 2
    runner = Engine(target).runner
    label = f"{target.name} {target.meta.get('quant', 'none')}/{str(target.dtype)[6:]} {runner.backend}"
    context = target.tokenizer.encode(a.file.read_text(), add_special_tokens=False)[: a.context]
    ours: dict[int, list[float]] = {n: [] for n in SIZES}
    theirs: dict[int, list[float]] = {n: [] for n in SIZES}
    with torch.inference_mode(), LlamaCppPeer(gguf, a.threads, len(context) + 2 * max(SIZES)) as peer:
        runner.extend(context)
        for rep in range(a.reps):
            for n in SIZES:
                ids = context[-n:]
                t0 = time.perf_counter()
                runner.forward(ids, tree(n), range(n))
                ours[n].append((time.perf_counter() - t0) * 1000)
                runner.rollback(len(context))
                theirs[n].extend(peer.ask(op="pass", context=context, k=n, reps=1)["ms"])
            print(f"rep {rep} done", file=sys.stderr)
        info = peer.info
    best = {"ours": {n: round(min(t), 2) for n, t in ours.items()},
            "llama.cpp": {n: round(min(t), 2) for n, t in theirs.items()}}
    ratio = {n: round(best["ours"][n] / best["llama.cpp"][n], 3) for n in SIZES}
    print(f"ms per pass (wall, fastest of {a.reps}), {len(context)} tokens of context, {cpu_name()}, {a.threads} threads")
    print(f"{'nodes':>6}{'ours':>10}{'llama.cpp':>11}{'ours/llama.cpp':>16}")
    for n in SIZES:
        print(f"{n:>6}{best['ours'][n]:>10.1f}{best['llama.cpp'][n]:>11.1f}{ratio[n]:>16.2f}")
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(["python", *sys.argv]), "cpu": cpu_name(), "cores": os.cpu_count(),
              "avx512_bf16": "avx512_bf16" in Path("/proc/cpuinfo").read_text(),
              "threads": a.threads, "context": len(context), "ours": label, "llama_cpp": info,
              "gguf": Path(gguf).name, "ms_per_pass": best, "ours_over_llama_cpp": ratio,
              "all_ms": {"ours": ours, "llama.cpp": theirs}, "load_average": list(os.getloadavg())}
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(result, indent=1) + "\n")
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name, by in best.items():
            ax.plot(SIZES, [by[n] for n in SIZES], marker="o", label=name if name != "ours" else label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens in the pass (tree nodes)")
        ax.set_ylabel("ms per pass (wall)")
        ax.set_title(f"{len(context)}-token context, {cpu_name()}, {a.threads} threads", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(a.plot, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
