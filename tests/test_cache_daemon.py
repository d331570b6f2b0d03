"""`completiond complete` asks a running daemon (warm models) when there is one and it serves what the
flags ask for; `--no-daemon`, another model, or no daemon: the models load in the process, as before."""

from __future__ import annotations

import json

import pytest

from completiond import cli
from daemon_util import daemon_status


@pytest.fixture
def src(tmp_path):
    p = tmp_path / "shapes.py"
    p.write_text("import math\n\n\ndef area(r):\n    return math.pi * r * r\n\n\ndef perimeter(r):\n    return \n")
    return p


def run(capsys, *args: str) -> tuple[int, dict, str]:
    rc = cli.main(["complete", *args, "--json", "--max-tokens", "12"])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else {}), err


def test_complete_answers_through_a_running_daemon_with_the_local_text(daemon, tiny_dir, src, capsys):
    where = [str(src), "--line", "9", "--col", "12", "--target", str(tiny_dir), "--dtype", "float32",
             "--socket", str(daemon)]
    served = daemon_status(daemon)["requests_served"]
    rc, remote, err = run(capsys, *where)
    assert rc == 0, err
    assert remote["daemon"] == str(daemon) and daemon_status(daemon)["requests_served"] == served + 1
    rc, local, err = run(capsys, *where, "--no-daemon")
    assert rc == 0 and "daemon" not in local and daemon_status(daemon)["requests_served"] == served + 1
    assert remote["text"] == local["text"] and remote["token_ids"] == local["token_ids"] and local["text"]
    for key in ("target", "dtype", "device", "quant", "mode", "target_passes", "ms_total"):
        assert key in remote
    # plain output (no --json) is the same text too
    assert cli.main(["complete", *where, "--max-tokens", "12"]) == 0
    assert capsys.readouterr().out.rstrip("\n") == local["text"].rstrip("\n")


def test_a_daemon_with_other_settings_is_not_asked(daemon, tiny_dir, src, capsys):
    served = daemon_status(daemon)["requests_served"]
    rc, res, err = run(capsys, str(src), "--line", "9", "--col", "12", "--target", str(tiny_dir), "--dtype",
                       "bfloat16", "--socket", str(daemon), "--draft", "none")
    assert rc == 0 and "daemon" not in res and res["dtype"] == "bfloat16"  # loaded here, as without a daemon
    assert daemon_status(daemon)["requests_served"] == served
    from argparse import Namespace

    asked = Namespace(dtype="auto", quant="auto", device="auto", target="default", backend="auto", draft="default",
                      temperature=0.0, mode="combined")
    runs = {"target": "qwen2.5-coder-0.5b", "dtype": "bfloat16", "quant": "int8", "device": "cpu", "draft": None}
    assert cli.daemon_mismatch(asked, runs) is None
    for flag, value in (("dtype", "float32"), ("quant", "none"), ("target", "gemma3-270m"), ("backend", "lean")):
        assert flag in cli.daemon_mismatch(Namespace(**{**vars(asked), flag: value}), runs)
    assert cli.daemon_mismatch(Namespace(**{**vars(asked), "draft": "self:2"}), runs) is None  # greedy: text alike
    assert cli.daemon_mismatch(Namespace(**{**vars(asked), "draft": "self:2", "temperature": 0.5}), runs)


def test_no_daemon_at_the_socket_loads_quietly(tiny_dir, src, tmp_path, capsys):
    rc, res, err = run(capsys, str(src), "--line", "9", "--col", "12", "--target", str(tiny_dir), "--dtype",
                       "float32", "--socket", str(tmp_path / "none.sock"), "--draft", "none")
    assert rc == 0 and "daemon" not in res and "daemon" not in err
