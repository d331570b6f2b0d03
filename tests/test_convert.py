"""The streaming converter (models/convert.py) against the transformers path it replaces.

The reference (tests/tiny_gguf.py: the whole GGUF de-quantized by transformers into a float32
checkpoint, loaded in the dtype, quantized, saved) and the streaming converter must write the same
files byte for byte, for every weights form, tied and untied; the conversion a start runs (in a
child process) reports its progress and says in one line why it cannot run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tiny_gguf import convert_with_transformers, write_qwen2_gguf
from completiond.models.catalog import ModelError
from completiond.models import convert, integrity, runtime
from completiond.models.loader import ensure_runtime
from completiond.models.quant import w4_native

FORMS = [("bfloat16", "int8"), ("float32", "int8"), ("bfloat16", "none"), ("float32", "none"),
         ("bfloat16", "int4"), ("float32", "int4")]


def files(folder: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in folder.iterdir() if f.is_file()}


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("dtype,scheme", FORMS)
def test_streaming_conversion_writes_the_transformers_paths_bytes(tmp_path, dtype, scheme, tied):
    gguf = write_qwen2_gguf(tmp_path / "tiny.gguf", seed=5, tied=tied)
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    want = convert_with_transformers(gguf, old, getattr(torch, dtype), scheme)
    got = convert.convert(gguf, new, getattr(torch, dtype), scheme)
    assert got == want
    assert files(new) == files(old)
    assert set(want) >= {"config.json", "generation_config.json", "tokenizer.json",
                         runtime.weights_file(getattr(torch, dtype), scheme), runtime.embed_file(getattr(torch, dtype))}
    if scheme == "int4" and w4_native():  # the w4 output layer and MLP really are in the file
        meta = runtime.map_file(new / runtime.weights_file(getattr(torch, dtype), scheme))["__metadata__"]
        schemes = {q["scheme"] for q in json.loads(meta["layout"])["quant"].values()}
        assert schemes == {"int8", "w4"}


def test_big_tensors_are_converted_a_block_of_rows_at_a_time(tmp_path, monkeypatch):
    """Blocks of rows (how the embedding and output layer of a real model are read) give the same bytes."""
    gguf = write_qwen2_gguf(tmp_path / "tiny.gguf", seed=6)
    whole = convert.convert(gguf, tmp_path / "whole", torch.bfloat16, "int8")
    monkeypatch.setattr(convert, "ROW_BYTES", 200)  # a few rows of the tiny model's Q8_0 tensors
    seen = []
    blocks = convert.convert(gguf, tmp_path / "blocks", torch.bfloat16, "int8", lambda d, t: seen.append((d, t)))
    assert blocks == whole
    assert len(seen) > 40 and seen == sorted(seen) and seen[-1][0] == seen[-1][1]


@pytest.mark.parametrize("scheme", ["int8", "int4"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_the_output_layer_quantized_in_blocks_of_rows_is_the_whole_ones(tmp_path, monkeypatch, scheme, tied):
    """The output layer is quantized from blocks of its rows (never whole in memory): with blocks
    smaller than the tiny vocabulary, the files are still the transformers path's."""
    from completiond.models import quant

    monkeypatch.setattr(quant, "_ROWS", 64)  # both paths quantize 64 rows at a time; blocks of 128
    monkeypatch.setattr(convert, "HEAD_BLOCKS", 2)
    gguf = write_qwen2_gguf(tmp_path / "tiny.gguf", seed=10, tied=tied)
    old = tmp_path / "old"
    old.mkdir()
    want = convert_with_transformers(gguf, old, torch.float32, scheme)
    assert convert.convert(gguf, tmp_path / "new", torch.float32, scheme) == want


def test_a_first_start_converts_in_a_child_with_progress(tmp_path, monkeypatch):
    monkeypatch.setenv("COMPLETIOND_CACHE", str(tmp_path / "cache"))
    gguf = write_qwen2_gguf(tmp_path / "tiny.gguf", seed=7)
    folder = tmp_path / "cache" / "runtime" / "tiny"
    pid = os.getpid()
    seen = []
    monkeypatch.setattr(convert, "convert", lambda *a, **k: pytest.fail("converted in this process"))
    ensure_runtime(gguf, folder, torch.bfloat16, "int8", progress=False, on_progress=seen.append)
    assert os.getpid() == pid and seen and seen == sorted(seen) and seen[-1] == 1.0
    assert not integrity.check(folder, ["config.json", *runtime.form_files(torch.bfloat16, "int8")])
    ref = tmp_path / "ref"
    ref.mkdir()
    convert_with_transformers(gguf, ref, torch.bfloat16, "int8")
    for name in runtime.form_files(torch.bfloat16, "int8"):
        assert (folder / name).read_bytes() == (ref / name).read_bytes(), name


def test_too_little_memory_or_disk_is_one_line_before_any_work(tmp_path, monkeypatch):
    gguf = write_qwen2_gguf(tmp_path / "tiny.gguf", seed=8)
    out = tmp_path / "out"
    out.mkdir()
    mem, disk = convert.needs(convert.read_gguf(gguf)[1], torch.bfloat16, "int8")
    monkeypatch.setattr(convert, "available_memory", lambda: mem - 1)
    with pytest.raises(convert.ResourceError, match=r"^not enough memory to convert tiny.gguf: it needs [\d.]+ GB"):
        convert.convert(gguf, out, torch.bfloat16, "int8")
    assert not list(out.iterdir())
    monkeypatch.setattr(convert, "available_memory", lambda: mem)
    monkeypatch.setattr(convert.shutil, "disk_usage", lambda p: type("U", (), {"free": disk - 1})())
    with pytest.raises(convert.ResourceError, match="^not enough disk to convert tiny.gguf"):
        convert.convert(gguf, out, torch.bfloat16, "int8")
    assert not list(out.iterdir())


def test_a_broken_gguf_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("COMPLETIOND_CACHE", str(tmp_path / "cache"))
    gguf = write_qwen2_gguf(tmp_path / "tiny.gguf", seed=9)
    data = gguf.read_bytes()
    gguf.write_bytes(data[: len(data) // 2])  # cut in the tensors
    folder = tmp_path / "cache" / "runtime" / "tiny"
    with pytest.raises(ModelError, match=r"^cannot convert tiny.gguf: ") as e:
        ensure_runtime(gguf, folder, torch.bfloat16, "int8", progress=False)
    assert "\n" not in str(e.value) and "Traceback" not in str(e.value)
    assert not folder.exists() and not [p for p in folder.parent.iterdir() if p.name.endswith(".partial")]


def test_status_shows_the_converting_phase_and_its_progress():
    """The daemon's loader reports a conversion as one phase whose progress moves (what the editors show)."""
    import asyncio

    from completiond.service.daemon import Daemon

    seen = []

    def loader(index, phase):
        phase("loading target qwen2.5-coder-1.5b")
        for percent in (0.0, 42.5, 100.0):
            phase("converting qwen2.5-coder-1.5b int4", percent)
            seen.append(daemon.loading_status())
        phase("loading draft none")
        seen.append(daemon.loading_status())
        raise RuntimeError("stop here")

    daemon = Daemon(loader, {"target": "qwen2.5-coder-1.5b"})
    asyncio.run(daemon._load())
    assert [(s["phase"], s["progress"]) for s in seen] == [
        ("converting qwen2.5-coder-1.5b int4", 0.0), ("converting qwen2.5-coder-1.5b int4", 42.5),
        ("converting qwen2.5-coder-1.5b int4", 100.0), ("loading draft none", None)]
    assert [p["phase"] for p in seen[-1]["phases_done"]] == [
        "starting", "loading target qwen2.5-coder-1.5b", "converting qwen2.5-coder-1.5b int4"]


def test_a_named_models_conversion_reports_its_one_spelling(tmp_path, monkeypatch):
    """A first start that converts a named model reports it as status names it once loaded
    (`converting qwen2.5-coder-1.5b@int4`); another GGUF keeps its file name and form."""
    from completiond.models.loader import conversion_progress

    monkeypatch.setenv("COMPLETIOND_CACHE", str(tmp_path / "cache"))
    gguf = write_qwen2_gguf(tmp_path / "qwen2.5-coder-1.5b.gguf", seed=9)
    seen: list[tuple[str, float]] = []
    with conversion_progress(lambda what, f: seen.append((what, f))):
        ensure_runtime(gguf, tmp_path / "cache" / "runtime" / "qwen2.5-coder-1.5b", torch.bfloat16, "int4",
                       progress=False)
        ensure_runtime(gguf, tmp_path / "cache" / "runtime" / "mine-0123", torch.bfloat16, "int8", progress=False)
    assert {what for what, _ in seen} == {"qwen2.5-coder-1.5b@int4", "qwen2.5-coder-1.5b int8"}
    assert [f for what, f in seen if what.endswith("@int4")][-1] == 1.0
