"""`completiond bench --via infill` end to end on a tiny FIM model: a real daemon asked through llama.vim's
/infill and through the wire `complete`, the same positions scored alike, the JSON other tools read."""

import json
import random
import shutil

import pytest

import tiny
from completiond import cli
from completiond.bench.infill import N_PREFIX, RING_CHUNK, fim_ctx_local, jump_chunks, shown
from completiond.bench.repo import score

PATH_KEYS = {"exact_line", "exact_middle", "edit_similarity", "p50_ms", "p95_ms", "lanes", "mean_prompt_tokens"}


@pytest.fixture(scope="module")
def fim_dir(tmp_path_factory):
    return tiny.save(tmp_path_factory.mktemp("tiny-fim"), tiny.qwen2_config(), seed=5, scale=4.0)


def test_what_llama_vim_sends_and_shows():
    lines = (tiny.STDLIB / "difflib.py").read_text().splitlines()
    ctx = fim_ctx_local(lines, 400, 8)
    assert ctx["prefix"] == "\n".join(lines[400 - N_PREFIX:400]) + "\n"
    assert ctx["middle"] == lines[400][:8] and ctx["suffix"].startswith(lines[400][8:] + "\n" + lines[401])
    chunks = jump_chunks(lines, 1200, "difflib.py", random.Random(0))
    assert len(chunks) == 2  # one above the window, one below it
    for c, (lo, hi) in zip(chunks, ((1200 - 1024, 1200 - N_PREFIX), (1200 + 64, 1200 + 64 + RING_CHUNK))):
        body = c["text"].split("\n")[:-1]
        start = next(i for i in range(lo, hi) if lines[i:i + len(body)] == body)
        assert len(body) == RING_CHUNK // 2 and lo <= start < hi
    # s:fim_render on a line of 4 blanks (sent empty): the suggestion's own blanks up to 4 are the line's
    assert shown("        x = 1\n    y", 4) == "    x = 1\n    y" and shown("  x", 4) == "x"
    assert shown("  x", None) == "  x"


def test_bench_via_infill_runs_through_a_real_daemon(tmp_path, fim_dir):
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("difflib.py", "argparse.py"):
        shutil.copy(tiny.STDLIB / name, repo / name)
    out = tmp_path / "infill.json"
    code = cli.main(["bench", "--repo", str(repo), "--via", "infill", "--positions", "4", "--max-tokens", "8",
                     "--infill-idle", "0.2", "--target", str(fim_dir), "--draft", "self:1", "--dtype", "float32",
                     "--json", str(out)])
    assert code == 0
    res = json.loads(out.read_text())
    assert res["via"] == "infill" and res["positions"] == 4 and res["min_line"] == 257
    assert {"before", "after", "mean_1m_per_position"} <= res["load"].keys() and res["machine"]
    assert set(res["phases"]) == {"cold", "after_idle"}
    for phase, ph in res["phases"].items():
        for path in ("infill", "lsp"):
            assert PATH_KEYS <= ph[path].keys()
            assert 0 <= ph[path]["exact_line"] <= 1 and ph[path]["p95_ms"] >= ph[path]["p50_ms"] > 0
            assert sum(ph[path]["lanes"].values()) == 4
            got = [r[f"{path}_{phase}"] for r in res["rows"]]
            assert ph[path]["exact_line"] == round(sum(g["exact"] for g in got) / 4, 3)
        assert ph["exact_line_infill_minus_lsp"] == round(ph["infill"]["exact_line"] - ph["lsp"]["exact_line"], 3)
    for r in res["rows"]:
        assert r["line"] >= 257 and r["ring_status"] == 200
        for phase in res["phases"]:
            inf, lsp = r[f"infill_{phase}"], r[f"lsp_{phase}"]
            assert inf["document"].startswith("completiond-http:/") and lsp["document"].startswith("file://")
            assert inf["exact"] == score(inf["text"], r["reference"])["exact"]
            assert "<|" not in inf["text"] and "<|" not in lsp["text"]


def test_via_infill_runs_alone(tmp_path):
    assert cli.main(["bench", "--repo", str(tmp_path), "--via", "infill", "--replay", "2"]) == 2
