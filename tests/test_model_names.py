"""One spelling of a model everywhere: NAME@FORM names a model in one weights form (`--target`,
`serve`, `bench --targets`, editor settings, status), read in one place (models.catalog.split_form)."""

import argparse
import json

import pytest

from completiond import cli
from completiond.models.catalog import FORMS, NAMED, ModelError, split_form, spelled


@pytest.mark.parametrize("spec, expected", [
    ("qwen2.5-coder-1.5b@int4", ("qwen2.5-coder-1.5b", "int4")),
    ("qwen2.5-coder-0.5b@int8", ("qwen2.5-coder-0.5b", "int8")),
    ("qwen2.5-coder-1.5b@none", ("qwen2.5-coder-1.5b", "none")),
    ("qwen2.5-coder-0.5b", ("qwen2.5-coder-0.5b", None)),  # a bare name: its default form
    ("qwen2.5-coder-0.5b@auto", ("qwen2.5-coder-0.5b", None)),
    ("default@int4", ("default", "int4")),
    ("openai:http://user@127.0.0.1:8080/v1", ("openai:http://user@127.0.0.1:8080/v1", None)),  # the URL's @
    ("/models/v1@2/tiny", ("/models/v1@2/tiny", None)),  # an @ inside a path
])
def test_split_form(spec, expected):
    assert split_form(spec) == expected


def test_an_existing_path_with_an_at_is_a_name(tmp_path):
    d = tmp_path / "model@int8"
    d.mkdir()
    assert split_form(str(d)) == (str(d), None)


def test_an_unknown_form_names_the_valid_spellings():
    with pytest.raises(ModelError) as e:
        split_form("qwen2.5-coder-1.5b@q4")
    msg = str(e.value)
    assert "unknown weights form 'q4'" in msg
    assert all(f"qwen2.5-coder-1.5b@{f}" in msg for f in FORMS) and "qwen2.5-coder-1.5b for its default" in msg


def test_spelled_names_a_named_model_with_its_form_and_leaves_other_specs():
    assert spelled("qwen2.5-coder-1.5b", "int4") == "qwen2.5-coder-1.5b@int4"
    assert spelled("gemma3-270m", "none") == "gemma3-270m@none"
    assert spelled("/models/tiny", "int8") == "/models/tiny"  # a directory stays as given
    assert spelled("qwen2.5-coder-0.5b", None) == "qwen2.5-coder-0.5b"
    for name in NAMED:  # what status shows, read back, is what was asked for
        assert split_form(spelled(name, "int4")) == (name, "int4")


@pytest.fixture()
def src(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n")
    return f


def run_main(capsys, *argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("argv, needle", [
    (["--target", "qwen2.5-coder-1.5b@int3"], "--target 'qwen2.5-coder-1.5b@int3': unknown weights form 'int3'; "
                                              "use one of qwen2.5-coder-1.5b@int8, qwen2.5-coder-1.5b@int4"),
    (["--target", "qwen2.5-coder-1.5b@int4", "--quant", "int8"],
     "--target qwen2.5-coder-1.5b@int4 runs its int4 weights but --quant says int8"),
])
def test_bad_spellings_are_one_line_before_any_model_loads(capsys, src, argv, needle, monkeypatch):
    from completiond.models import loader as models

    monkeypatch.setattr(models, "load", lambda *a, **k: pytest.fail("a model was loaded before the check"))
    code, out, err = run_main(capsys, "complete", str(src), "--line", "1", "--col", "1", *argv)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and needle in err, err


def test_a_form_in_the_name_loads_those_weights(capsys, src, tiny_dir):
    """`--target DIR@int8` is `--target DIR --quant int8` (the bench's --targets spelling, now everywhere)."""
    code, out, err = run_main(capsys, "complete", str(src), "--line", "5", "--col", "1", "--mode", "ar",
                              "--target", f"{tiny_dir}@int8", "--dtype", "bfloat16", "--max-tokens", "4", "--json",
                              "--no-daemon")
    assert code == 0, err
    res = json.loads(out)
    assert res["quant"] == "int8" and res["target"] == str(tiny_dir)


def ns(target: str, quant: str = "auto") -> argparse.Namespace:
    return argparse.Namespace(target=target, quant=quant, dtype="auto", device="auto", backend="auto",
                              temperature=0.0, draft="default", mode="combined")


@pytest.mark.parametrize("target, quant, served, served_quant, mismatch", [
    ("qwen2.5-coder-0.5b", "auto", "qwen2.5-coder-0.5b@int8", "int8", False),  # a bare name takes its form
    ("qwen2.5-coder-0.5b@int8", "auto", "qwen2.5-coder-0.5b@int8", "int8", False),
    ("qwen2.5-coder-1.5b@int4", "auto", "qwen2.5-coder-1.5b@int8", "int8", True),  # other weights
    ("qwen2.5-coder-1.5b@int4", "auto", "qwen2.5-coder-0.5b@int8", "int8", True),  # another model
    ("qwen2.5-coder-0.5b", "auto", "qwen2.5-coder-0.5b", "int8", False),  # a daemon that spells no form
    ("default", "auto", "qwen2.5-coder-1.5b@int4", "int4", False),
])
def test_a_running_daemon_answers_only_for_the_model_and_form_asked(target, quant, served, served_quant, mismatch):
    why = cli.daemon_mismatch(ns(target, quant), {"target": served, "quant": served_quant, "dtype": "float32",
                                                  "device": "cpu", "draft": None})
    assert (why is not None) == mismatch, why
    if mismatch:
        assert served in why


def test_lsp_settings_pass_a_spelled_target_to_the_daemon_it_starts():
    from completiond_lsp.server import CompletiondServer

    ls = CompletiondServer()
    ls.apply_settings({"target": "qwen2.5-coder-1.5b@int4"})
    assert ls.settings.target == "qwen2.5-coder-1.5b@int4"
    assert ls.link.serve_args == ["--target", "qwen2.5-coder-1.5b@int4"]


def test_the_bench_command_a_reason_prints_parses_as_printed():
    """`default_reason` points to a side-by-side bench: the command it prints must run as printed
    (it once lacked the required --repo)."""
    import shlex

    from completiond.models.choice import MEASURED_PAIR, SIDE_BY_SIDE

    argv = shlex.split(SIDE_BY_SIDE.format(larger=MEASURED_PAIR[0], smaller=MEASURED_PAIR[1]))
    assert argv[0] == "completiond"
    a = cli.build_parser().parse_args(argv[1:])  # a UsageError (one line, exit 2) if it did not
    assert a.command == "bench" and a.repo and a.targets.split(",") == [f"{MEASURED_PAIR[0]}@int4", MEASURED_PAIR[1]]
    for t in a.targets.split(","):
        split_form(t)


def test_convert_makes_the_runtime_form_a_start_then_maps(tmp_path, monkeypatch, capsys):
    """`completiond convert NAME@FORM` (what a daemon whose chosen default is not converted yet
    prints): the runtime form is in the cache afterwards, and a load finds it without converting."""
    from tiny_gguf import write_qwen2_gguf

    import completiond.models.loader as models

    monkeypatch.setenv("COMPLETIOND_CACHE", str(tmp_path / "cache"))
    gguf = write_qwen2_gguf(tmp_path / "tiny-qwen2.gguf", seed=3)
    code, out, err = run_main(capsys, "convert", f"{gguf}@int8", "--dtype", "float32")
    assert code == 0, err
    assert "int8" not in out and "is converted: " in err and "completiond stop" in err
    import torch

    folder = models.resolve(str(gguf))[0]
    assert models.integrity.unchanged(folder, models._needed(folder, torch.float32, "int8"))
    monkeypatch.setattr(models, "_convert", lambda *a: pytest.fail("converted again"))
    assert models.load(f"{gguf}@int8", "target", "cpu", "float32").meta["quant"] == "int8"
    code, _, err = run_main(capsys, "convert", f"{gguf}@int8", "--quant", "int4")
    assert code == 2 and "runs its int8 weights but --quant says int4" in err


def test_serve_takes_a_spelled_target_and_status_says_the_form(tmp_path, tiny_dir):
    """`serve --target DIR@int8` runs the int8 weights; status and initialize carry `quant` and
    `default_reason` (null: the target was named); a bad form stops serve with one line, exit 2."""
    import asyncio
    import subprocess
    import sys

    from daemon_util import daemon_status, start_daemon, stop_daemon

    from completiond.service.client import Client

    sock = tmp_path / "d.sock"
    proc = start_daemon(sock, f"{tiny_dir}@int8")
    try:
        st = daemon_status(sock)
        assert st["state"] == "ready" and st["quant"] == "int8" and st["target"] == str(tiny_dir), st
        assert "default_reason" in st and st["default_reason"] is None

        async def initialize() -> dict:
            c = await Client.connect(sock)
            try:
                return await c.request("initialize", {"client": "test", "protocol": 1})
            finally:
                await c.close()

        info = asyncio.run(initialize())
        assert info["quant"] == "int8" and info["target"] == str(tiny_dir) and info["default_reason"] is None
    finally:
        assert stop_daemon(proc) == 0
    bad = subprocess.run([sys.executable, "-m", "completiond", "serve", "--socket", str(tmp_path / "b.sock"),
                          "--target", "qwen2.5-coder-0.5b@int9", "--log-level", "ERROR"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "unknown weights form 'int9'" in bad.stderr and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr  # before the socket: one line
