"""Cold prefill time by prompt length on the default target (the quick prompt's and the full
prompt's cost: README, Daemon, "Quick prompt"). Each length is prefilled from an empty cache the way
a completion does (256-token chunks, int8 weights dequantized per chunk), twice; the faster counts.

    python -m benchmarks.experiments prefill_cost --threads 2 --json benchmarks/results/prefill-cost.json

--bulk-dtypes model,float32 measures, side by side (interleaved per length), prefill chunks
multiplied in the model's dtype and widened to float32 (`LoadedModel.bulk_dtype`: what a CPU
whose bf16 matmuls are slow over many rows gets), and how far their last logits differ.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]

from completiond.core.engine import Engine  # noqa: E402
from completiond.models.loader import load  # noqa: E402
from completiond.models.device import cpu_features, cpu_name  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-0.5b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lengths", default="128,256,512,1024,2048")
    ap.add_argument("--bulk-dtypes", default="", help="comma list of model,float32 (default: what the loader picked)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    target = load(a.target, "target", "auto", "auto", "auto")
    engine = Engine(target)
    text = (ROOT / "completiond" / "core" / "engine.py").read_text()
    ids = target.tokenizer.encode(text * 4, add_special_tokens=False)
    engine.warm(ids[:64])  # first-call costs out of the way
    picked = target.bulk_dtype
    dtypes = {name: (target.dtype if name == "model" else getattr(torch, name))
              for name in (a.bulk_dtypes.split(",") if a.bulk_dtypes else [str(picked).replace("torch.", "")])}
    rows: dict = {}
    for n in (int(x) for x in a.lengths.split(",")):
        last = {}
        for name, dt in dtypes.items():
            target.bulk_dtype = dt
            best = float("inf")
            for _ in range(2):
                engine.runner.reset()
                t = time.perf_counter()
                engine.warm(ids[:n])
                best = min(best, (time.perf_counter() - t) * 1000)
            engine.runner.rollback(n - 1)
            last[name] = engine.runner.extend(ids[:n])  # the last token's logits through a one-token pass
            row = {"ms": round(best, 1), "tokens_per_s": round(n / best * 1000, 1)}
            rows.setdefault(name, {})[n] = row
            print(n, name, row, flush=True)
        if len(last) == 2:
            x, y = last.values()
            rows.setdefault("logits_diff", {})[n] = {"max_abs": round(float((x - y).abs().max()), 4),
                                                     "same_argmax": bool(x.argmax() == y.argmax())}
    target.bulk_dtype = picked
    if len(dtypes) == 1:
        rows = next(iter(rows.values()))
    out = {"date": datetime.date.today().isoformat(), "command": " ".join(["python"] + sys.argv),
           "cpu": cpu_name(), "cpu_features": cpu_features(), "bulk_dtype": str(picked), "threads": a.threads, "target": target.name,
           "quant": target.meta.get("quant"), "prefill": rows}
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
