"""Named models: parts located through package metadata, hash-checked, assembled atomically."""

import hashlib
import threading
from pathlib import Path

import pytest

from completiond.models import catalog
from completiond.models.catalog import ModelError, NamedModel, Part, assemble


def fake_dist(root: Path, dist: str, version: str, rel: str, data: bytes) -> None:
    """An installed distribution as importlib.metadata sees it: a dist-info dir plus one data file."""
    mod = dist.replace("-", "_")
    info = root / f"{mod}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "RECORD").write_text(f"{rel},,\n")
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_bytes(data)


@pytest.fixture
def parts(tmp_path, monkeypatch):
    site = tmp_path / "site"
    chunks = [bytes([i]) * (1000 + i) for i in range(3)]
    for i, data in enumerate(chunks, 1):
        fake_dist(site, f"fake-model-part{i}", "1.0", f"fake_model_part{i}/data/part{i:02d}.bin", data)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("COMPLETIOND_CACHE", str(tmp_path / "cache"))
    whole = b"".join(chunks)
    return whole, catalog._parts("fake-model-part", "fake_model_part", "1.0", 3, 2)


def named(parts, sha: str, size: int) -> NamedModel:
    return NamedModel(name="fake", extra="fake", size=size, sha256=sha, parts=parts, fim=True)


def test_assembles_in_order_and_verifies(parts):
    whole, ps = parts
    out = assemble(named(ps, hashlib.sha256(whole).hexdigest(), len(whole)), progress=False)
    assert out.read_bytes() == whole
    assert assemble(named(ps, hashlib.sha256(whole).hexdigest(), len(whole)), progress=False) == out  # cached


def test_wrong_hash_is_refused_and_leaves_nothing(parts):
    whole, ps = parts
    with pytest.raises(ModelError, match="sha256"):
        assemble(named(ps, "0" * 64, len(whole)), progress=False)
    left = [p.name for p in catalog.gguf_path(named(ps, "", 0)).parent.iterdir()]
    assert not [n for n in left if n.endswith((".gguf", ".partial"))], left


def test_wrong_size_missing_part_and_other_version_are_refused(parts):
    whole, ps = parts
    sha = hashlib.sha256(whole).hexdigest()
    with pytest.raises(ModelError, match="bytes"):
        assemble(named(ps, sha, len(whole) + 1), progress=False)
    with pytest.raises(ModelError, match="not installed.*pip install"):
        assemble(named(ps + (Part("fake-model-part9", "1.0", "x.bin"),), sha, len(whole)), progress=False)
    other = (Part(ps[0].dist, "2.0", ps[0].file),) + ps[1:]
    with pytest.raises(ModelError, match="pins 2.0"):
        assemble(named(other, sha, len(whole)), progress=False)


def test_two_assemblies_at_once_both_get_the_file(parts):
    whole, ps = parts
    m = named(ps, hashlib.sha256(whole).hexdigest(), len(whole))
    results, errors = [], []

    def run():
        try:
            results.append(assemble(m, progress=False))
        except Exception as e:  # noqa: BLE001 - the test reports any failure
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 1 and results[0].read_bytes() == whole


def test_unknown_model_name_is_a_clear_error():
    from completiond.models.loader import resolve

    with pytest.raises(ModelError, match="unknown model 'qwen-nonexistent'.*qwen2.5-coder-1.5b"):
        resolve("qwen-nonexistent")


def test_defaults_by_device():
    assert catalog.default_models("cuda") == ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
    assert catalog.default_models("cpu")[0] in catalog.NAMED


def test_the_default_extra_installs_both_code_models_at_their_pins():
    """`pip install -e '.[default-model]'` installs the 1.5B as well as the 0.5B: the daemon picks the
    default by measuring the machine, so both must be there; `coder` stays as an alias."""
    import tomllib

    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = set(extras["default-model"])
    for m in (catalog.CODER_15B, catalog.CODER_05B):
        assert m.extra == "default-model"
        assert {f"{p.dist}=={p.version}" for p in m.parts} <= pins, m.name
    assert extras["coder"] == ["completiond[default-model]"]
