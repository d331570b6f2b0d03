"""`completiond complete`: the JSON contract, and one-line errors with exit 2 for bad input."""

import json
import os
import subprocess
import sys

import pytest

from completiond import cli

JSON_FIELDS = {"text", "token_ids", "tokens", "mode", "target_passes", "mean_accepted", "ms_first_token",
               "ms_total", "target", "draft", "dtype", "device"}


@pytest.fixture()
def src(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n")
    return f


def run_main(capsys, *argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("mode", ["ar", "pld", "draft", "combined"])
def test_complete_json_contract(capsys, src, tiny_dir, mode):
    code, out, err = run_main(capsys, "complete", str(src), "--line", "9", "--col", "15", "--mode", mode,
                              "--target", str(tiny_dir), "--draft", "self:1", "--max-tokens", "12",
                              "--dtype", "float32", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert JSON_FIELDS <= res.keys()
    assert res["mode"] == mode and res["device"] == "cpu" and res["dtype"] == "float32"
    assert len(res["token_ids"]) == len(res["tokens"]) <= 12
    assert res["draft"] == (None if mode in ("ar", "pld") else res["draft"])
    if mode in ("draft", "combined"):
        assert res["draft"].startswith("self:1")


def test_modes_agree_through_cli(capsys, src, tiny_dir):
    texts = set()
    for mode in ("ar", "combined"):
        code, out, _ = run_main(capsys, "complete", str(src), "--line", "9", "--col", "1", "--mode", mode,
                                "--target", str(tiny_dir), "--draft", "self:2", "--dtype", "float32",
                                "--max-tokens", "20", "--json")
        assert code == 0
        texts.add(tuple(json.loads(out)["token_ids"]))
    assert len(texts) == 1


BAD = {
    "missing file": (["complete", "/nonexistent/x.py", "--line", "1", "--col", "1"], "no such file"),
    "line out of range": (["complete", "{src}", "--line", "99", "--col", "1"], "out of range"),
    "col out of range": (["complete", "{src}", "--line", "1", "--col", "80"], "out of range"),
    "zero line": (["complete", "{src}", "--line", "0", "--col", "1"], "1-based"),
    "empty file": (["complete", "{empty}", "--line", "1", "--col", "1"], "empty"),
    "binary file": (["complete", "{binary}", "--line", "1", "--col", "1"], "binary"),
    "not utf-8": (["complete", "{latin1}", "--line", "1", "--col", "1"], "UTF-8"),
    "unknown model dir": (["complete", "{src}", "--line", "1", "--col", "1", "--target", "/no/such/model"],
                          "not found"),
    "unknown hub id": (["complete", "{src}", "--line", "1", "--col", "1", "--target", "nobody/no-such-model"],
                       "not in the local Hugging Face cache"),
    "unknown model name": (["complete", "{src}", "--line", "1", "--col", "1", "--target", "qwen-coder"],
                           "unknown model 'qwen-coder'"),
    "bad mode": (["complete", "{src}", "--line", "1", "--col", "1", "--mode", "fast"], "invalid choice"),
    "bad flag": (["complete", "{src}", "--line", "1", "--col", "1", "--frobnicate"], "unrecognized"),
    "bad number": (["complete", "{src}", "--line", "one", "--col", "1"], "invalid int"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_one_line_exit_2(capsys, tmp_path, src, case, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "empty.py").write_text("")
    (tmp_path / "bin.dat").write_bytes(b"\x7fELF\x00\x01\x02")
    (tmp_path / "latin1.py").write_bytes("caf\xe9 = 1\n".encode("latin-1"))
    argv, needle = BAD[case]
    argv = [a.format(src=src, empty=tmp_path / "empty.py", binary=tmp_path / "bin.dat",
                     latin1=tmp_path / "latin1.py") for a in argv]
    code, out, err = run_main(capsys, *argv)
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err


def test_console_script_error_has_no_traceback(src):
    """The installed entry point itself (a real process)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    p = subprocess.run([sys.executable, "-m", "completiond", "complete", str(src), "--line", "1", "--col",
                        "1", "--target", "/no/such/model"], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr


EARLY = {  # flag errors found before any model loads, in the CLI's own 1-based numbers
    "self:abc": (["--draft", "self:abc"], "whole number"),
    "draft none in draft mode": (["--draft", "none", "--mode", "draft"], "needs a draft model"),
    "missing workspace": (["--workspace", "/nonexistent"], "--workspace /nonexistent: not a directory"),
    "line past the end": (["--line", "99999"], "line 99999 is past the end (the file has 10 lines)"),
    "column past the end": (["--line", "2", "--col", "9999"], "column 9999 is past the end of line 2 (last column: 17)"),
}


@pytest.mark.parametrize("case", EARLY)
def test_flag_errors_before_any_model_loads(capsys, src, case, monkeypatch):
    from completiond.models import loader as models

    def no_load(*a, **k):
        raise AssertionError("a model was loaded before the flags were checked")

    monkeypatch.setattr(models, "load", no_load)
    extra, needle = EARLY[case]
    argv = ["complete", str(src), "--line", "1", "--col", "1", *extra]
    code, out, err = run_main(capsys, *argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err, err


def test_quantized_target_reported_in_json(capsys, src, tiny_dir):
    code, out, err = run_main(capsys, "complete", str(src), "--line", "9", "--col", "1", "--mode", "ar",
                              "--target", str(tiny_dir), "--dtype", "bfloat16", "--quant", "int8", "--max-tokens", "4",
                              "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["quant"] == "int8" and res["backend"] == "lean" and res["dtype"] == "bfloat16"
    from completiond.models.kernels import cpu_kernel
    assert res["int8_kernel"] == cpu_kernel.name() and res["int8_kernel"].removesuffix("+value-pairs").removesuffix("+bf16-attention").removesuffix("+zmm") in (
        "completiond-avx2", "completiond-avx2+int16-activations", "completiond-avx2+int16-activations+avx512-vnni",
        "completiond-avx2+int8-activations", "completiond-avx2+int8-activations+avx512-vnni",
        "completiond-avx2+int8-activations+avx-vnni", "torch")


def test_quant_auto_by_device_and_dtype():
    import torch

    from completiond.models.catalog import ModelError
    from completiond.models.quant import pick_quant

    cpu = torch.device("cpu")
    assert pick_quant("auto", cpu, torch.bfloat16) == "int8"
    from completiond.models.kernels import cpu_kernel
    # torch's int8 kernel wants bf16 activations; completiond's own runs float32 ones as fast
    want = "int8" if cpu_kernel.enabled() else "none"
    assert pick_quant("auto", cpu, torch.float32) == want  # float32 chosen by --dtype auto
    assert pick_quant("auto", cpu, torch.float32, dtype_asked=True) == "none"  # --dtype float32: full precision
    assert pick_quant("auto", cpu, torch.float16) == "none"
    assert pick_quant("auto", torch.device("cuda"), torch.bfloat16) == "none"
    with pytest.raises(ModelError, match="CPU kernels only"):
        pick_quant("int4", torch.device("cuda"), torch.bfloat16)


def test_prefill_dtype_by_measured_bf16_speed(tmp_path, monkeypatch):
    """Prefill chunks multiply in float32 on a CPU whose bf16 matmuls over many rows measured slower
    (AVX2 only), in the model's dtype elsewhere; the measurement is cached per CPU name *and* vector
    extensions (two machines both called "AMD EPYC" differ in AVX512-BF16), and reported with the rest."""
    import torch

    from completiond.models import device
    from completiond.service.protocol import model_info

    monkeypatch.setenv("COMPLETIOND_CACHE", str(tmp_path))
    cpu = torch.device("cpu")
    calls = []

    def fake_ms(dtype, rows, n=4096, reps=12):
        calls.append(rows)
        return {(4, torch.float32): 10.0, (4, torch.bfloat16): 6.0,  # decode: bf16 wins
                (256, torch.float32): 5.0, (256, torch.bfloat16): 29.0}[(rows, dtype)]  # prefill: fp32 wins

    monkeypatch.setattr(device, "_matmul_ms", fake_ms)
    monkeypatch.setattr(device, "cpu_features", lambda: ["avx2"])
    assert device.cpu_bf16() == {"bf16_faster": True, "bf16_gemm_faster": False}
    assert device.pick_bulk_dtype(torch.bfloat16, cpu) == torch.float32
    assert device.pick_bulk_dtype(torch.float32, cpu) == torch.float32
    assert device.pick_bulk_dtype(torch.bfloat16, torch.device("cuda")) == torch.bfloat16
    n = len(calls)
    device.cpu_bf16()
    assert len(calls) == n  # cached
    monkeypatch.setattr(device, "cpu_features", lambda: ["avx2", "avx512f", "avx512_bf16"])
    monkeypatch.setattr(device, "_matmul_ms", lambda dtype, rows, n=4096, reps=12: 1.0 if dtype == torch.bfloat16 else 3.0)
    assert device.cpu_bf16() == {"bf16_faster": True, "bf16_gemm_faster": True}  # another CPU: measured again
    assert device.pick_bulk_dtype(torch.bfloat16, cpu) == torch.bfloat16

    class Target:
        name, device, dtype, bulk_dtype, meta = "t", cpu, torch.bfloat16, torch.float32, {"quant": "int8"}

    info = model_info(Target(), None)
    assert info["dtype"] == "bfloat16" and info["prefill_dtype"] == "float32"


@pytest.mark.parametrize("argv", [["bench", "--repo", ".", "--plot", "x.png"],
                                  ["train-draft", "eval", "--plot", "x.png"]])
def test_plot_without_matplotlib_is_one_line_before_any_work(argv, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as after `pip install completiond` without [bench]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--plot needs matplotlib: pip install -e '.[" in err[0], err
