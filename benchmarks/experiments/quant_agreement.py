"""What weight quantization does to the model: top-1 agreement and mean KL against the unquantized
target (the GGUF dequantized to bf16), teacher-forced over real code (the bench repositories' files).

    python -m benchmarks.experiments quant_agreement --json benchmarks/results/quant-agreement.json

Variants: int8; int4 as shipped (MLP int4, attention and output layer int8); int4 in every layer;
int4 with down_proj also int8; then the daemon's own picks (the runner's output layer with its
float32 refinement of the top rows) for int8 refined with full-precision rows vs with its int8 +
int8-residual rows (shipped: the untied head keeps no full-precision copy). Needs the bench repositories in the cache (run `completiond bench
--repo pypi:toolz==1.0.0` and `pypi:boltons==25.0.0` once).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from completiond.models import quant
from completiond.models.loader import load
from completiond.models.device import cpu_name
from completiond.paths import cache_root

VARIANTS = {"int8": ("int8", None), "int4": ("int4", quant.INT4_KEEP_INT8), "int4, every layer": ("int4", ()),
            "int4, down_proj int8 too": ("int4", quant.INT4_KEEP_INT8 + ("down_proj",)),
            "int4 on torch's kernel (group 32)": ("int4-torch", quant.INT4_KEEP_INT8)}
# int4 is "w4" (completiond's int4 kernel: symmetric, a scale per 128) where it runs, else torch's
# group-32 asymmetric int4; "int4-torch" forces the latter. (Named runtime forms are cached per scheme
# and int4 format only: the variants with another `keep` need --target to be a directory.)


def logits(scheme: str, keep: tuple[str, ...] | None, texts: list[str], tokens: int,
           target: str = "default") -> list[torch.Tensor]:
    saved, saved_native = quant.INT4_KEEP_INT8, quant.w4_native
    if keep is not None:
        quant.INT4_KEEP_INT8 = keep
    if scheme == "int4-torch":
        scheme, quant.w4_native = "int4", lambda: False
    try:
        t = load(target, "target", "cpu", "bfloat16", scheme)
    finally:
        quant.INT4_KEEP_INT8, quant.w4_native = saved, saved_native
    with torch.inference_mode():
        ids = [t.tokenizer.encode(x)[:tokens] for x in texts]
        return [t.model(torch.tensor([i])).logits[0].float() for i in ids if len(i) >= 64]


def refined_argmax(scheme: str, full_head: bool, texts: list[str], tokens: int, target: str = "default",
                   form: bool = False) -> list[torch.Tensor]:
    """The daemon's next-token choice, teacher-forced: the runner's output layer with its float32
    refinement of the top rows (full-precision rows, or with full_head=False int8 + residual rows).
    form: the runtime form `scheme` loads as (the daemon's weights), not quantized here."""
    from completiond.core.forward.runner import Runner

    t = load(target, "target", "cpu", "bfloat16", scheme if form else "none")
    if scheme != "none" and not form:
        quant.quantize(t.model, scheme, full_head=full_head)
    r = Runner(t, backend="transformers", refine=True)
    with torch.inference_mode():
        ids = [t.tokenizer.encode(x)[:tokens] for x in texts]
        base = getattr(t.model, t.model.base_model_prefix)
        return [r._logits(base(torch.tensor([i])).last_hidden_state[0]).argmax(-1) for i in ids if len(i) >= 64]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=768, help="tokens per file")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--target", default="default", help="the model (default: the CPU default target)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma list of " + ", ".join(VARIANTS))
    ap.add_argument("--no-picks", action="store_true", help="skip the refined-picks rows")
    ap.add_argument("--picks-int4", action="store_true",
                    help="only the refined picks of --target's int4 runtime form against its unquantized "
                         "picks and against each file's next token (no logits rows)")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    files = sorted((cache_root() / "bench-repos").glob("*[!l]/*/*.py"))[: a.files]
    if not files:
        print("quant_agreement: no bench repositories in the cache (see the docstring)", file=sys.stderr)
        return 2
    texts = [f.read_text(errors="replace") for f in files]
    if a.picks_int4:
        return picks_int4(a, files, texts)
    ref = logits("none", None, texts, a.tokens, a.target)
    n = sum(len(x) for x in ref)
    rows = {}
    for name in a.variants.split(","):
        scheme, keep = VARIANTS[name]
        got = logits(scheme, keep, texts, a.tokens, a.target)
        agree = sum((r.argmax(-1) == g.argmax(-1)).sum().item() for r, g in zip(ref, got)) / n
        kl = sum(F.kl_div(g.log_softmax(-1), r.log_softmax(-1), log_target=True, reduction="sum").item()
                 for r, g in zip(ref, got)) / n
        rows[name] = {"top1_agreement": round(agree, 4), "mean_kl": round(kl, 4)}
        print(f"{name:28} top-1 agreement {agree:.4f}  mean KL {kl:.4f}", flush=True)
    # what the daemon picks (refined top rows), against the unquantized target refined the same way
    picks = {}
    ref_pick = [] if a.no_picks else refined_argmax("none", False, texts, a.tokens)
    for name, (scheme, full) in {} if a.no_picks else {
            "int8, refined with full-precision rows": ("int8", True),
            "int8, refined with its int8 + residual rows (shipped)": ("int8", False)}.items():
        got = refined_argmax(scheme, full, texts, a.tokens)
        agree = sum((r == g).sum().item() for r, g in zip(ref_pick, got)) / n
        picks[name] = {"top1_agreement": round(agree, 4)}
        print(f"{name:44} top-1 agreement {agree:.4f} (refined picks)", flush=True)
    if a.json:
        a.json.write_text(json.dumps({
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python", *sys.argv]), "cpu": cpu_name(), "files": [f.name for f in files],
            "tokens": n, "reference": f"{a.target} (default: qwen2.5-coder-0.5b), GGUF dequantized to bf16",
            "variants": rows,
            "refined_picks": picks}, indent=1) + "\n")
    return 0


def picks_int4(a: argparse.Namespace, files: list[Path], texts: list[str]) -> int:
    """The int4 form's greedy picks (as the daemon loads it: the w4 group of this checkout) against
    the unquantized target's and against the text's next token: is int4 less often right, or only
    different?"""
    ref = refined_argmax("none", False, texts, a.tokens, a.target)
    got = refined_argmax("int4", False, texts, a.tokens, a.target, form=True)
    tok = load(a.target, "target", "cpu", "bfloat16", "none").tokenizer
    ids = [i for i in (tok.encode(x)[:a.tokens] for x in texts) if len(i) >= 64]
    nxt = torch.cat([torch.tensor(i[1:]) for i in ids])
    r, g = torch.cat([x[:-1] for x in ref]), torch.cat([x[:-1] for x in got])
    row = {"w4_group": quant.W4_GROUP, "tokens": len(nxt), "agreement": round((r == g).float().mean().item(), 4),
           "next_token_top1": round((g == nxt).float().mean().item(), 4),
           "next_token_top1_unquantized": round((r == nxt).float().mean().item(), 4)}
    print(json.dumps(row))
    if a.json:
        a.json.write_text(json.dumps({
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python", *sys.argv]), "cpu": cpu_name(), "files": [f.name for f in files],
            "reference": f"{a.target}, GGUF dequantized to bf16, refined picks", "int4_refined_picks": row},
            indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
