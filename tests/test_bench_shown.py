"""`bench --replay`'s shown suggestions: the user types up to each bench position's cursor through a
real daemon; what the last keystroke's answer streamed is scored against the bench's reference."""

import pytest

import tiny
from completiond.bench.replay import _shown, shown_summary, typing_plan
from completiond.bench.repo import Cursor, sample_positions, score
from completiond.core.engine import Engine
from daemon_util import in_process

SRC_FILE = tiny.STDLIB / "textwrap.py"


def apply(doc: str, at: tuple[int, int], keys: list[str]) -> tuple[str, tuple[int, int]]:
    """The keys typed at `at` (line, column; ASCII here): the document and the cursor after them."""
    line, col = at
    for key in keys:
        lines = doc.split("\n")
        offset = sum(len(x) + 1 for x in lines[:line]) + col
        doc = doc[:offset] + key + doc[offset:]
        line, col = (line + key.count("\n"), len(key.rsplit("\n", 1)[-1])) if "\n" in key else (line, col + len(key))
    return doc, (line, col)


def test_typing_plan_types_the_line_up_to_the_cursor(tmp_path):
    (tmp_path / "textwrap.py").write_text(SRC_FILE.read_text())
    positions = sample_positions(tmp_path, 12, "both", seed=3)
    assert {p.kind for p in positions} == {"line-start", "mid-line"}
    for pos in positions:
        text = pos.file.read_text()
        opened, at, keys = typing_plan(pos, text)
        want, _ = pos.document(text)
        typed, cursor = apply(opened, at, keys)
        assert typed == want and cursor == (pos.line, pos.col)  # the bench's document, the bench's cursor
        line = text.splitlines()[pos.line]
        indent = len(line) - len(line.lstrip())
        if pos.kind == "mid-line":  # the code before the cursor, a character a keystroke
            assert keys == list(line[indent:pos.col]) and at == (pos.line, indent)
        else:  # Enter at the end of the line above, with the indentation
            assert keys == ["\n" + line[:indent]] and at[0] == pos.line - 1
        assert pos.reference not in opened.splitlines()[pos.line - 1:pos.line + 1]


def test_shown_summary_scores_counts_lanes_and_sits_beside_the_engine():
    rows = [dict(position=0, lane="quick", final_ms=40.0, keystrokes=5, reference="x = 1", shown="x = 1\n"),
            dict(position=1, lane="quick", final_ms=60.0, keystrokes=1, reference="return y", shown="return z"),
            dict(position=2, lane="full", final_ms=None, keystrokes=3, reference="pass", shown=""),
            dict(position=3, lane=None, final_ms=None, keystrokes=2, reference="y = 2", shown="")]  # an error
    s = shown_summary(rows, 2.0, {"exact_line": 0.5, "edit_sim": 0.8})
    assert s["lanes"] == {"quick": 2, "full": 1} and s["positions"] == 4 and s["open_pause_s"] == 2.0
    assert s["exact_line"] == 0.25  # one of four
    sims = [score(r["shown"], r["reference"])["similarity"] for r in rows]
    assert s["edit_sim"] == round(sum(sims) / 4, 3) and 0 < s["edit_sim"] < 1
    assert s["p50_final_keystroke_ms"] == 50.0 and s["answered"] == 2  # only the answered ones are timed
    assert s["vs_engine"] == {"exact_line": 0.5, "edit_sim": round(s["edit_sim"] / 0.8, 3)}
    assert [r["exact"] for r in s["rows"]] == [True, False, False, False]


def a_cursor(kind: str) -> Cursor:
    """A cursor deep in textwrap.py (a long prefix and suffix: the quick prompt exists): after
    `return ` (mid-line) or at that line's indentation (line-start)."""
    lines = SRC_FILE.read_text().split("\n")
    i = next(i for i in range(len(lines) // 2, len(lines)) if lines[i].strip().startswith("return ")
             and len(lines[i].strip()) > 12)
    col = lines[i].index("return ") + (len("return ") if kind == "mid-line" else 0)
    return Cursor(SRC_FILE, i, col, kind, lines[i][col:].rstrip())


@pytest.mark.parametrize("kind, quick_ms, lane", [("mid-line", 0.0, "quick"), ("mid-line", -1.0, "full"),
                                                  ("line-start", -1.0, "full")])
async def test_shown_is_what_the_last_keystroke_streamed(tmp_path, kind, quick_ms, lane):
    """Cold and typed with the quick prompt standing for a slow device (quick_prompt_ms=0): the last
    keystroke answers from the quick lane; quick prompt off: from the full one. A line-start cursor is
    one keystroke (Enter): its answer is the one a fresh request on the bench's document at the
    bench's cursor gets (greedy: the same prompt, the same text)."""
    pos = a_cursor(kind)
    text = SRC_FILE.read_text()
    engine = Engine(tiny.loaded(tiny.qwen2_config(), seed=5, scale=4.0))
    async with in_process(tmp_path, engine, quick_prompt_ms=quick_ms) as (c, daemon):
        streamed: dict[int, str] = {}
        c.on("complete/partial", lambda p: streamed.__setitem__(p["id"], streamed.get(p["id"], "") + p["text"]))
        r = await _shown(c, "file:///w/textwrap.py", pos, text, 0.0, 8, False)
        assert r["error"] is None and r["lane"] == lane
        assert r["keystrokes"] == (len("return ") if kind == "mid-line" else 1)
        # the shown text: the streamed increments of the last request, which are its final text too
        assert r["shown"] and r["shown"] == r["text"] and r["final_ms"] > 0
        assert r["shown"] in streamed.values()
        # the daemon's account of the wait: engine thread, index + prompt, then its first token
        times = r["daemon_ms"]
        assert all(times[k] >= 0 for k in ("ms_waited", "ms_prepared", "ms_first_token")), times
        assert times["ms_waited"] + times["ms_prepared"] + times["ms_first_token"] <= r["final_ms"] + 1, (times, r)
        if kind == "line-start":
            doc, _ = pos.document(text)
            await c.request("document/open", {"uri": "file:///w/fresh.py", "text": doc, "version": 0})
            fresh = await c.request("complete", {"uri": "file:///w/fresh.py", "max_tokens": 8, "multiline": False,
                                                 "position": {"line": pos.line, "character": pos.col}})
            assert fresh["prompt_lane"] == "full" and fresh["text"] == r["shown"]


def test_shown_is_printed_and_plotted_beside_the_engine(tmp_path):
    from completiond.bench.cli import table
    from completiond.bench.report import plot

    rows = [dict(position=0, lane="quick", final_ms=40.0, keystrokes=5, reference="x = 1", shown="x = 1")]
    replay = {"engine": {"mode": "ar", "positions": 1, "prompt_tokens": 2048, "exact_line": 1.0, "edit_sim": 1.0},
              "shown": {"2": shown_summary(rows, 2.0, {"exact_line": 1.0, "edit_sim": 1.0})}}
    ar = {"p50_ms": 10.0, "p95_ms": 12.0, "p50_first_token_ms": 5.0, "tokens_per_s": 100.0, "mean_accepted": 0.0,
          "speedup_vs_ar": 1.0, "identical_rate": 1.0, "exact_match": 1.0, "edit_similarity": 1.0,
          "acceptance_by_depth": []}
    summary = {"repo": "r", "positions": 1, "machine": "m", "modes": {"ar": ar}, "peers": {}, "keystroke_replay": replay}
    text = table(summary)
    shown_line = next(x for x in text.splitlines() if x.startswith("shown ") and "2" in x)
    assert shown_line.split()[1:5] == ["2", "1.00", "1.00", "1.00"] and shown_line.split()[5:7] == ["1", "0"]
    plot(summary, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_a_negative_open_pause_is_refused(tmp_path, capsys):
    from completiond import cli

    assert cli.main(["bench", "--repo", str(tmp_path), "--replay", "1", "--replay-open-pause", "-1"]) == 2
    assert "--replay-open-pause" in capsys.readouterr().err


def test_replay_shown_only_skips_the_typing_runs(tmp_path, tiny_dir):
    import json

    from completiond import cli

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "wrap.py").write_text(SRC_FILE.read_text())
    out = tmp_path / "b.json"
    assert cli.main(["bench", "--repo", str(repo), "--positions", "1", "--modes", "ar", "--replay", "1",
                     "--replay-shown-only", "--replay-open-pause", "0", "--max-tokens", "2", "--prompt-tokens", "256",
                     "--json", str(out), "--target", str(tiny_dir), "--draft", "none", "--dtype", "float32"]) == 0
    bench = json.loads(out.read_text())
    res = bench["keystroke_replay"]
    assert res["target"] == bench["target"]  # its daemon served the model the engine ran, by name
    assert "with_prefix_reuse" not in res and "without_prefix_reuse" not in res
    assert res["shown"]["0"]["positions"] == 1 and sum(res["shown"]["0"]["lanes"].values()) == 1
