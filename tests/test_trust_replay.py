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


def bench_replay(tmp_path: Path, *model: str) -> dict:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "shapes.py").write_text(SOURCE)
    out = tmp_path / "b.json"
    code = cli.main(["bench", "--repo", str(repo), "--positions", "1", "--cursor", "mid-line", "--modes", "ar",
                     "--replay", "1", "--max-tokens", "2", "--prompt-tokens", "256", "--json", str(out), *model])
    assert code == 0
    res = json.loads(out.read_text())["keystroke_replay"]
    for key in ("with_prefix_reuse", "without_prefix_reuse"):
        assert res[key]["requests"] >= 3 and res[key]["answered_with_tokens"] >= 1, res
    return res


def test_replay_waits_for_a_loading_daemon(tmp_path, tiny_dir):
    """The tiny model: the daemon still imports torch for seconds after its socket is up."""
    bench_replay(tmp_path, "--target", str(tiny_dir), "--draft", "none", "--dtype", "float32")


@pytest.mark.real_model
def test_replay_waits_for_the_real_default_model(tmp_path):
    """The real 0.5B: its daemon loads for tens of seconds (quantization, calibration)."""
    bench_replay(tmp_path, "--target", "qwen2.5-coder-0.5b", "--draft", "none")
