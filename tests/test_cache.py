"""The converted-model cache: a GGUF converted once into the runtime form (int8 weights and scales as
quantization makes them, the embedding, norms, tokenizer), mapped at start; every file with a digest
checked when its stat stamp changes; damaged or partial files rebuilt; stale partial folders removed.

A tiny Qwen2 GGUF (tests/tiny_gguf.py: Q8_0 weights, a BPE tokenizer) stands in for the named models.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tiny
from tiny_gguf import dequantize_with_transformers, write_qwen2_gguf
from completiond import cli
from completiond.core.engine import Engine, Request
from completiond.models.quant import QuantLinear
from completiond.models import integrity, runtime
from completiond.models.loader import load, runtime_dir

FORMS = [("bfloat16", "int8"), ("float32", "int8"), ("bfloat16", "none"), ("float32", "int4")]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One cache root for the module (calibration and the int8 kernel are measured and built once);
    each test converts its own GGUF file, so its runtime folder is its own."""
    root = tmp_path_factory.mktemp("cache")
    old = os.environ.get("COMPLETIOND_CACHE")
    os.environ["COMPLETIOND_CACHE"] = str(root)
    yield root
    if old is None:
        del os.environ["COMPLETIOND_CACHE"]
    else:
        os.environ["COMPLETIOND_CACHE"] = old


@pytest.fixture
def gguf(tmp_path, cache) -> Path:
    return write_qwen2_gguf(tmp_path / "tiny-qwen2.gguf", seed=3)


def folder_of(gguf: Path) -> Path:
    from completiond.models.loader import resolve

    return resolve(str(gguf))[0]


def tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Everything a pass reads: parameters, buffers and each QuantLinear's weights, scales, bias,
    residual, error norms and full-precision head."""
    out = {}
    for path, mod in model.named_modules():
        for name, t in list(mod._parameters.items()) + list(mod._buffers.items()):
            if t is not None:
                out[f"{path}.{name}"] = t
        if isinstance(mod, QuantLinear):
            extra = {"bias": mod.bias, "err_norm": mod.err_norm, "deq_norm": mod.deq_norm,
                     "full_weight": mod.full_weight}
            if mod.residual is not None:
                extra.update(residual_q=mod.residual[0], residual_s=mod.residual[1])
            out.update({f"{path}.{k}": v for k, v in extra.items() if v is not None})
    return out


def greedy(lm, prompt: list[int]) -> list[int]:
    return Engine(lm, None, backend="lean").complete(Request(prompt=prompt, mode="ar", max_tokens=12)).token_ids


@pytest.mark.parametrize("dtype,quant", FORMS)
def test_runtime_form_is_bit_identical_to_quantizing_the_float_checkpoint(gguf, tmp_path, dtype, quant):
    """Today's path (the float32 checkpoint loaded in the dtype, then quantized) and the mapped
    runtime form hold the same tensors bit for bit, and complete the same."""
    dense = tmp_path / "float32"
    dequantize_with_transformers(gguf, dense)
    before = load(str(dense), "target", "cpu", dtype, quant)
    after = load(str(gguf), "target", "cpu", dtype, quant)
    assert after.meta["runtime"].endswith(runtime.weights_file(getattr(torch, dtype), quant))
    a, b = tensors(before.model), tensors(after.model)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
    # the runtime form of a Qwen2 loads without transformers (models/skeleton.py): its config has
    # config.json's fields with Qwen2Config's values, and what the code reads of a config matches
    assert type(after.model).__name__ == "Qwen2Skeleton" and type(after.tokenizer).__name__ == "FastTokenizer"
    ours = after.model.config
    for key in [k for k in vars(ours) if k != "dtype"] + ["model_type", "final_logit_softcapping", "head_dim",
                                                          "attn_logit_softcapping", "query_pre_attn_scalar"]:
        assert getattr(ours, key, None) == getattr(before.model.config, key, None), key
    assert before.eos_ids() == after.eos_ids()
    prompt = after.tokenizer.encode((tiny.STDLIB / "textwrap.py").read_text()[:600], add_special_tokens=False)
    assert before.tokenizer.encode("def f(x):\n    return x") == after.tokenizer.encode("def f(x):\n    return x")
    assert greedy(before, prompt) == greedy(after, prompt)


def test_a_start_reads_no_float_checkpoint_and_quantizes_nothing(gguf, monkeypatch):
    from transformers import AutoModelForCausalLM

    from completiond.models import quant

    first = load(str(gguf), "target", "cpu", "bfloat16", "int8")
    folder = folder_of(gguf)
    assert not list(folder.rglob("model.safetensors"))  # no float copy kept

    def refuse(*a, **k):
        raise AssertionError("the hot path must not load a float checkpoint or quantize")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(quant, "quantize", refuse)
    again = load(str(gguf), "target", "cpu", "bfloat16", "int8")
    # mapped, not copied: the weights are views of the file's mapping, and the lean forward's fused
    # q/k/v and gate/up matrices view the stored siblings instead of concatenating copies
    q = again.model.model.layers[0].self_attn.q_proj
    engine = Engine(again, None, backend="lean")
    fused = engine.runner.base.layers[0].qkv
    assert fused.packed.data_ptr() == q.packed.data_ptr() and fused.packed.shape[0] > q.packed.shape[0]
    prompt = first.tokenizer.encode("def add(a, b):\n    return", add_special_tokens=False)
    assert greedy(first, prompt) == engine.complete(Request(prompt=prompt, mode="ar", max_tokens=12)).token_ids


def test_weights_file_is_a_valid_safetensors_file(gguf):
    from safetensors import safe_open

    load(str(gguf), "target", "cpu", "float32", "int8")
    path = folder_of(gguf) / runtime.weights_file(torch.float32, "int8")
    mapped = runtime.map_file(path)
    with safe_open(str(path), "pt") as f:
        assert f.metadata()["format"] == runtime.FORMAT
        for name in f.keys():
            assert torch.equal(f.get_tensor(name), mapped[name])
            if not name.startswith("__pad__"):
                assert mapped[name].data_ptr() % mapped[name].element_size() == 0


def complete_cli(capsys, gguf: Path, src: Path) -> tuple[int, dict, str]:
    rc = cli.main(["complete", str(src), "--line", "2", "--col", "5", "--target", str(gguf), "--draft", "none",
                   "--mode", "ar", "--max-tokens", "8", "--dtype", "bfloat16", "--quant", "int8", "--json",
                   "--no-daemon"])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else {}), err


@pytest.fixture
def src(tmp_path) -> Path:
    p = tmp_path / "m.py"
    p.write_text("def area(r):\n    return 3.14159 * r * r\n\nprint(area(2))\n")
    return p


def test_a_zeroed_embedding_of_the_right_size_is_detected_and_rebuilt(gguf, src, capsys):
    """Before: a zeroed embed_tokens file of the right size gave garbage with rc 0."""
    rc, good, _ = complete_cli(capsys, gguf, src)
    assert rc == 0
    emb = folder_of(gguf) / runtime.embed_file(torch.bfloat16)
    size = emb.stat().st_size
    emb.write_bytes(b"\0" * size)
    rc, again, err = complete_cli(capsys, gguf, src)
    assert rc == 0 and again["token_ids"] == good["token_ids"], err
    lines = [ln for ln in err.splitlines() if "damaged" in ln]
    assert len(lines) == 1 and emb.name in lines[0], err
    assert emb.read_bytes() != b"\0" * size
    assert not integrity.check(emb.parent, [emb.name])
    rc, _, err = complete_cli(capsys, gguf, src)  # intact now: nothing to say
    assert rc == 0 and "completiond:" not in err


def test_a_truncated_weights_file_is_detected_and_rebuilt(gguf, src, capsys):
    """Before: a truncated model.safetensors failed every later load with a SafetensorError traceback."""
    rc, good, _ = complete_cli(capsys, gguf, src)
    w = folder_of(gguf) / runtime.weights_file(torch.bfloat16, "int8")
    with open(w, "r+b") as f:
        f.truncate(w.stat().st_size // 2)
    rc, again, err = complete_cli(capsys, gguf, src)
    assert rc == 0 and again["token_ids"] == good["token_ids"], err
    assert sum("damaged" in ln for ln in err.splitlines()) == 1 and w.name in err


def test_a_changed_stamp_alone_rehashes_without_rebuilding(gguf, capsys):
    load(str(gguf), "target", "cpu", "float32", "int8")
    folder = folder_of(gguf)
    w = folder / runtime.weights_file(torch.float32, "int8")
    copy = w.with_name("copy")
    shutil.copy2(w, copy)
    os.replace(copy, w)  # same bytes, new inode and ctime
    before = integrity.read_manifest(folder)[w.name]
    capsys.readouterr()
    load(str(gguf), "target", "cpu", "float32", "int8")
    assert capsys.readouterr().err == ""  # no rebuild, no line
    after = integrity.read_manifest(folder)[w.name]
    assert after["sha256"] == before["sha256"] and after["stamp"] == integrity.stamp(w) != before["stamp"]


def test_a_damaged_tokenizer_or_config_is_rebuilt(gguf, capsys):
    lm = load(str(gguf), "target", "cpu", "float32", "int8")
    folder = folder_of(gguf)
    (folder / "tokenizer.json").write_text("{}")
    capsys.readouterr()
    again = load(str(gguf), "target", "cpu", "float32", "int8")
    assert "tokenizer.json" in capsys.readouterr().err
    assert again.tokenizer.encode("def f(): pass") == lm.tokenizer.encode("def f(): pass")


def test_stale_partial_folders_of_dead_processes_are_removed(gguf, capsys):
    folder = folder_of(gguf)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    stale = folder.parent / f"{folder.name}.{pid}-12345.abcd1234.partial"
    (stale / "float32").mkdir(parents=True)
    (stale / "float32" / "model.safetensors").write_bytes(b"x" * 1000)
    unnamed = folder.parent / f"{folder.name}.k2j3h4.partial"  # an older version's (no pid): stale under the lock
    unnamed.mkdir()
    live = integrity.make_partial_dir(folder.parent, folder.name)  # this process's: kept
    load(str(gguf), "target", "cpu", "float32", "int8")
    err = capsys.readouterr().err
    assert not stale.exists() and not unnamed.exists() and live.exists()
    assert str(stale) in err
    shutil.rmtree(live)


def test_a_conversion_killed_midway_leaves_nothing_that_is_trusted(gguf, tmp_path):
    """A process killed while converting leaves its partial folder (its converting child dies with it);
    the next start removes it and converts."""
    code = (f"import os, sys; sys.path[:0] = {sys.path!r}\n"
            "from completiond.models.loader import load\n"
            f"load({str(gguf)!r}, 'target', 'cpu', 'float32', 'int8', on_progress=lambda f: os._exit(9))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ})
    assert proc.returncode == 9, proc.stderr
    folder = folder_of(gguf)
    assert list(folder.parent.glob(f"{folder.name}.*.partial"))  # left behind by the killed process
    lm = load(str(gguf), "target", "cpu", "float32", "int8")
    assert lm.meta["quant"] == "int8" and not list(folder.parent.glob(f"{folder.name}.*.partial"))


def test_an_old_float32_cache_is_replaced_saying_so(gguf, capsys):
    folder = folder_of(gguf)
    old = folder.parent.parent / "models" / folder.name
    old.mkdir(parents=True)
    (old / "model.safetensors").write_bytes(b"\0" * 4096)
    (old / "config.json").write_text("{}")
    load(str(gguf), "target", "cpu", "float32", "int8")
    err = capsys.readouterr().err
    assert "old float32 form" in err and f"removed the old float32 cache {old}" in err
    assert not old.exists() and folder.is_dir()


def test_named_model_folders_live_under_runtime(cache):
    assert runtime_dir("qwen2.5-coder-0.5b") == cache / "runtime" / "qwen2.5-coder-0.5b"


@pytest.mark.parametrize("config", ["gemma", "qwen2-tied"])
def test_tied_models_round_trip(tmp_path, config):
    """Tied output layers (Gemma 3): the embedding is stored once and the quantized head's
    full-precision weight is the mapped embedding itself."""
    from completiond.models.quant import quantize

    cfg = tiny.gemma_config() if config == "gemma" else tiny.qwen2_config(tied=True)
    lm = tiny.loaded(cfg, seed=1, dtype=torch.bfloat16)
    quantize(lm.model, "int8")
    runtime.save(lm.model, tmp_path, torch.bfloat16, "int8", progress=False)
    got = runtime.open_model(tmp_path, lm.model.config, torch.bfloat16, "int8")
    a, b = tensors(lm.model), tensors(got)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
    head = got.get_output_embeddings()
    assert head.full_weight.data_ptr() == got.get_input_embeddings().weight.data_ptr()
    prompt = list(range(5, 40))
    mapped = tiny.LoadedModel(name="m", model=got, tokenizer=lm.tokenizer, device=lm.device, dtype=lm.dtype)
    assert greedy(lm, prompt) == greedy(mapped, prompt)


def test_the_transformers_backend_and_self_drafts_run_on_the_mapped_skeleton(gguf):
    """A Qwen2 runtime form loads as models/skeleton.py's module tree (no transformers import);
    `--backend transformers` gets transformers' model around the same tensors, and a self:N
    draft shares the target's layers; both complete as the lean forward does."""
    from completiond.core.forward.runner import Runner
    from completiond.models.loader import load_draft

    lm = load(str(gguf), "target", "cpu", "float32", "none")
    assert type(lm.model).__name__ == "Qwen2Skeleton"
    prompt = lm.tokenizer.encode("def add(a, b):\n    return", add_special_tokens=False)
    lean = Runner(lm, backend="lean").extend(prompt)
    with torch.inference_mode():  # tools that call the model (corpus, evaluation) get transformers' forward
        eager = lm.model(torch.tensor([prompt])).logits[0, -1].float()
    torch.testing.assert_close(eager, lean, rtol=1e-4, atol=1e-4)
    plain = greedy(lm, prompt)
    draft = load_draft("self:1", lm)
    assert draft.model.model.layers[0] is lm.model.model.layers[0]
    with_draft = Engine(lm, draft, backend="lean").complete(Request(prompt=prompt, mode="draft", max_tokens=12))
    assert with_draft.token_ids == plain
    embed = lm.model.get_input_embeddings().weight
    ref = Runner(lm, backend="transformers")
    assert type(lm.model).__name__ == "Qwen2ForCausalLM"
    assert lm.model.get_input_embeddings().weight is embed  # the same mapped tensor, not a copy
    torch.testing.assert_close(ref.extend(prompt), lean, rtol=1e-4, atol=1e-4)


def test_int4_forms_of_older_layouts_are_deleted_when_the_new_one_is_written(gguf):
    """The w4 forms of round 9 (one channel per packed row), round 10 (an int8 output layer), round
    11 (vectors one after the other) and round 16 (groups of 32) have the same tensor names as
    today's (groups of 64, pairs of vectors of 8 channels interleaved, a w4 output layer), so they
    live under other names; writing today's removes them (1.3 GB each for a 1.5B)."""
    from completiond.models import quant

    if not quant.w4_native():
        pytest.skip("int4 is torch's here: no w4 form")
    folder = folder_of(gguf)
    folder.mkdir(parents=True, exist_ok=True)
    olds = [folder / f"weights.bfloat16-int4-{form}.safetensors" for form in ("w4", "w4x8", "w4x8-w4head", "w4x16-w4head")]
    for old in olds:
        old.write_bytes(b"an older layout")
    assert runtime.superseded_files(torch.bfloat16, "int4") == [old.name for old in olds]
    lm = load(str(gguf), "target", "cpu", "bfloat16", "int4")
    assert lm.meta["runtime"].endswith("weights.bfloat16-int4-w4g64x16-w4head.safetensors")
    assert not any(old.exists() for old in olds)
    assert lm.model.get_output_embeddings().scheme == "w4"
    assert runtime.superseded_files(torch.bfloat16, "int8") == []
