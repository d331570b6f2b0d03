"""Target pass cost by tree size on CUDA, Qwen2.5-Coder 0.5B and 1.5B
shapes with random weights (a pass costs the same whatever the values, and the device machine cannot
fetch the real files), bf16, 1,536 tokens of context: the lean forward replayed from CUDA graphs
(graphs.py, the default on CUDA), the lean forward launched op by op, and transformers' forward.
Wall-clock ms of `Runner.forward` (it ends in a device sync), the output layer and its float32
refinement included; the first two passes of a size are reported apart (with graphs: its first
use, uncaptured, then the pass that captures it).
Run by benchmarks/gpu.sh.

    python -m benchmarks.gpu_pass_cost --json benchmarks/results/gpu-pass-cost.json
    python -m benchmarks.gpu_pass_cost --from A.json B.json --plot gpu.png   # draw saved runs
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

from benchmarks.pass_cost import SIZES, fill_cache, tree  # noqa: E402

from completiond.core.forward.runner import Runner  # noqa: E402
from completiond.models.loaded import LoadedModel  # noqa: E402

SHAPES = {"qwen2.5-coder-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                     num_attention_heads=14, tie_word_embeddings=True),
          "qwen2.5-coder-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                     num_attention_heads=12, tie_word_embeddings=False)}


def model(shape: dict, device: str | torch.device = "cuda") -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen2Config
    cfg = Qwen2Config(vocab_size=151936, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1e6,
                      rms_norm_eps=1e-6, use_sliding_window=False, **shape)
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: seconds, not a minute of CPU init
        return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.bfloat16).eval()


def pass_ms(r: Runner, n: int, context: int, reps: int) -> list[float]:
    """Wall ms of `reps` passes of an n-node tree (pass_cost.tree) over `context` committed slots,
    each rolled back after."""
    times = []
    for _ in range(reps):
        times.append(r.run_pass([0] * n, tree(n), range(n)).ms)
        r.rollback(context)
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--context", type=int, default=1536)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--variants", default="lean+graphs,lean,transformers")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path, help="draw ms per pass by tree size (this run, or the --from runs)")
    ap.add_argument("--from", dest="runs", type=Path, nargs="+", help="saved JSONs to draw instead of measuring")
    a = ap.parse_args(argv)
    if a.runs:
        plot([(p.stem, json.loads(p.read_text())) for p in a.runs], a.plot or Path("gpu-pass-cost.png"))
        return 0
    if not torch.cuda.is_available():
        print("gpu_pass_cost: no CUDA device", file=sys.stderr)
        return 2
    out, firsts = {}, {}
    for name, shape in SHAPES.items():
        lm = LoadedModel(name=name, model=model(shape), tokenizer=None, device=torch.device("cuda"), dtype=torch.bfloat16)
        for variant, backend, graphs in (("lean+graphs", "lean", True), ("lean", "lean", False),
                                         ("transformers", "transformers", False)):
            if variant not in a.variants.split(","):
                continue
            r = Runner(lm, capacity=a.context + 256, backend=backend, cuda_graphs=graphs)
            fill_cache(r, a.context)
            row, first = {}, {}
            with torch.inference_mode():
                for n in SIZES:
                    times = pass_ms(r, n, a.context, a.reps + 2)
                    first[n] = [round(t, 2) for t in times[:2]]
                    times = times[2:]
                    row[n] = round(sorted(times)[len(times) // 2], 3)  # median ms
            out[f"{name} {variant}"] = row
            firsts[f"{name} {variant}"] = first
            if graphs:
                assert r.graphs is not None and r.graphs.failed is None, r.graphs and r.graphs.failed
            print(f"{name:20} {variant:13}" + "".join(f"{n:>5}:{ms:7.2f}" for n, ms in row.items()), flush=True)
            del r
        del lm
        torch.cuda.empty_cache()
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python", *sys.argv]), "device": torch.cuda.get_device_name(),
            "torch": torch.__version__, "context": a.context, "median_ms_per_pass": out,
            "first_passes_ms": firsts}, indent=1) + "\n")
    if a.plot:
        plot([("this run", {"median_ms_per_pass": out, "device": torch.cuda.get_device_name(),
                            "context": a.context})], a.plot)
    return 0


def plot(runs: list[tuple[str, dict]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(SHAPES), figsize=(12, 5), sharey=True)
    for ax, target in zip(axes, SHAPES):
        for (label, run), style in zip(runs, ("--", "-", ":", "-.")):
            for variant, by in run["median_ms_per_pass"].items():
                if variant.startswith(target):
                    ax.plot([int(n) for n in by], list(by.values()), style, marker="o",
                            label=f"{variant.removeprefix(target).strip()} ({label})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tree nodes")
        ax.set_title(f"{target} (random bf16 weights)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("ms per pass (wall, median)")
    fig.suptitle(f"Runner.forward on {runs[-1][1]['device']}, {runs[-1][1]['context']}-token context")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
