"""Typed-through on real code: a suggestion at the start of a line, then the file's real line typed
character by character. For each keystroke while the typed text is a prefix of the suggestion, the
request from Engine.typed_prompt: served tokens, target passes, engine ms. Also whether the prompt the
daemon builds today (FIM, from the edited text) is an exact-id extension (what Engine.complete alone
would serve). Real Qwen2.5-Coder-0.5B, serve defaults (bf16 + int8, lean).

    python benchmarks/typed_replay.py THREADS [LINES] [code]

LINES (default 6) lines are picked from every 25th longer line, or with `code`, from every 6th line
that starts a statement (self., return, if, for, while, elif)."""
import json, statistics, sys, sysconfig
from pathlib import Path
import torch
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
from completiond.core.engine import Engine, Request
from completiond.core.prompt import build_prompt
from completiond.models import load

target = load("qwen2.5-coder-0.5b", "target", "cpu", "auto", "auto")
tok = target.tokenizer
engine = Engine(target)
src = (Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_text()
lines = src.splitlines(keepends=True)
starts = [sum(len(l) for l in lines[:i]) for i in range(len(lines))]
if sys.argv[3:4] == ["code"]:
    picks = [i for i, l in enumerate(lines) if len(l.strip()) > 12
             and l.strip().startswith(("self.", "return ", "if ", "for ", "while ", "elif "))][::6]
else:
    picks = [i for i, l in enumerate(lines) if len(l.strip()) > 24 and not l.strip().startswith(("#", '"', "'"))][10::25]
picks = picks[:int(sys.argv[2]) if len(sys.argv) > 2 else 6]
rows = []
for i in picks:
    line = lines[i]
    indent = len(line) - len(line.lstrip())
    off = starts[i] + indent
    body = line[indent:].rstrip("\n")
    doc = src[:off] + src[starts[i] + len(line) - 1:]  # the line's code removed, its newline kept
    p = build_prompt(tok, doc, off)
    first = engine.complete(Request(prompt=p.ids, mode="combined", max_tokens=32, stops=p.stops, heal=p.heal))
    row = {"line": i, "prompt_tokens": len(p.ids), "first_ms": round(first.ms_total), "suggestion": first.text,
           "truth": body, "keys": 0, "through": 0, "served": 0, "zero_pass": 0, "exact_id_today": 0, "ms": []}
    for c in range(1, len(body) + 1):
        typed = body[:c]
        row["keys"] += 1
        if not first.text.startswith(typed):
            break  # the user left the suggestion: a normal request from here
        row["through"] += 1
        p2 = build_prompt(tok, doc[:off] + typed + doc[off:], off + c)
        row["exact_id_today"] += p2.ids[:len(p.ids)] == p.ids
        built = engine.typed_prompt(p.ids, typed)
        if built is None:
            continue
        ids, heal = built
        res = engine.complete(Request(prompt=ids, mode="combined", max_tokens=32, stops=p2.stops, heal=heal))
        row["served"] += res.served_tokens > 0
        row["zero_pass"] += res.target_passes == 0
        row["ms"].append(round(res.ms_total, 2))
    rows.append(row)
    print(json.dumps(row), flush=True)
ms = [m for r in rows for m in r["ms"]]
print(json.dumps({"threads": torch.get_num_threads(), "keys": sum(r["keys"] for r in rows),
                  "through": sum(r["through"] for r in rows), "served": sum(r["served"] for r in rows),
                  "zero_pass": sum(r["zero_pass"] for r in rows), "exact_id_today": sum(r["exact_id_today"] for r in rows),
                  "served_ms_p50": statistics.median(ms) if ms else None, "served_ms_max": max(ms) if ms else None}))
