"""What of a next-edit request's prompt is not cached, by part: for each rename case of
benchmarks/next_edit.py, the prompt warmed at the resting cursor against the request's prompt, and the
uncached tail split into the new diff (of it: the part before its `+` line, which every keystroke of the
rename shares), the region and the closing lines. Tokens only (no model run, no timing).

    python -m benchmarks.experiments next_edit_tail --packages cachetools==7.2.0:7.2.0 jsonpickle==4.1.2:4.1.2 --renames 16 \
        > benchmarks/results/next-edit-tail-heldout.json
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from benchmarks.next_edit import history_of, rename_cases, shown_diffs, wheel_files, window_for
from completiond.core.prompt.next_edit import next_edit_prompt
from completiond.paths import cache_root
from completiond.service.history import History


def tail_parts(tok, case) -> dict:
    """Token counts of one case's prompt: all, cached (shared with the prompt warmed at rest), and the tail's parts."""
    path = case.name.split(":")[0]
    ids0, _ = next_edit_prompt(tok, case.before, window_for(case.before, case.cursor, History()), [], path, "python")
    h = history_of(case)
    ids, _ = next_edit_prompt(tok, case.text, window_for(case.text, case.anchor, h), shown_diffs(h, path), path, "python")
    n = 0
    while n < min(len(ids), len(ids0)) and ids[n] == ids0[n]:
        n += 1
    text = tok.decode(ids[n:])
    at_region, at_end = text.find("The editable region:"), text.find("<|editable_region_end|>")
    at_plus = text.find("\n+", text.find("\n-")) + 1

    def count(s: str) -> int:
        return len(tok.encode(s, add_special_tokens=False))

    return {"case": case.name, "prompt": len(ids), "cached": n, "diff": count(text[:at_region]),
            "diff_before_plus": count(text[:at_plus]), "region": count(text[at_region:at_end]),
            "closing": count(text[at_end:])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--packages", nargs="+", required=True, help="NAME==OLD:NEW (the newer release's renames)")
    p.add_argument("--renames", type=int, default=16)
    p.add_argument("--tokenizer", default=str(cache_root() / "runtime" / "qwen2.5-coder-0.5b"))
    a = p.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.tokenizer)
    per = -(-a.renames // len(a.packages))
    cases = []
    for spec in a.packages:
        name, versions = spec.split("==")
        cases += rename_cases(wheel_files(f"{name}=={versions.split(':')[-1]}"), per)
    rows = [tail_parts(tok, c) for c in cases]
    total = {k: sum(r[k] for r in rows) for k in ("prompt", "cached", "diff", "diff_before_plus", "closing")}
    print(json.dumps({"cases": rows, "p50": {k: float(np.median([r[k] for r in rows])) for k in rows[0] if k != "case"},
                      "cached_now": round(total["cached"] / total["prompt"], 4),
                      "cached_with_diff_head": round((total["cached"] + total["diff_before_plus"]) / total["prompt"], 4),
                      "cached_with_only_diff_and_closing_left": round(
                          (total["prompt"] - total["diff"] - total["closing"]) / total["prompt"], 4)}, indent=1))


if __name__ == "__main__":
    main()
