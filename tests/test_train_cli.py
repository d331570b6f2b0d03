"""`completiond train-draft`: bad paths and flags give one line on stderr and exit 2 before any model loads."""

from pathlib import Path

import pytest

from completiond import cli
from completiond.models import loader as models
from completiond.draft.train import TrainConfig, train


@pytest.fixture
def no_models(monkeypatch):
    def no_load(*a, **k):
        raise AssertionError("a model was loaded before the flags were checked")

    monkeypatch.setattr(models, "load", no_load)
    monkeypatch.setattr(models, "load_draft", no_load)


@pytest.fixture
def corpus(tmp_path) -> Path:
    """Shard names are all the flag checks look at."""
    c = tmp_path / "corpus"
    c.mkdir()
    (c / "train_00000.npz").write_bytes(b"")
    (c / "heldout_00000.npz").write_bytes(b"")
    return c


def cases(tmp: Path, corpus: Path) -> dict[str, tuple[list[str], str]]:
    a_file = tmp / "a_file"
    a_file.write_text("not a directory\n")
    junk = tmp / "junk.pt"
    junk.write_bytes(b"this is not a checkpoint")
    broken = tmp / "broken"  # a run to resume whose checkpoint is not one
    broken.mkdir()
    (broken / "checkpoint.pt").write_bytes(b"truncated")
    half = tmp / "half"  # labelled train shards but no held-out ones
    half.mkdir()
    (half / "train_00000.npz").write_bytes(b"")
    out = ["--out", str(tmp / "out")]
    return {
        "export without checkpoint": (["export", "--ckpt", str(tmp / "none.pt"), "--corpus", str(corpus), *out],
                                      "none.pt: no such file"),
        "export junk checkpoint": (["export", "--ckpt", str(junk), "--corpus", str(corpus), *out],
                                   "not a train-draft checkpoint"),
        "export missing corpus": (["export", "--ckpt", str(junk), "--corpus", str(tmp / "nope"), *out],
                                  "no such directory"),
        "export out is a file": (["export", "--ckpt", str(junk), "--corpus", str(corpus), "--out", str(a_file)],
                                 "exists and is not a directory"),
        "train missing corpus": (["train", "--corpus", str(tmp / "missing"), *out], "no such directory"),
        "train corpus without heldout": (["train", "--corpus", str(half), *out], "no heldout_*.npz shards"),
        "train out is a file": (["train", "--corpus", str(corpus), "--out", str(a_file)], "not a directory"),
        "train broken resume": (["train", "--corpus", str(corpus), "--out", str(broken)],
                                "not a train-draft checkpoint"),
        "train zero steps": (["train", "--corpus", str(corpus), "--steps", "0", *out], "--steps 0: must be at least 1"),
        "train zero batch": (["train", "--corpus", str(corpus), "--batch", "0", *out], "--batch 0"),
        "train negative lr": (["train", "--corpus", str(corpus), "--lr", "-1", *out], "--lr -1.0: must be positive"),
        "train hidden not x64": (["train", "--corpus", str(corpus), "--hidden", "100", *out], "multiple of 64"),
        "train steps not a number": (["train", "--steps", "many"], "invalid int value"),
        "label zero tokens": (["label", "--tokens", "0", *out], "--tokens 0: must be at least 1"),
        "label out is a file": (["label", "--out", str(a_file)], "exists and is not a directory"),
        "label bad dtype": (["label", "--dtype", "int3", *out], "invalid choice"),
        "eval bad lengths": (["eval", "--repo", str(tmp), "--lengths", "1,x"], "--lengths 1,x"),
        "eval zero length": (["eval", "--repo", str(tmp), "--lengths", "0,2"], "positive whole numbers"),
        "eval missing repo": (["eval", "--repo", str(tmp / "gone")], "not a directory"),
        "eval unpinned pypi repo": (["eval", "--repo", "pypi:toolz"], "pin a version"),
        "eval bad self draft": (["eval", "--repo", str(tmp), "--draft", "self:abc"], "whole number"),
        "eval zero positions": (["eval", "--repo", str(tmp), "--positions", "0"], "--positions 0"),
    }


CASES = [
    "export without checkpoint", "export junk checkpoint", "export missing corpus", "export out is a file",
    "train missing corpus", "train corpus without heldout", "train out is a file", "train broken resume",
    "train zero steps",
    "train zero batch", "train negative lr", "train hidden not x64", "train steps not a number",
    "label zero tokens", "label out is a file", "label bad dtype", "eval bad lengths", "eval zero length",
    "eval missing repo", "eval unpinned pypi repo", "eval bad self draft", "eval zero positions"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_one_line_exit_2(capsys, tmp_path, corpus, no_models, case):
    argv, needle = cases(tmp_path, corpus)[case]
    code = cli.main(["train-draft", *argv])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err, err
    assert not (tmp_path / "out").exists()  # a rejected command leaves nothing behind


def test_defaults_without_a_checkpoint(capsys, tmp_path, monkeypatch, no_models):
    """`train-draft export` with no arguments in a fresh directory: the default checkpoint is missing."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train-draft", "export", "--out", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert "--ckpt data/draft-train/checkpoint.pt: no such file" in err and len(err.strip().splitlines()) == 1
    assert cli.main(["train-draft", "train"]) == 2
    assert "--corpus data/draft-corpus: no such directory" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()


def test_library_train_does_not_create_out_without_corpus(tmp_path):
    with pytest.raises(FileNotFoundError, match="train-draft label"):
        train(tmp_path / "missing", tmp_path / "out", TrainConfig(steps=1))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("step", ["label", "train", "export", "eval"])
def test_every_option_has_help(step):
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["train-draft"]
    steps = next(a for a in sub._actions if a.dest == "step").choices[step]
    missing = [a.option_strings[0] for a in steps._actions if a.option_strings and not a.help]
    assert missing == []


def test_every_bench_option_has_help():
    parser = cli.build_parser()
    bench = next(a for a in parser._actions if a.dest == "command").choices["bench"]
    shared = {"--dtype", "--device"}  # cli.model_flags' own, shared with complete and serve
    missing = [a.option_strings[0] for a in bench._actions
               if a.option_strings and not a.help and a.option_strings[0] not in shared]
    assert missing == []


def test_export_writes_a_loadable_draft(capsys, tmp_path, no_models):
    """The good path still works: a (tiny, untrained) checkpoint exports to safetensors + vocab map + card."""
    import dataclasses

    import numpy as np
    import torch

    from completiond.draft.train import make_model

    cfg = TrainConfig(vocab=64, hidden=64, layers=1, heads=1, intermediate=128, window=16)
    keep = np.arange(63)
    ck = {"cfg": dataclasses.asdict(cfg), "keep": torch.from_numpy(keep),
          "model": make_model(cfg, None, keep, 2, 1).state_dict(),
          "step": 0, "log": []}
    torch.save(ck, tmp_path / "checkpoint.pt")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    np.savez(corpus / "train_00000.npz", files=np.array(["/x/a.py"]), lengths=np.array([5]))
    out = tmp_path / "weights"
    assert cli.main(["train-draft", "export", "--ckpt", str(tmp_path / "checkpoint.pt"), "--corpus", str(corpus),
                     "--out", str(out)]) == 0, capsys.readouterr().err
    assert {"model.safetensors", "config.json", "vocab_map.json", "MODEL_CARD.md", "training_files.json"} <= {
        p.name for p in out.iterdir()}


class _Payload:
    """Unpickling this runs code: a planted checkpoint must not get that far."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_checkpoint_cannot_run_code(tmp_path):
    """`torch.load` without weights_only unpickles anything: a checkpoint.pt found in an output folder
    (someone else's, or a planted one) would run its code on `train-draft` resume or export."""
    import torch

    from completiond.draft.train import load_checkpoint

    marker = tmp_path / "ran"
    torch.save({"cfg": {}, "keep": [], "model": {}, "step": 0, "log": [], "x": _Payload(marker)},
               tmp_path / "checkpoint.pt")
    with pytest.raises(ValueError, match="not a train-draft checkpoint"):
        load_checkpoint(tmp_path / "checkpoint.pt")
    assert not marker.exists()
