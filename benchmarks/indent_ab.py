"""A/B of the prompt at a cursor after a line's indentation, same positions, `ar` only.

    python benchmarks/indent_ab.py pypi:toolz==1.0.0 [--positions 48] [--json OUT]

Variants: `healed` (the default: the FIM prefix stops one blank short of the cursor and the first
token must be that blank followed by code, as byte-level BPE writes an indented line) and `kept`
(the prefix ends with the whole indentation; the first token may not start with a blank). Positions:
the bench's line-start positions (seed 0) whose line is indented (at column 0 both prompts are the
same). Prints and writes exact line, exact middle and edit similarity per variant, and the
positions where the two differ. Default target qwen2.5-coder-0.5b, multi-line completions.
"""

import argparse
import json
import sys

import torch
from tqdm import tqdm

from completiond.bench.cli import machine
from completiond.bench.repo import first_line, mean_scores, read_text_file, resolve_repo, sample_positions, score
from completiond.core.engine import Engine, Request
from completiond.core.prompt import Heal, build_prompt
from completiond.models import load


def kept_heal(tokenizer) -> Heal:
    """The earlier constraint: any first token that does not start with a blank."""
    blank = {i for i in range(len(tokenizer)) if tokenizer.decode([i])[:1] in (" ", "\t")}
    return Heal("", [i for i in range(len(tokenizer)) if i not in blank])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("repo")
    ap.add_argument("--positions", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--target", default="qwen2.5-coder-0.5b")
    ap.add_argument("--quant", default="auto", choices=["auto", "none", "int8", "int4"])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    root, label = resolve_repo(args.repo)
    target = load(args.target, quant=args.quant)
    tok = target.tokenizer
    engine = Engine(target, None)
    kept = kept_heal(tok)
    pos = [p for p in sample_positions(root, 4 * args.positions, "line-start", 0) if p.col > 0][:args.positions]
    rows: dict[str, list[dict]] = {"healed": [], "kept": []}
    for p in tqdm(pos, desc="positions"):
        doc, off = p.document(read_text_file(p.file) or "")
        for variant in rows:
            pr = build_prompt(tok, doc, off, multiline=True, max_tokens=2048, heal_indent=variant == "healed")
            heal = pr.heal if variant == "healed" else kept
            r = engine.complete(Request(prompt=pr.ids, mode="ar", max_tokens=args.max_tokens, stops=pr.stops,
                                        heal=heal))
            rows[variant].append(dict(file=p.file.relative_to(root).as_posix(), line=p.line, col=p.col,
                                      reference=p.reference, text=r.text, **score(r.text, p.reference)))
    summary = {}
    for v, rs in rows.items():
        summary[v] = dict(positions=len(rs), **mean_scores(rs))
        print(label, v, summary[v])
    h, k = rows["healed"], rows["kept"]
    summary["healed_only_exact"] = sum(a["exact"] and not b["exact"] for a, b in zip(h, k))
    summary["kept_only_exact"] = sum(b["exact"] and not a["exact"] for a, b in zip(h, k))
    summary["different_first_line"] = sum(first_line(a["text"]) != first_line(b["text"]) for a, b in zip(h, k))
    print(label, {k_: summary[k_] for k_ in ("healed_only_exact", "kept_only_exact", "different_first_line")})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(command="python " + " ".join(sys.argv), repo=label, target=args.target,
                           quant=target.meta.get("quant", "none"),
                           machine=machine(target),
                           summary=summary, positions=rows), f, indent=1)


if __name__ == "__main__":
    main()
