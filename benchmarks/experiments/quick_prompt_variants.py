"""The engine's quality (greedy `ar`, the bench's scoring) at the bench's positions with quick-prompt
variants, one engine, every variant at each position in turn:

    q:N   build_prompt(max_tokens=N): the quick prompt of N tokens (the daemon's is q:256)
    o:N   the same with outline=True (imports and enclosing headers first: core/prompt/outline.py)
    e:N   q:N with echo=True (what followed the line above the cursor elsewhere: outline.echoes)
    oe:N  both outline and echo
    m:N   q:N built where the replay's typing starts (bench/replay.py typing_plan), the typed text then
          added after <fim_middle> as the daemon's lanes add it (prompt.extend_middle)
    sK:N  q:N with the suffix's share 1/K of the budget instead of 1/4 (s0:N: no suffix)
    full:N  the same builder, the engine bench's prompt (N=2048)

    python -m benchmarks.experiments.quick_prompt_variants --repo pypi:more-itertools==11.2.1 \\
        --target qwen2.5-coder-0.5b --positions 12 --max-tokens 32 --variants q:256,o:256,q:512 --out OUT.json

The JSON is rewritten after every position (a cut run keeps what it measured). `ms` per row is the
completion's wall time with its whole prefill (each variant has its own cached sequence).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from completiond.bench.modes import BenchPrompt, index_repo, open_position
from completiond.bench.repo import read_text_file, resolve_repo, sample_positions, score
from completiond.core.engine import Engine, Request
from completiond.bench.replay import typing_plan
from completiond.core.prompt import build_prompt, extend_middle
from completiond.models.loader import load


def _typed_into_middle(tok, p, doc: str, offset: int, n: int, rel: str, repo: str, pr):
    """The prompt the daemon extends while the replay types to `offset`: built on the document as
    opened, at the typing's start, the keystrokes added after <fim_middle> (handlers.build_completion)."""
    typed = "".join(typing_plan(p, read_text_file(p.file) or "")[2])
    opened, start = doc[:offset - len(typed)] + doc[offset:], offset - len(typed)
    anchor = build_prompt(tok, opened, start, multiline=True, max_tokens=n, path=rel, repo=repo)
    line_head = doc[doc.rfind("\n", 0, offset) + 1:offset]
    ids, heal = extend_middle(tok, anchor.ids, (anchor.heal.text if anchor.heal else "") + typed,
                              heal_last=bool(line_head.strip()))
    return dataclasses.replace(pr, ids=ids, heal=heal)


def _suffix_share(name: str) -> float:
    if not name.startswith("s"):
        return 0.25
    k = int(name[1:])
    return 1 / k if k else 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", required=True)
    ap.add_argument("--target", default="qwen2.5-coder-0.5b")
    ap.add_argument("--positions", type=int, default=16)
    ap.add_argument("--variants", default="full:2048,q:256,o:256,q:512")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    root, label = resolve_repo(a.repo)
    target = load(a.target, "target", "cpu", a.dtype, "auto")
    engine = Engine(target, None)
    engine.calibrate_cached()
    tok = target.tokenizer
    files = index_repo(engine, root)
    positions = sample_positions(root, a.positions, "both", 0)  # the bench's (seed 0)
    variants = [v.split(":") for v in a.variants.split(",")]
    rows: dict[str, list[dict]] = {v: [] for v in a.variants.split(",")}
    current = None
    for i, p in enumerate(positions):
        doc, offset = p.document(read_text_file(p.file) or "")
        rel = p.file.relative_to(root).as_posix()
        for name, n in variants:
            pr = build_prompt(tok, doc, offset, multiline=True, max_tokens=int(n), path=rel, repo=root.name,
                              outline="o" in name, echo="e" in name, suffix_share=_suffix_share(name))
            if name == "m":
                pr = _typed_into_middle(tok, p, doc, offset, int(n), rel, root.name, pr)
            bench_prompt = BenchPrompt(pr.ids, doc, pr.stops, p.reference, p.file, heal=pr.heal)
            current = open_position(engine, files, bench_prompt, current)
            t0 = time.perf_counter()
            res = engine.complete(Request(prompt=pr.ids, mode="ar", max_tokens=a.max_tokens, stops=pr.stops,
                                          heal=pr.heal, slot=("variant", name, n)))
            s = score(res.text, p.reference)
            rows[f"{name}:{n}"].append({"pos": i, "len": len(pr.ids), "ms": round((time.perf_counter() - t0) * 1000),
                                        "exact": s["exact"], "sim": round(s["similarity"], 3), "text": res.text[:80],
                                        "ref": p.reference})
        print(i, {k: (v[-1]["exact"], v[-1]["len"], v[-1]["ms"]) for k, v in rows.items()}, flush=True)
        summary = {k: {"positions": len(v), "exact_line": round(sum(x["exact"] for x in v) / len(v), 3),
                       "edit_sim": round(sum(x["sim"] for x in v) / len(v), 3),
                       "prompt_tokens_mean": round(sum(x["len"] for x in v) / len(v))} for k, v in rows.items()}
        if a.out:
            Path(a.out).write_text(json.dumps({"repo": label, "target": a.target, "dtype": a.dtype,
                                               "max_tokens": a.max_tokens, "positions": i + 1, "summary": summary,
                                               "rows": rows}, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
