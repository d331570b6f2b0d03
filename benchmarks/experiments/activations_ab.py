"""A/B of the int8 kernel's activations, float32 (int8_mm.c) vs rounded to int16 (a16_mm.c), on
the real default target: what the rounding changes in completions, and what it saves in time.

    python -m benchmarks.experiments activations_ab pypi:toolz==1.0.0 [--positions 24] [--json OUT]

Same positions as the bench (seed 0, line-start and mid-line cursors), `ar` only, each from the
bench's warm cache (the prompt minus its last 8 tokens cached once and shared by both variants; each
variant prefills those 8 tokens and decodes with its own kernel). Variants alternate which runs first
per position. Prints and writes: completions identical token for token, where the others part,
exact line / edit similarity per variant, and first-token and per-token times side by side.
"""

import argparse
import json
import statistics
import sys

import torch
from tqdm import tqdm

from completiond.bench.cli import machine
from completiond.bench.modes import warm
from completiond.bench.repo import mean_scores, read_text_file, resolve_repo, sample_positions, score
from completiond.models.kernels import cpu_kernel
from completiond.core.engine import Engine, Request
from completiond.core.prompt import build_prompt
from completiond.models.loader import load

VARIANTS = {"float32": "float32", "int16": "int16"}  # cpu_kernel.ACTIVATIONS also has "int8"


def use(acts: str) -> None:
    """Every int8 matmul of this process with these activations (QuantLinear and the native layer
    ask cpu_kernel.kind() on every pass)."""
    cpu_kernel.activations = lambda: acts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("repo")
    ap.add_argument("--positions", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--target", default="qwen2.5-coder-0.5b")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    root, label = resolve_repo(args.repo)
    target = load(args.target, quant="int8")
    engine = Engine(target, None)
    if getattr(engine.runner.base, "native", None) is None:
        sys.exit("activations_ab: needs completiond's int8 kernel and the native Qwen2 layer on this CPU")
    tok = target.tokenizer
    rows: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for i, p in enumerate(tqdm(sample_positions(root, args.positions, "both", 0), desc="positions")):
        doc, off = p.document(read_text_file(p.file) or "")
        rel = p.file.relative_to(root).as_posix()
        pr = build_prompt(tok, doc, off, multiline=True, max_tokens=2048, path=rel, repo=root.name)  # as the bench
        order = list(VARIANTS) if i % 2 == 0 else list(VARIANTS)[::-1]
        for v in order:
            use(VARIANTS[v])
            warm(engine, pr.ids)
            r = engine.complete(Request(prompt=pr.ids, mode="ar", max_tokens=args.max_tokens, stops=pr.stops,
                                        heal=pr.heal))
            rows[v].append(dict(file=rel, line=p.line, col=p.col, kind=p.kind,
                                reference=p.reference, text=r.text, token_ids=r.token_ids,
                                ms_first_token=round(r.ms_first_token, 2), ms_total=round(r.ms_total, 2),
                                **score(r.text, p.reference)))
    a, b = rows["float32"], rows["int16"]
    parted = []
    for x, y in zip(a, b):
        if x["token_ids"] != y["token_ids"]:
            k = next((j for j, (s, t) in enumerate(zip(x["token_ids"], y["token_ids"])) if s != t),
                     min(len(x["token_ids"]), len(y["token_ids"])))
            parted.append(dict(file=x["file"], line=x["line"], at_token=k, float32=x["text"], int16=y["text"]))
    summary: dict = {"positions": len(a), "identical": len(a) - len(parted), "parted": parted}
    for v, rs in rows.items():
        later = [(r["ms_total"] - r["ms_first_token"]) / (len(r["token_ids"]) - 1) for r in rs if len(r["token_ids"]) > 1]
        summary[v] = dict(**mean_scores(rs), p50_first_token_ms=round(statistics.median(r["ms_first_token"] for r in rs), 1),
                          p50_ms_per_later_token=round(statistics.median(later), 1),
                          tokens_per_s=round(sum(len(r["token_ids"]) for r in rs) / sum(r["ms_total"] for r in rs) * 1000, 2))
    summary["int16_over_float32"] = {k: round(summary["int16"][k] / summary["float32"][k], 3)
                                     for k in ("p50_first_token_ms", "p50_ms_per_later_token")}
    print(label, json.dumps({k: v for k, v in summary.items() if k != "parted"}, indent=1))
    for d in parted:
        print(f"  parted at token {d['at_token']}: {d['file']}:{d['line']}  float32={d['float32']!r}  int16={d['int16']!r}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(command="python " + " ".join(sys.argv), repo=label, target=args.target,
                           machine=machine(target), summary=summary, positions=rows), f, indent=1)


if __name__ == "__main__":
    main()
