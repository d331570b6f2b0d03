"""README's models table is what its cited bench JSONs say (benchmarks/experiments/models_table.py):
regenerating it from the files its `source` cells name gives the README's block byte for byte, so
a new measurement or a hand edit that drifts from the files fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

from benchmarks.experiments import models_table

ROOT = Path(__file__).resolve().parents[1]


def run(target: str, quant: str, repo: str, exact: float, shown2: float, shown30: float, key_ms: float,
        replayed: int = 40) -> dict:
    shown = {s: {"exact_line": v, "edit_sim": v + 0.1, "p50_final_keystroke_ms": key_ms * k, "rows": [{}] * replayed}
             for s, v, k in (("2", shown2, 2), ("30", shown30, 1))}
    mode = {"p50_ms": 300.0, "p95_ms": 900.0, "exact_match": exact, "edit_similarity": exact + 0.2}
    return {"target": target, "quant": quant, "repo": repo, "positions": 40, "machine": "2 cores, Some CPU",
            "modes": {"ar": mode, "pld": mode, "combined": {**mode, "p50_ms": 310.0}},
            "keystroke_replay": {"engine": {"exact_line": exact, "edit_sim": exact + 0.2}, "shown": shown}}


def test_one_row_per_target_with_the_packages_side_by_side(tmp_path):
    files = []
    for i, (t, q, repo, e, s2, s30) in enumerate([
            ("qwen2.5-coder-1.5b", "int4", "pypi:a==1", 0.5, 0.45, 0.5),
            ("qwen2.5-coder-1.5b", "int4", "pypi:b==2", 0.6, 0.5, 0.6),
            ("qwen2.5-coder-0.5b", "int8", "pypi:a==1", 0.3, 0.2, 0.3)]):
        p = tmp_path / f"r{i}.json"
        p.write_text(json.dumps(run(t, q, repo, e, s2, s30, 40.0)))
        files.append(p)
    p = tmp_path / "r3.json"
    p.write_text(json.dumps(run("qwen2.5-coder-0.5b", "none", "pypi:a==1", 0.3, 0.2, 0.3, 40.0, replayed=20)))
    files.append(p)
    lines = models_table.table(files).splitlines()
    assert "| a 1 (40 positions each, 20 replayed) |" in lines[4]
    assert lines[0].startswith("| target |") and lines[1].startswith("|---")
    big, small = lines[2], lines[3]
    assert big.startswith("| `qwen2.5-coder-1.5b@int4` | a 1 / b 2 (40 positions each) | 0.50 / 0.60 | 0.45 / 0.50 · 0.50 / 0.60 |")
    assert "310 / 900 ms (300 / 900)" in big and "80 / 40 ms · 80 / 40 ms" in big
    assert small.startswith("| `qwen2.5-coder-0.5b@int8` | a 1 (40 positions each) | 0.30 | 0.20 / 0.30 |")
    assert lines[-1] == "2 cores, Some CPU."


def test_the_readme_block_is_regenerated_from_its_sources_exactly(monkeypatch):
    readme = (ROOT / "README.md").read_text()
    block = re.search(re.escape(models_table.START) + r"\n(.*?)\n" + re.escape(models_table.END), readme, re.S)
    assert block, "README.md has no models table block"
    sources = [ROOT / s for s in re.findall(r"`(benchmarks/results/[^`]+\.json)`", block.group(1))]
    assert sources and all(p.exists() for p in sources), sources
    rel = [p.relative_to(ROOT) for p in dict.fromkeys(sources)]  # the order they appear: rows, then packages
    monkeypatch.chdir(ROOT)
    assert models_table.table(rel) == block.group(1)
