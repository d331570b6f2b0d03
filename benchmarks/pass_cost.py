"""Target pass cost by tree size, per backend x weights, side by side in one process.

Every variant holds the same context length in its KV cache (random K/V: a pass's cost does not
depend on the values, and prefilling 1.5k tokens per variant would dominate the run), then runs a
tree of n nodes with logits at every node, as verification does, and rolls it back. Sizes and
variants are interleaved rep by rep so that this shared machine's noise hits them alike; each cell
is the fastest of at least --min-reps passes (contention only ever adds time).
Variants: backend (transformers / lean) x weights (bf16, fp32, int8, int4: weight-only, bf16
activations, completiond.models.quant), plus the lean int8/int4 target with the exact cheap head,
and where completiond's int8 kernel runs, the lean int8 target on torch's kernel (before/after),
as torch ops around completiond's kernel where the native Qwen2 layer runs (before/after), and
on every matmul kind of completiond's kernel this CPU runs (`lean/int8 [kind]`: float32, int16 or
int8 activations, on the AVX2 loop or AVX512-VNNI sums; --kinds picks them).

--kernels-only keeps just those `lean/int8 [kind]` variants of the product's int8 model (its
output layer refined as the daemon does), each cell's ratio to the same variant's one-node pass:
the old and new kernels side by side.

    python -m benchmarks.pass_cost --random-0.5b --threads 1 --clock cpu \
        --json benchmarks/results/pass-cost-random-0.5b.json --plot benchmarks/results/pass-cost-random-0.5b.png
    python -m benchmarks.pass_cost --target qwen2.5-coder-1.5b --kernels-only --threads 2 ...
    python -m benchmarks.pass_cost --model PATH ...     # a local HF model directory
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from completiond.models import quant
from completiond.models.kernels import cpu_kernel
from completiond.models.loaded import LoadedModel
from completiond.core.forward.runner import Runner
from completiond.paths import cache_root

SIZES = [1, 2, 4, 8, 16, 32, 64]
TORCH_KERNEL = "lean/int8 (torch kernel)"  # int8 on aten._weight_int8pack_mm where completiond's kernel runs
TORCH_OPS = "lean/int8 (torch ops)"  # completiond's kernel inside torch ops, where the native Qwen2 layer runs


def kind_variant(kind: str, weights: str = "int8") -> str:
    return f"lean/{weights} [{kind}]"


@contextlib.contextmanager
def use_kind(kind: str | None):
    """Run int8 matmuls on this kernel kind inside (QuantLinear and the native layer ask
    cpu_kernel.kind() every pass; a real process picks one kind for good)."""
    if kind is None:
        yield
        return
    saved = cpu_kernel.kind
    cpu_kernel.kind = lambda: kind
    try:
        yield
    finally:
        cpu_kernel.kind = saved


@contextlib.contextmanager
def torch_kernel(on: bool):
    """Run int8 layers on torch's kernel inside (only for this side-by-side: a real process picks
    one kernel for good, which greedy identity needs)."""
    if not on:
        yield
        return
    saved = cpu_kernel.enabled
    cpu_kernel.enabled = lambda: False
    try:
        yield
    finally:
        cpu_kernel.enabled = saved


def random_05b() -> torch.nn.Module:
    """A Qwen2 with Qwen2.5-Coder-0.5B's shapes and random weights (tied head)."""
    from transformers import AutoModelForCausalLM, Qwen2Config
    cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                      num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                      rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.bfloat16).eval()


def cpu_info() -> dict:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        out = ""
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    return {"model": fields.get("Model name", platform.processor()).strip(), "cores": os.cpu_count(),
            "avx512_bf16": "avx512_bf16" in flags, "amx": "amx_tile" in flags, "torch": torch.__version__}


def fill_cache(r: Runner, context: int) -> None:
    """Make the runner's cache hold `context` committed slots of random K/V (token ids all 0)."""
    cfg = r.model.config
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    r.cache.reserve(context + 2 * max(SIZES))
    g = torch.Generator().manual_seed(0)
    for i in range(cfg.num_hidden_layers):
        kv = torch.randn(1, cfg.num_key_value_heads, context, d, generator=g).to(r.device, r.lm.dtype)
        r.cache.pending = 0
        r.cache.update(kv, kv, i)
    r.cache.length = context
    r.tokens = [0] * context


def tree(n: int) -> list[int]:
    """Parents of an n-node tree as the product builds them: a chain with branches (node i under (i-1)//2)."""
    return [-1] + [(i - 1) // 2 for i in range(1, n)]


def kernel_row(heads: dict[str, tuple[torch.nn.Module, torch.dtype]], clock) -> dict:
    """ms of one output-layer matmul at one row, per weights and activation dtype (the fp32-activation
    path of the low-bit kernels is the slow one)."""
    out = {}
    for name, (head, dtype) in heads.items():
        x = torch.randn(1, head.in_features if hasattr(head, "in_features") else head.weight.shape[1]).to(dtype)
        head(x)
        ts = []
        for _ in range(3):
            t0 = clock()
            head(x)
            ts.append((clock() - t0) * 1000)
        out[name] = round(min(ts), 2)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", type=Path, help="a local HF model directory")
    src.add_argument("--random-0.5b", dest="random", action="store_true", help="Qwen2.5-Coder-0.5B shapes, random weights")
    src.add_argument("--target", help="a converted target in completiond's cache (e.g. qwen2.5-coder-1.5b)")
    ap.add_argument("--kernels-only", action="store_true",
                    help="only the int8 model on each kernel kind, ratios to each variant's one-node pass")
    ap.add_argument("--kinds", default="", help="kernel kinds to run side by side (default: every kind this CPU runs)")
    ap.add_argument("--quants", default="int8",
                    help="--kernels-only with --target: the runtime forms to run side by side (int8,int4; "
                         "int4's MLPs run completiond's int4 kernel, its attention each kind)")
    ap.add_argument("--context", type=int, default=1536)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--reps", type=int, default=5, help="most timed passes per cell (the median drops a first-call outlier)")
    ap.add_argument("--min-reps", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=220, help="stop adding reps after this many seconds")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="cpu: process CPU time, steadier on a shared machine (use with --threads 1)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path)
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    t_start = time.perf_counter()

    runtime_form = False
    if args.target:
        args.model = cache_root() / "models" / args.target
        # a named target loads from its runtime form (mapped, already int8) once the float checkpoint
        # is gone from models/; --kernels-only needs no more than that
        runtime_form = args.kernels_only and not args.model.is_dir()
    forms, metas = {}, {}
    args.weights = {}
    if runtime_form:
        from completiond.models import loader, pages
        for q in args.quants.split(","):
            loaded = loader.load(args.target, quant=q)
            forms[q] = loaded.model
            metas[q] = loaded.meta
        pages.settle()  # passes timed over the weights in 2 MB pages, as a daemon's once moved
        for q, meta in metas.items():  # where the move found no 2 MB pages, a pass reads more 4 KB ones
            args.weights[q] = meta.get("weights", "?")
            print(f"{args.target} {q} weights: {args.weights[q]}", file=sys.stderr)
        bf16, name = forms[args.quants.split(",")[0]], args.target
    elif args.random:
        bf16, name = random_05b(), "random Qwen2.5-Coder-0.5B shapes"
    else:
        if not args.model.is_dir():
            print(f"pass_cost: no model directory at {args.model}", file=sys.stderr)
            return 2
        from transformers import AutoModelForCausalLM
        bf16 = AutoModelForCausalLM.from_pretrained(str(args.model), dtype=torch.bfloat16, attn_implementation="sdpa").eval()
        name = args.target or str(args.model)
    # int8-weight kinds (the w4 kinds are int4 weights' own: an int4 form's MLPs always run one)
    kinds = [k for k in args.kinds.split(",") if k] or [k for k in cpu_kernel.kinds_here() if not k.startswith("w4")]
    if args.kernels_only:
        if not cpu_kernel.enabled():
            print("pass_cost: --kernels-only needs completiond's int8 kernel", file=sys.stderr)
            return 2
        if not runtime_form:  # as the daemon loads it (no full-precision copy of an untied head)
            quant.quantize(bf16, "int8")
        models = forms or {"int8": bf16}
    else:
        models = {"bf16": bf16, "fp32": copy.deepcopy(bf16).float()}
        for scheme in quant.SCHEMES:
            m = copy.deepcopy(bf16)
            quant.quantize(m, scheme, full_head=True)  # the cheap-head runner needs it
            models[scheme] = m
    print(f"models ready in {time.perf_counter() - t_start:.0f} s", file=sys.stderr)

    runners: dict[str, Runner] = {}
    variant_kind: dict[str, str] = {}
    for weights, m in models.items():
        lm = LoadedModel(name=name, model=m, tokenizer=None, device=torch.device("cpu"), dtype=loaded.dtype if runtime_form else next(m.parameters()).dtype)
        if (weights == "int8" or args.kernels_only) and cpu_kernel.enabled():  # each kernel kind on the same weights
            for k in kinds:
                runners[kind_variant(k, weights)] = Runner(lm, capacity=args.context + 256, backend="lean")
                variant_kind[kind_variant(k, weights)] = k
        if args.kernels_only:
            continue
        for backend in ("transformers", "lean"):
            runners[f"{backend}/{weights}"] = Runner(lm, capacity=args.context + 256, backend=backend)
        if weights in quant.SCHEMES:
            runners[f"lean/{weights}+cheap-head"] = Runner(lm, capacity=args.context + 256, backend="lean", cheap_head=True)
        if weights == "int8" and cpu_kernel.enabled():  # the same weights on torch's kernel, for before/after
            runners[TORCH_KERNEL] = Runner(lm, capacity=args.context + 256, backend="lean")
            runners[TORCH_KERNEL].base.native = None  # the native layer would call completiond's kernel
        if weights == "int8" and getattr(runners["lean/int8"].base, "native", None) is not None:
            runners[TORCH_OPS] = Runner(lm, capacity=args.context + 256, backend="lean")
            runners[TORCH_OPS].base.native = None  # each layer as torch ops around the same kernel
    for r in runners.values():
        fill_cache(r, args.context)

    times: dict[str, dict[int, list[float]]] = {v: {n: [] for n in sizes} for v in runners}
    kept: dict[str, dict[int, list[int]]] = {v: {n: [] for n in sizes} for v in runners}
    g = torch.Generator().manual_seed(1)
    for rep in range(args.reps):
        if rep >= args.min_reps and time.perf_counter() - t_start > args.budget_s:
            break
        for n in sizes:
            ids = torch.randint(0, bf16.config.vocab_size, (n,), generator=g).tolist()
            for v, r in runners.items():
                with torch_kernel(v == TORCH_KERNEL), use_kind(variant_kind.get(v)):
                    t0 = clock()
                    logits = r.forward(ids, tree(n), range(n))
                    times[v][n].append((clock() - t0) * 1000)
                r.rollback(args.context)
                kept[v][n].append(int(logits.isfinite().sum(-1).max()))
        print(f"rep {rep} done at {time.perf_counter() - t_start:.0f} s", file=sys.stderr)

    # The fastest pass of each cell: contention on a shared machine only ever adds time.
    ms = {v: {n: round(min(t), 2) for n, t in by.items() if t} for v, by in times.items()}
    median = {v: {n: round(statistics.median(t), 2) for n, t in by.items() if t} for v, by in times.items()}
    if args.kernels_only:  # each variant against its own one-node pass
        base = "the same variant's one-node pass"
        ratio = {v: {n: round(ms[v][n] / ms[v][sizes[0]], 3) for n in ms[v]} for v in ms}
    else:
        base = "transformers/bf16"
        ratio = {v: {n: round(ms[v][n] / ms[base][n], 3) for n in ms[v]} for v in ms}
    print(f"\nms per pass ({args.clock} clock, fastest of the reps) after {args.context} tokens of context "
          f"({name}; {cpu_info()['model']}, {torch.get_num_threads()} threads); ratio to {base} in brackets")
    print(f"{'variant':32s}" + "".join(f"{n:>14d}" for n in sizes))
    for v in runners:
        cells = "".join(f"{ms[v][n]:>8.1f} ({ratio[v][n]:.2f})" for n in sizes)
        print(f"{v:32s}{cells}")
    if args.kernels_only:
        return finish(args, sizes, name, variant_kind, ms, median, ratio, base, times, t_start)
    heads = {"bf16": (models["bf16"].get_output_embeddings(), torch.bfloat16),
             "fp32": (models["fp32"].get_output_embeddings(), torch.float32)}
    for scheme in quant.SCHEMES:
        for dt in (torch.bfloat16, torch.float32):
            heads[f"{scheme} weights, {str(dt)[6:]} activations"] = (models[scheme].get_output_embeddings(), dt)
    kernels = kernel_row(heads, clock)
    print("output layer, one row (ms):", kernels)
    cheap_rows = {v: {n: max(k) for n, k in by.items() if k} for v, by in kept.items() if "cheap" in v}
    print("cheap head, most rows recomputed for one node:", cheap_rows)
    fallbacks = {s: f"{models[s].get_output_embeddings().exact_fallbacks}/{models[s].get_output_embeddings().exact_calls}"
                 for s in quant.SCHEMES}
    print("cheap head passes that ran the bf16 head because over 1/4 of the vocabulary could win:", fallbacks)

    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]), "model": name, "cpu": cpu_info(),
        "context": args.context, "sizes": sizes, "tree": "node i under node (i-1)//2, logits at every node",
        "cache": "random K/V for the context (pass cost does not depend on the values)",
        "int8_kernel": cpu_kernel.name(), "torch_kernel_variant": TORCH_KERNEL, "torch_ops_variant": TORCH_OPS,
        "kind_variants": {v: k for v, k in variant_kind.items()},
        "native_layer": "lean/int8 runs each Qwen2 layer in one C call (models/kernels/qwen2_layer.c) where "
                        f"{TORCH_OPS} is listed",
        "quantization": {"int8": f"per-output-channel symmetric, {cpu_kernel.name()} kernel",
                         "int4": f"group {quant.INT4_GROUP} asymmetric, aten._weight_int4pack_mm_for_cpu",
                         "activations": "bf16 (the model dtype); embeddings stay bf16"},
        "refine": "top-8 float32 refinement on (the target's setting)",
        "clock": args.clock, "threads": torch.get_num_threads(), "load_average": list(os.getloadavg()),
        "ms_per_pass": ms, "ms_per_pass_median": median, "ratio_to": base,
        "ratio": ratio,
        "reps": {v: {n: len(t) for n, t in by.items()} for v, by in times.items()},
        "output_layer_one_row_ms": kernels,
        "cheap_head_max_rows_recomputed": cheap_rows,
        "cheap_head_fallbacks_to_dense_head": fallbacks,
        "note": "random weights give flat next-token distributions: the cheap head's rows and fallbacks "
                "say little about a trained model",
        "wall_s": round(time.perf_counter() - t_start, 1),
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.plot:
        plot(result, args.plot)
    return 0


def finish(args, sizes: list[int], name: str, variant_kind: dict[str, str], ms: dict, median: dict, ratio: dict, base: str,
           times: dict, t_start: float) -> int:
    """--kernels-only: the JSON and plot of the kernel kinds side by side."""
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python", *sys.argv]), "model": name, "cpu": cpu_info(),
        "context": args.context, "sizes": sizes, "tree": "node i under node (i-1)//2, logits at every node",
        "cache": "random K/V for the context (pass cost does not depend on the values)",
        "int8_kernel_chosen_here": cpu_kernel.name(), "kind_variants": variant_kind,
        "kinds": {"float32": "int8_mm.c, float32 activations", "int16": "a16_mm.c, int16 activations (vpmaddwd)",
                  "int16+avx512-vnni": "a16_mm.c on AVX512-VNNI vpdpwssd (same bits as int16)",
                  "int8": "a8_mm.c, int8 activations (vpmaddubsw)",
                  "int8+avx512-vnni": "a8_mm.c on AVX512-VNNI vpdpbusd (same bits as int8)",
                  "int8+avx-vnni": "a8_mm.c on AVX-VNNI vpdpbusd (same bits as int8)"},
        "model_setup": "int8 weights (quant.quantize, as the daemon loads them), lean backend with the native "
                       "Qwen2 layer, output layer on the same kernel with the top-8 float32 refinement; "
                       "lean/int4 variants: the --quant int4 runtime form, MLPs int4 on w4_mm.c "
                       f"({cpu_kernel.w4_kind()}: int8 activations, a scale per 128 weights), attention "
                       "and output layer int8 on the variant's kind",
        "quants": args.quants, "weights": args.weights,
        "clock": args.clock, "threads": torch.get_num_threads(), "load_average": list(os.getloadavg()),
        "shared_machine": "other jobs ran on this 2-core machine at the same time (load_average); "
                          "variants and sizes interleaved rep by rep, fastest rep per cell",
        "ms_per_pass": ms, "ms_per_pass_median": median, "ratio_to": base, "ratio": ratio,
        "reps": {v: {n: len(t) for n, t in by.items()} for v, by in times.items()},
        "wall_s": round(time.perf_counter() - t_start, 1),
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.plot:
        plot(result, args.plot)
    return 0


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5))
    for v, by in result["ms_per_pass"].items():
        xs = [int(n) for n in by]
        style = "-" if v.startswith("lean") else "--"
        a.plot(xs, list(by.values()), style, marker="o", label=v)
        b.plot(xs, list(result["ratio"][v].values()), style, marker="o", label=v)
    for ax, title in ((a, "ms per pass"), (b, f"relative to {result['ratio_to']}")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tree nodes")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    a.set_yscale("log")
    b.legend(fontsize=7)
    fig.suptitle(f"{result['model']}, {result['context']}-token context, {result['cpu']['model']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
