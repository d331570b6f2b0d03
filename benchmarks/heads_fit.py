"""How well trained heads fit their own training positions against held-out ones (issue 16): top-1
agreement with the target's greedy token on the first N training positions of a `features.pt` and
on all its held-out positions, per step, by `draft.heads.Task.agreement` (what training reports).
A small gap with low agreement means too little capacity; a large gap, too little data.

    python benchmarks/heads_fit.py --features /tmp/heads-400k/features.pt \\
        --heads completiond/draft/head_weights/qwen2.5-coder-0.5b.eagle.safetensors \\
        --json benchmarks/results/heads/fit-eagle-400k.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

from completiond.core.heads import load_heads
from completiond.core.quant import full_weight
from completiond.draft.heads import Task
from completiond.models import load
from completiond.models.device import cpu_name


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--features", type=Path, required=True, help="features.pt of `train-draft heads --out`")
    ap.add_argument("--heads", type=Path, nargs="+", required=True, help="heads files (safetensors)")
    ap.add_argument("--target", default="qwen2.5-coder-0.5b")
    ap.add_argument("--train-positions", type=int, default=40_000)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    target = load(a.target, "target", "cpu", "auto", "auto")
    data = torch.load(a.features)
    train = {k: v[:a.train_positions] for k, v in data["train"].items()}
    embed = target.model.get_input_embeddings().weight.detach().to(torch.bfloat16)
    out = {"date": datetime.date.today().isoformat(), "command": " ".join(["python"] + sys.argv),
           "cpu": cpu_name(), "target": target.name, "heads": {}}
    for path in a.heads:
        heads, _ = load_heads(path)
        rows = full_weight(target.model.get_output_embeddings()).detach()[heads.vocab].to(torch.bfloat16)
        k = getattr(heads, "k", 0)
        out["heads"][str(path)] = row = {
            split: Task(heads.kind, part, heads.vocab, target.vocab_size, k, rows, embed).agreement(heads)
            for split, part in (("train", train), ("heldout", data["heldout"]))}
        print(path.name, json.dumps(row), flush=True)
    if a.json:
        a.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
