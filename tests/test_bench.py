"""`completiond bench` on a small local repository with a tiny model: the JSON other tools read."""

import json
import shutil

from completiond import cli
from completiond.bench.repo import code_lines, edit_similarity, mean_scores, sample_positions, score

import tiny

MODE_KEYS = {"p50_ms", "p95_ms", "p50_first_token_ms", "p95_first_token_ms", "tokens_per_s", "mean_accepted",
             "speedup_vs_ar", "identical_rate", "exact_match", "edit_similarity"}


def make_repo(root):
    for name in ("textwrap.py", "string.py", "bisect.py"):
        shutil.copy(tiny.STDLIB / name, root / name)
    (root / "notes.txt").write_text("not python\n")
    return root


def test_positions_are_code_lines(tmp_path):
    repo = make_repo(tmp_path)
    text = (repo / "bisect.py").read_text()
    lines = text.splitlines()
    for i in code_lines(text):
        assert lines[i].strip() and not lines[i].strip().startswith("#")
        assert '"""' not in lines[i]
    pos = sample_positions(repo, 10, "both", seed=1)
    assert {p.kind for p in pos} == {"line-start", "mid-line"}
    for p in pos:
        line = p.file.read_text().splitlines()[p.line]
        assert line[p.col:].rstrip() == p.reference
        doc, offset = p.document(p.file.read_text())
        assert p.reference not in doc[offset:offset + len(p.reference) + 1] or not p.reference.strip()
    assert edit_similarity("abc", "abc") == 1.0 and edit_similarity("abc", "abd") == 1 - 1 / 3
    # scored on the first line; exact_middle only when nothing follows it
    assert score("x = 1\ny = 2", "x = 1") == dict(exact=True, exact_middle=False, similarity=1.0)
    assert score("x = 1  \n", "x = 1")["exact_middle"] and not score("x = 2", "x = 1")["exact"]
    rows = [score("x = 1", "x = 1"), score("x = 2\n", "x = 1")]
    assert mean_scores(rows) == dict(exact_line=0.5, exact_middle=0.5, edit_similarity=round((1 + 0.8) / 2, 3))


def test_bench_json_shape(tmp_path, capsys, tiny_dir):
    (tmp_path / "repo").mkdir()
    repo = make_repo(tmp_path / "repo")
    out = tmp_path / "b.json"
    code = cli.main(["bench", "--repo", str(repo), "--positions", "6", "--modes", "ar,pld,combined",
                     "--peers", "hf-plain,hf-prompt-lookup", "--max-tokens", "12", "--target", str(tiny_dir),
                     "--draft", "self:1", "--dtype", "float32", "--json", str(out), "--plot",
                     str(tmp_path / "b.png"), "--edits", "2"])
    assert code == 0
    res = json.loads(out.read_text())
    for key in ("repo", "machine", "date", "command", "positions", "modes", "peers"):
        assert key in res
    assert set(res["modes"]) == {"ar", "pld", "combined"}
    for mode, row in res["modes"].items():
        assert MODE_KEYS <= row.keys()
        for rate in ("identical_rate", "exact_match", "edit_similarity"):
            assert 0.0 <= row[rate] <= 1.0
        assert row["identical_rate"] == 1.0  # fp32: speculation is lossless
    assert res["modes"]["ar"]["speedup_vs_ar"] == 1.0
    # the table the modes ran with (calibrated now), and after them (the daemon's estimator: real passes)
    start, end = res["pass_costs_start"], res["pass_costs"]
    assert start["origin"] == "calibrated" and start["measured_at"] and start["passes"] == 0
    assert {e["source"] for e in start["sizes"].values()} == {"calibrated"}
    assert end["passes"] > 0 and "observed" in {e["source"] for e in end["sizes"].values()}
    assert res["pass_cost_ms"] == {n: round(e["ms"], 2) for n, e in start["sizes"].items()}
    assert set(res["peers"]) == {"hf-plain", "hf-prompt-lookup"}
    assert res["peers"]["hf-plain"]["identical_rate"] == 1.0  # transformers' greedy agrees with ours
    assert res["edits"]["pld"]["identical_rate"] == 1.0
    assert (tmp_path / "b.png").stat().st_size > 10_000


def test_bench_prompts_carry_the_imported_workspace_files_with_repo_context(tmp_path):
    from completiond.bench.modes import prepare
    from completiond.core.engine import Engine

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "helpers.py").write_text("def shout(word):\n    return word.upper() + '!'\n")
    (tmp_path / "pkg" / "unrelated.py").write_text("VALUE = 42\n")
    (tmp_path / "pkg" / "main.py").write_text(
        "from pkg.helpers import shout\n\n\n\n\n\ndef greet(name):\n    text = shout(name)\n    return text\n")
    engine = Engine(tiny.loaded(tiny.qwen2_config()), None)
    pos = [p for p in sample_positions(tmp_path, 50, "both", 0) if p.file.name == "main.py"]
    assert pos
    tok = engine.target.tokenizer
    with_ctx = prepare(engine, tmp_path, pos, True, 2048, context=True)
    without = prepare(engine, tmp_path, pos, True, 2048)  # the daemon's default prompt
    for a, b in zip(with_ctx, without):
        assert a.context_files == ["pkg/helpers.py"] and b.context_files == []
        assert "word.upper()" in tok.decode(a.prompt) and "word.upper()" not in tok.decode(b.prompt)
        assert "VALUE = 42" not in tok.decode(a.prompt)
        fim_prefix = tok.convert_tokens_to_ids("<|fim_prefix|>")
        assert a.prompt[a.prompt.index(fim_prefix):] == b.prompt  # the same FIM body, no header without context


def test_bench_runs_two_targets_side_by_side(tmp_path, tiny_dir, monkeypatch):
    """--targets A,B: the same positions on each target, taking turns a block at a time in alternating
    order (so a drift of the machine's speed reaches both alike); quality, latency and pass cost by
    tree size per target in one JSON (issue 37 item 4)."""
    from completiond.bench import cli as bench_cli, modes as bench_modes
    from completiond.flags import EXIT_USAGE

    (tmp_path / "repo").mkdir()
    repo = make_repo(tmp_path / "repo")
    other = tiny.save(tmp_path / "other", tiny.gemma_config(window=16), seed=2, scale=4.0)
    out = tmp_path / "b.json"
    targets = f"{tiny_dir},{other}"
    turns = []
    real = bench_modes.run_modes

    def run_modes(engine, root, positions, *args, **kw):
        turns.append((engine.target.name, len(positions)))
        return real(engine, root, positions, *args, **kw)

    monkeypatch.setattr(bench_modes, "run_modes", run_modes)
    monkeypatch.setattr(bench_cli, "BLOCK", 2)
    assert cli.main(["bench", "--repo", str(repo), "--positions", "3", "--modes", "ar,pld", "--max-tokens", "8",
                     "--targets", targets, "--draft", "none", "--dtype", "float32", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["targets"] == [str(tiny_dir), str(other)] and res["positions"] == 3
    first, second = (res["by_target"][t]["target"] for t in res["targets"])
    assert first != second and turns == [(first, 2), (second, 2), (second, 1), (first, 1)]
    a, b = (res["side_by_side"][t] for t in res["targets"])
    for side in (a, b):
        assert set(side["modes"]) == {"ar", "pld"} and side["pass_cost_ms"]
        for row in side["modes"].values():
            assert {"p50_ms", "exact_match", "edit_similarity", "p50_vs_first_ar"} <= row.keys()
        assert side["modes"]["pld"]["identical_rate"] == 1.0
    assert a["modes"]["ar"]["p50_vs_first_ar"] == 1.0
    # the same positions: each target's details name the same files and lines
    da, db = (res["by_target"][t]["details"] for t in res["targets"])
    assert [(d["file"], d["line"], d["col"]) for d in da] == [(d["file"], d["line"], d["col"]) for d in db]
    assert cli.main(["bench", "--repo", str(repo), "--targets", str(tiny_dir)]) == EXIT_USAGE


def test_bench_targets_take_a_quant_each(tmp_path, tiny_dir):
    """--targets NAME@QUANT: the same target with int8 and int4 weights side by side (the 1.5B's
    int4 against the 0.5B's int8); an unknown @QUANT is a usage error."""
    from completiond.flags import EXIT_USAGE

    (tmp_path / "repo").mkdir()
    repo = make_repo(tmp_path / "repo")
    out = tmp_path / "q.json"
    targets = [f"{tiny_dir}@int8", f"{tiny_dir}@int4"]
    assert cli.main(["bench", "--repo", str(repo), "--positions", "2", "--modes", "ar,pld", "--max-tokens", "6",
                     "--targets", ",".join(targets), "--draft", "none", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["targets"] == targets
    assert [res["by_target"][t]["quant"] for t in targets] == ["int8", "int4"]
    assert all(res["side_by_side"][t]["modes"]["pld"]["identical_rate"] == 1.0 for t in targets)
    assert cli.main(["bench", "--repo", str(repo), "--targets", f"{tiny_dir}@int3,{tiny_dir}"]) == EXIT_USAGE


def test_only_llama_cpp_asked_for_runs_no_transformers_peer():
    """`--peers llama.cpp` alone used to prefill every prompt with transformers first (minutes per
    target on a CPU) for no peer at all."""
    from types import SimpleNamespace

    from completiond.bench.peers import run_transformers

    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError(f"the model was used ({name})")

    engine = SimpleNamespace(target=SimpleNamespace(model=Untouchable()), draft=None)
    assert run_transformers(engine, [SimpleNamespace(prompt=[1, 2, 3], runs={})], ["llama.cpp"]) == {}
