"""A/B of the FIM prompt's repository context, same positions, `ar` only.

    python benchmarks/fim_context_ab.py pypi:toolz==1.0.0 [--positions 32] [--json OUT]

Variants: `plain` (FIM, no header), `repo` (Qwen's <|repo_name|>/<|file_sep|> header, this file
only), `context` (the header plus the files the daemon adds: core.context.related_files over the
workspace, i.e. the workspace modules the file imports). Prints and writes exact-line rate, exact
middle and mean edit similarity per variant, and the mean prompt length: default target
qwen2.5-coder-0.5b, int8, multi-line completions.
"""

import argparse
import json
import platform
import sys

import torch
from tqdm import tqdm

from completiond.bench.repo import mean_scores, read_text_file, resolve_repo, sample_positions, score, source_files
from completiond.core.context import related_files
from completiond.core.engine import Engine, Request
from completiond.core.prompt import build_prompt
from completiond.models import load

VARIANTS = ("plain", "repo", "context")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("repo")
    ap.add_argument("--positions", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--target", default="qwen2.5-coder-0.5b")
    ap.add_argument("--quant", default="auto", choices=["auto", "none", "int8", "int4"])
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    root, label = resolve_repo(args.repo)
    target = load(args.target, quant=args.quant)
    engine = Engine(target, None)
    workspace = [(f.relative_to(root).as_posix(), f) for f in source_files(root)]
    pos = sample_positions(root, args.positions, "both", 0)
    variants = [v for v in VARIANTS if v in args.variants.split(",")]
    rows = {v: [] for v in variants}
    for p in tqdm(pos, desc="positions"):
        doc, off = p.document(read_text_file(p.file) or "")
        rel = p.file.relative_to(root).as_posix()
        for variant in variants:
            kw = {}  # plain: context=None
            if variant != "plain":  # the header alone (repo), or with the imported files (context)
                kw = dict(path=rel, repo=root.name,
                          context=related_files(rel, doc, [], workspace) if variant == "context" else [])
            pr = build_prompt(target.tokenizer, doc, off, multiline=True, max_tokens=2048, **kw)
            r = engine.complete(Request(prompt=pr.ids, mode="ar", max_tokens=args.max_tokens, stops=pr.stops,
                                        heal=pr.heal))
            rows[variant].append(dict(file=rel, line=p.line, col=p.col, reference=p.reference, text=r.text,
                                      prompt_tokens=len(pr.ids), context_files=[c.path for c in kw.get("context", [])],
                                      **score(r.text, p.reference)))
    summary = {}
    for v, rs in rows.items():
        n = len(rs)
        summary[v] = dict(**mean_scores(rs), mean_prompt_tokens=round(sum(r["prompt_tokens"] for r in rs) / n, 1),
                          positions_with_context=sum(bool(r["context_files"]) for r in rs))
        print(label, v, summary[v])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(command="python " + " ".join(sys.argv), repo=label, target=args.target,
                           quant=target.meta.get("quant", "none"),
                           machine=f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
                                   f"{args.threads} threads",
                           summary=summary, positions=rows), f, indent=1)


if __name__ == "__main__":
    main()
