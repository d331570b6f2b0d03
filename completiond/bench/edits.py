"""Edit benchmark: rewrites whose output mostly copies the input (speculative edits).

Tasks are derived from real functions of the benchmarked repository: rename one identifier that the
function uses (instruction "Rename `a` to `b`"); the expected output is the function with every
whole-word occurrence renamed. Each mode rewrites from the same warm cache; we report the speed-up
over `ar`, whether the output is identical to `ar`'s, and how often it equals the expected rewrite.
"""

from __future__ import annotations

import ast
import random
import re
from pathlib import Path

from ..core.engine import Engine, Request
from ..core.prompt.rewrite import rewrite_prompt
from .modes import warm
from .repo import read_text_file, source_files

MODES = ("ar", "pld", "combined")


def rename_tasks(root: Path, n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    tasks = []
    for f in source_files(root):
        text = read_text_file(f) or ""
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines(keepends=True)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and 4 <= node.end_lineno - node.lineno <= 30:
                names = sorted({a.arg for a in node.args.args if a.arg not in ("self", "cls") and len(a.arg) > 2})
                if not names:
                    continue
                old = rng.choice(names)
                start = sum(len(x) for x in lines[: node.lineno - 1])
                end = sum(len(x) for x in lines[: node.end_lineno])
                new = old + "_value" if not old.endswith("_value") else "new_" + old
                expected = re.sub(rf"\b{re.escape(old)}\b", new, text[start:end])
                tasks.append({"file": f, "text": text, "start": start, "end": end, "old": old, "new": new,
                              "expected": expected})
    rng.shuffle(tasks)
    return tasks[:n]


def run_edits(engine: Engine, root: Path, n: int, seed: int = 0) -> dict:
    tok = engine.target.tokenizer
    rows = {m: [] for m in MODES}
    for task in rename_tasks(root, n, seed):
        ids, stops = rewrite_prompt(tok, task["text"], task["start"], task["end"],
                                    f"Rename `{task['old']}` to `{task['new']}`.", "python")
        n_sel = len(tok.encode(task["text"][task["start"]:task["end"]], add_special_tokens=False))
        ar_ids = None
        for mode in MODES:
            if mode == "combined" and engine.draft is None:
                continue
            warm(engine, ids)
            res = engine.complete(Request(prompt=ids, mode=mode, max_tokens=n_sel + 32, stops=stops))
            ar_ids = res.token_ids if mode == "ar" else ar_ids
            rows[mode].append({"ms_total": res.ms_total, "tokens": len(res.token_ids),
                               "mean_accepted": res.mean_accepted, "passes": res.target_passes,
                               "identical": res.token_ids == ar_ids,
                               "correct": res.text.strip() == task["expected"].strip()})
    out = {}
    ar_ms = sum(r["ms_total"] for r in rows["ar"])
    for mode, rs in rows.items():
        if not rs:
            continue
        ms = sum(r["ms_total"] for r in rs)
        passes = sum(r["passes"] for r in rs)
        out[mode] = {"tasks": len(rs), "tokens_per_s": round(sum(r["tokens"] for r in rs) / (ms / 1000), 2),
                     "speedup_vs_ar": round(ar_ms / ms, 3),
                     "mean_accepted": round(sum(r["mean_accepted"] * r["passes"] for r in rs) / passes, 3)
                     if passes else 0.0,
                     "identical_rate": round(sum(r["identical"] for r in rs) / len(rs), 4),
                     "exact_rewrite_rate": round(sum(r["correct"] for r in rs) / len(rs), 4)}
    return out
