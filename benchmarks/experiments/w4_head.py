"""The int4 target's output layer in w4 against the int8 one it replaced, side by side in one process.

Speed: whole verify passes of the int4 target with either head, swapped rep by rep (the int8 one is
the int8 form's: the head the int4 form held before), on a KV cache of --context random slots, ms per
pass at each tree size (fastest and median of the reps). Quality: the refined argmax of both heads
on the same final hidden states, teacher-forced over --files (held-out code), in chunks of 64 tokens:
how often it moves, and the int8 head's top-2 gap there.

    python -m benchmarks.experiments w4_head --files /usr/lib/python3.11/{json/decoder.py,argparse.py,csv.py} \
        --json benchmarks/results/w4head/head-ab-1.5b.json --plot benchmarks/results/w4head/head-ab-1.5b.png
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

import torch

from completiond.core.forward.runner import Runner
from completiond.models.loader import load
from benchmarks.pass_cost import cpu_info, fill_cache, tree


def speed(lm, heads: dict, context: int, sizes: list[int], reps: int) -> dict:
    r = Runner(lm, context + 256, backend="lean")
    fill_cache(r, context)
    ms: dict[tuple[str, int], list[float]] = {(h, n): [] for h in heads for n in sizes}
    for rep in range(reps + 1):  # rep 0 warms each kernel up
        for h, head in heads.items():
            lm.model.lm_head = head
            for n in sizes:
                done = r.run_pass([i * 7919 % 150000 for i in range(n)], tree(n), range(n))
                if rep:
                    ms[h, n].append(done.ms)
                r.rollback(context)
    out = {}
    for n in sizes:
        cell = {h: {"min": round(min(ms[h, n]), 2), "median": round(statistics.median(ms[h, n]), 2)} for h in heads}
        cell["w4_over_int8_median"] = round(cell["w4"]["median"] / cell["int8"]["median"], 3)
        out[str(n)] = cell
        print(f"{n} nodes: w4 {cell['w4']} int8 {cell['int8']} ratio {cell['w4_over_int8_median']}", flush=True)
    return out


def agreement(lm, heads: dict, files: list[Path]) -> dict:
    r = Runner(lm, 1200, backend="lean")
    tok = lm.tokenizer
    same = moved = 0
    gaps = []
    for f in files:
        ids = tok.encode(f.read_text(), add_special_tokens=False)[:1024]
        r.reset()
        r.extend(ids[:1])
        for c in range(1, len(ids) - 64, 64):
            lm.model.lm_head = heads["int8"]
            done = r.run_pass(ids[c:c + 64], [-1] + list(range(63)), range(64))
            a8 = done.logits  # [64, V], refined
            lm.model.lm_head = heads["w4"]
            a4 = r._logits(done.hidden)
            for i in (a8.argmax(-1) != a4.argmax(-1)).nonzero().flatten().tolist():
                top2 = a8[i].topk(2).values
                gaps.append(round(float(top2[0] - top2[1]), 5))
            moved += int((a8.argmax(-1) != a4.argmax(-1)).sum())
            same += int((a8.argmax(-1) == a4.argmax(-1)).sum())
            r.keep(list(range(64)))
    print(f"{same + moved} positions: argmax moved at {moved}; int8-head top-2 gaps there {sorted(gaps)}")
    return {"positions": same + moved, "moved": moved, "moved_share": round(moved / max(1, same + moved), 6),
            "int8_top2_gaps_where_moved": sorted(gaps), "files": [str(f) for f in files]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=2000)
    ap.add_argument("--sizes", default="1,2,4,8")
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--files", type=Path, nargs="*", default=[])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    lm = load(a.target, quant="int4")
    heads = {"w4": lm.model.lm_head, "int8": load(a.target, quant="int8").model.lm_head}
    if heads["w4"].scheme != "w4":
        print("this CPU runs int4 on torch's kernel: the int4 target's head is int8 here", file=sys.stderr)
        return 1
    out = {"command": "python " + " ".join(sys.argv), "date": datetime.date.today().isoformat(), "cpu": cpu_info(),
           "target": a.target, "threads": a.threads, "context": a.context, "reps": a.reps,
           "ms_per_pass": speed(lm, heads, a.context, [int(s) for s in a.sizes.split(",")], a.reps)}
    if a.files:
        out["agreement"] = agreement(lm, heads, a.files)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=2) + "\n")
    if a.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        sizes = list(out["ms_per_pass"])
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for j, h in enumerate(("int8", "w4")):
            ax.bar([i + 0.4 * j for i in range(len(sizes))], [out["ms_per_pass"][s][h]["median"] for s in sizes],
                   0.4, label=f"{h} output layer")
        ax.set_xticks([i + 0.2 for i in range(len(sizes))], sizes)
        ax.set_xlabel("tree nodes")
        ax.set_ylabel("ms per pass (median)")
        ax.set_title(f"{a.target} int4, {a.context} tokens of context, {a.threads} threads")
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.plot, dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
