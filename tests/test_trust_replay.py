"""Issue 38 item 8: `completiond bench --replay` waits for the daemon it starts to be ready.

A daemon answers `status` from the first second, while it still imports torch and loads its models
(no `scheduler` then); the replay read that status at once and died with KeyError: 'scheduler'.
"""

import json
from pathlib import Path

import pytest

from completiond import cli

SOURCE = '''def area(width, height):
    return width * height


def scaled(values, factor):
    return [value * factor for value in values]
'''


def bench_replay(tmp_path: Path, *model: str, capsys=None) -> dict:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "shapes.py").write_text(SOURCE)
    out = tmp_path / "b.json"
    code = cli.main(["bench", "--repo", str(repo), "--positions", "1", "--cursor", "mid-line", "--modes", "ar",
                     "--replay", "1", "--replay-open-pause", "0", "--replay-open-pause", "0.5", "--max-tokens", "8",
                     "--prompt-tokens", "256", "--json", str(out), *model])
    assert code == 0
    bench = json.loads(out.read_text())
    res = bench["keystroke_replay"]
    for key in ("with_prefix_reuse", "without_prefix_reuse"):
        assert res[key]["requests"] >= 3, res
    # with reuse the typed-through memory answers keystrokes at once; without it a slow model's requests
    # may all be superseded, and the last keystroke ends the line, where a whitespace-only answer is
    # never shown
    assert res["with_prefix_reuse"]["answered_with_tokens"] >= 1, res
    # what the daemon showed after typing up to the position's cursor, per open pause, beside the engine
    assert res["engine"] == {"mode": "ar", "positions": 1, "prompt_tokens": 256,
                             "exact_line": bench["modes"]["ar"]["exact_match"],
                             "edit_sim": round(bench["modes"]["ar"]["edit_similarity"], 3)}
    assert set(res["shown"]) == {"0", "0.5"}
    for pause, shown in res["shown"].items():
        assert shown["open_pause_s"] == float(pause) and shown["positions"] == 1
        assert {"exact_line", "edit_sim", "lanes", "p50_final_keystroke_ms", "p95_final_keystroke_ms"} <= shown.keys()
        assert sum(shown["lanes"].values()) == 1 and shown["rows"][0]["lane"] in shown["lanes"]
        assert shown["rows"][0]["reference"] == bench["details"][0]["reference"]
    if capsys is not None:
        assert "shown" in capsys.readouterr().out
    return res


def test_replay_waits_for_a_loading_daemon(tmp_path, tiny_dir, capsys):
    """The tiny model: the daemon still imports torch for seconds after its socket is up."""
    bench_replay(tmp_path, "--target", str(tiny_dir), "--draft", "none", "--dtype", "float32", capsys=capsys)


@pytest.mark.real_model
def test_replay_waits_for_the_real_default_model(tmp_path):
    """The real 0.5B: its daemon loads for tens of seconds (quantization, calibration)."""
    bench_replay(tmp_path, "--target", "qwen2.5-coder-0.5b", "--draft", "none")
