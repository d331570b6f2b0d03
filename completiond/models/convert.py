"""GGUF -> runtime form (runtime.py), one tensor at a time, in bounded memory.

The GGUF is memory-mapped and its tensor table read (`read_gguf`); each tensor is de-quantized by
gguf-py's own vectorized numpy code (the one transformers' GGUF loader calls for these
architectures), a block of rows at a time for the big ones, processed as transformers processes it
(e.g. Gemma's norms), cast to the model's dtype, quantized as `quant.quantize` quantizes a loaded
model, written and freed; the pages of the mapping it read are dropped from this process. No float
copy of the model ever exists, on disk or in memory: peak memory is the output layer's work (a block
of its rows at a time, its quantized forms whole) plus the libraries, not the model.

What it writes is what the transformers path wrote (de-quantize the whole GGUF into a float32
checkpoint, load that in the dtype, `quantize`, `runtime.save`): the same files, byte for byte
(tests/test_convert.py checks every form against that path, kept in tests/tiny_gguf.py). One
difference by design: an output layer stored apart from the embedding but with the same bytes is
taken as tied (its full weight an alias of the embedding, where the old path stored a copy). The module
skeleton, config.json, generation_config.json and tokenizer still come from transformers (metadata
only; the skeleton on the meta device); buffers (rotary tables) are initialised as from_pretrained
initialises them.

`python -m completiond.models.convert GGUF FOLDER DTYPE SCHEME [PARENT_PID] [--idle]` runs it in a
child process (`loader.ensure_runtime` does: the daemon then keeps none of the conversion's memory;
with PARENT_PID it dies with that process; --idle: at the lowest CPU priority, for a daemon's
background conversion), printing `progress DONE TOTAL` lines, and last `digests {json}` or
`error <one line>`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import mmap
import os
import shutil
import struct
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from . import runtime

ROW_BYTES = 32 << 20  # GGUF bytes de-quantized at a time (a block of rows of a big tensor)
HEAD_BLOCKS = 4  # output layer rows quantized at a time, in blocks of quant._ROWS
Progress = Callable[[int, int], None]  # (bytes of GGUF tensors done, total)


class Tensor(NamedTuple):
    """One tensor of a GGUF: its type, shape (numpy order: rows first) and bytes in the mapping."""

    name: str
    qtype: int
    shape: tuple[int, ...]
    data: np.ndarray  # uint8 [rows, bytes per row] (one row for a 1-D tensor), a view of the mapping
    offset: int  # of its first byte in the file

    @property
    def nbytes(self) -> int:
        return self.data.size

    @property
    def elements(self) -> int:
        return int(np.prod(self.shape))


_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def read_gguf(path: Path) -> tuple[str, list[Tensor], np.ndarray]:
    """(architecture, tensors, the file's mapping) from a GGUF's header and tensor table (format v2/v3).

    gguf-py's GGUFReader also parses every value of every metadata array (the 151,936 tokens and
    their merges: ~8 CPU-s for a Qwen file); the tensors need only the table, so values are skipped."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    mm = np.memmap(path, mode="r", dtype=np.uint8)
    buf = memoryview(mm)
    if bytes(buf[:4]) != b"GGUF" or struct.unpack_from("<I", buf, 4)[0] not in (2, 3):
        raise ValueError(f"{path.name} is not a GGUF file of version 2 or 3")
    n_tensors, n_kv = struct.unpack_from("<QQ", buf, 8)
    at = 24

    def string() -> str:
        nonlocal at
        (n,) = struct.unpack_from("<Q", buf, at)
        at += 8 + n
        return bytes(buf[at - n:at]).decode("utf-8", "replace")

    def value(kind: int):
        nonlocal at
        if kind == 8:
            return string()
        if kind == 9:
            item, count = struct.unpack_from("<IQ", buf, at)
            at += 12
            if item in _SCALARS:
                at += count * struct.calcsize("<" + _SCALARS[item])
            else:
                for _ in range(count):
                    value(item)
            return None
        fmt = "<" + _SCALARS[kind]
        (v,) = struct.unpack_from(fmt, buf, at)
        at += struct.calcsize(fmt)
        return v

    meta = {}
    for _ in range(n_kv):
        key = string()
        (kind,) = struct.unpack_from("<I", buf, at)
        at += 4
        meta[key] = value(kind)
    table = []
    for _ in range(n_tensors):
        name = string()
        (dims,) = struct.unpack_from("<I", buf, at)
        shape = struct.unpack_from(f"<{dims}Q", buf, at + 4)[::-1]  # GGUF lists the innermost first
        qtype, offset = struct.unpack_from("<IQ", buf, at + 4 + 8 * dims)
        at += 4 + 8 * dims + 12
        table.append((name, GGMLQuantizationType(qtype), tuple(int(d) for d in shape), offset))
    align = int(meta.get("general.alignment") or 32)
    start = -(-at // align) * align
    tensors = []
    for name, qtype, shape, offset in table:
        block, size = GGML_QUANT_SIZES[qtype]
        cols = shape[-1]
        rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        row_bytes = cols // block * size
        first = start + offset
        data = mm[first:first + rows * row_bytes].reshape(rows, row_bytes)
        tensors.append(Tensor(name, qtype, shape, data, first))
    return str(meta.get("general.architecture", "")), tensors, mm


class _Source:
    """The GGUF's tensors by their transformers name, de-quantized on demand (float32 -> dtype)."""

    def __init__(self, gguf: tuple[str, list[Tensor], np.ndarray], model: nn.Module, on_progress: Progress | None):
        from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, TensorProcessor,
                                                              get_gguf_hf_weights_map)

        arch, tensors, self.mapped = gguf
        # the processor's config: the GGUF's as transformers parsed it, i.e. the model's (Llama: head counts)
        self.processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=model.config.to_dict())
        kind = type(self.processor).__name__
        if kind not in ("TensorProcessor", "LlamaTensorProcessor", "Gemma2TensorProcessor"):
            raise ValueError(f"GGUF architecture {arch!r} ({kind}) is not supported by the streaming converter")
        # rows can be done a block at a time unless the processor reorders rows (Llama's q/k permutation)
        self.by_rows = kind != "LlamaTensorProcessor"
        self.mapping = get_gguf_hf_weights_map(model, self.processor)  # GGUF name -> transformers name
        self.tensors = {self.mapping[t.name]: t for t in tensors if t.name in self.mapping}
        self.total = sum(t.nbytes for t in self.tensors.values())
        self.done = 0
        self.on_progress = on_progress
        self._page = mmap.PAGESIZE

    def has(self, name: str) -> bool:
        return name in self.tensors

    def same_bytes(self, a: str, b: str) -> bool:
        ta, tb = self.tensors[a], self.tensors[b]
        return ta.qtype == tb.qtype and ta.shape == tb.shape and np.array_equal(ta.data, tb.data)

    def rows(self, name: str, shape: torch.Size, dtype: torch.dtype, step: int = 0) -> Iterator[torch.Tensor]:
        """The tensor in `dtype`, as blocks of `step` rows (default: one block unless it is big)."""
        import gguf

        t = self.tensors[name]
        data = t.data  # uint8 [rows, bytes per row]
        if not self.by_rows or len(shape) < 2:
            step = len(data)
        step = step or max(1, ROW_BYTES // max(1, data.shape[1]))
        for at in range(0, len(data), step):
            w = gguf.dequantize(data[at:at + step], t.qtype)  # float32 [rows, columns]
            w = self.processor.process(weights=w.reshape(-1, *t.shape[1:]) if len(t.shape) > 1 else w.reshape(t.shape),
                                       name=t.name).weights
            w = np.ascontiguousarray(w, dtype=np.float32)
            # float32 tensors come back as views of the read-only mapping: copied, not aliased
            block = torch.from_numpy(w if w.flags.writeable else w.copy()).to(dtype)
            yield block.reshape(-1, *shape[1:]) if len(shape) > 1 else block.reshape(shape)
            self._drop(data[at:at + step])
            self.done += data[at:at + step].size
            if self.on_progress:
                self.on_progress(min(self.done, self.total), self.total)

    def dense(self, name: str, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """The whole tensor in `dtype`, filled a block of rows at a time."""
        out = torch.empty(shape, dtype=dtype)
        if len(shape) < 2:
            for block in self.rows(name, shape, dtype):
                out.copy_(block)
            return out
        at = 0
        for block in self.rows(name, shape, dtype):
            out[at:at + len(block)] = block
            at += len(block)
        return out

    def _drop(self, part: np.ndarray) -> None:
        """Drop the mapping's pages under `part` (a view of it) from this process: clean pages of the
        page cache, which the kernel keeps, but no longer counted in this process's RSS."""
        start = part.ctypes.data - self.mapped.ctypes.data
        lo, hi = start // self._page * self._page, -(-(start + part.size) // self._page) * self._page
        try:
            self.mapped._mmap.madvise(mmap.MADV_DONTNEED, lo, min(hi, len(self.mapped)) - lo)
        except (AttributeError, OSError, ValueError):
            pass  # an advice only


def _linears(model: nn.Module, scheme: str) -> dict[int, str]:
    """id -> "layer" / "head" of the modules `quant.quantize` replaces (none for scheme none)."""
    if scheme == "none":
        return {}
    base = getattr(model, model.base_model_prefix)
    out = {id(c): "layer" for m in base.modules() for _, c in m.named_children() if isinstance(c, nn.Linear)}
    out[id(model.get_output_embeddings())] = "head"
    return out


def _buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every buffer as from_pretrained makes it: allocated on the CPU, then initialised by the model's
    own `_init_weights` (rotary tables, Gemma's embedding scale)."""
    owners = {}
    for name, b in model.named_buffers():
        path, _, attr = name.rpartition(".")
        mod = model.get_submodule(path)
        mod._buffers[attr] = torch.empty_like(b, device="cpu")
        owners[path] = mod
    with torch.no_grad():
        for mod in owners.values():
            model._init_weights(mod)
    return {n: b for n, b in model.named_buffers()}


def _head(blocks: Iterator[torch.Tensor], count: int, bias: torch.Tensor | None, tied: bool, scheme: str) -> nn.Module:
    """The output layer as `quant.quantize_head` makes it from its whole weight, made from blocks of
    HEAD_BLOCKS * quant._ROWS rows of it: quantize_head works a block of quant._ROWS rows at a time (quantized
    weights, scales, error norms and residual are per row), so the blocks' results concatenated are
    its result, without the weight ever whole in memory (0.9 GB in float32 for the 1.5B); each block's
    results are copied into place as they come (`count` blocks). A tied head's full_weight is the
    embedding: not kept here (the file stores an alias)."""
    from .quant import QuantLinear, quantize_head

    whole: dict[str, list] = {}  # attribute -> [tensor for every block's rows, rows filled]

    def put(attr: str, t: torch.Tensor | None) -> None:
        if t is None:
            return
        if attr not in whole:  # room for `count` blocks like the first (the last may be shorter); pages
            whole[attr] = [t.new_empty((len(t) * count, *t.shape[1:])), 0]  # never written stay unallocated
        buf, at = whole[attr]
        buf[at:at + len(t)] = t
        whole[attr][1] = at + len(t)

    form, rows = None, 0
    for w in blocks:
        part = quantize_head(SimpleNamespace(weight=w, bias=None), w if tied else None, scheme)
        form, rows = (part.scheme, part.in_features, part.group), rows + len(w)
        for attr in ("packed", "scales", "err_norm", "deq_norm"):
            put(attr, getattr(part, attr))
        put("residual_q", None if part.residual is None else part.residual[0])
        put("residual_s", None if part.residual is None else part.residual[1])
        del w, part
    got = {attr: buf[:at] for attr, (buf, at) in whole.items()}
    scheme_, k, group = form
    q = QuantLinear(scheme_, got["packed"], got["scales"], rows, k, bias, group, checked=True)
    q.err_norm, q.deq_norm = got.get("err_norm"), got.get("deq_norm")
    if "residual_q" in got:
        q.residual = (got["residual_q"], got["residual_s"])
    if tied:
        q.full_weight = torch.empty(0)  # stands for the embedding: written as an alias of it
    return q


def _items(model: nn.Module, src: _Source, scheme: str, layout: dict) -> Iterator[tuple[str, torch.Tensor, str]]:
    """(name, tensor, group) in runtime._ordered's order for `model` loaded and quantized, made one
    module at a time from the GGUF; fills layout as _ordered does."""
    from . import quant
    from .quant import quantize_linear

    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    embed_name = next(n for n, p in model.named_parameters() if p is embed)
    tied = head.weight is embed or (src.has("lm_head.weight") and src.same_bytes(embed_name, "lm_head.weight"))
    if tied and scheme != "none":
        src.total += src.tensors[embed_name].nbytes  # read for the output layer, and for the embedding file
    linears = _linears(model, scheme)
    buffers = _buffers(model)
    seen: dict[tuple, str] = {}  # buffers are all alive at once: shared ones are stored once, as _ordered does

    def key(t: torch.Tensor) -> tuple:
        return t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride())

    for path, mod in model.named_modules():
        if id(mod) in linears:
            continue  # written by its parent, next to its siblings
        pre = f"{path}." if path else ""
        for n, p in mod._parameters.items():
            if p is None:
                continue
            if p is embed:
                layout["embed"] = pre + n
                layout["aliases"][pre + n] = runtime.EMBED
                continue
            yield pre + n, src.dense(pre + n, p.shape, p.dtype), pre + n
        for n, b in mod._buffers.items():
            if b is None:
                continue
            b = buffers[pre + n]
            if key(b) in seen:
                layout["aliases"][pre + n] = seen[key(b)]
            else:
                seen[key(b)] = pre + n
                yield pre + n, b, pre + n
        quants = []
        for n, c in mod.named_children():
            if id(c) not in linears:
                continue
            bias = None if c.bias is None else src.dense(f"{pre}{n}.bias", c.bias.shape, c.bias.dtype)
            if linears[id(c)] == "head":
                name = embed_name if tied and not src.has(f"{pre}{n}.weight") else f"{pre}{n}.weight"
                step = HEAD_BLOCKS * quant._ROWS
                count = -(-c.weight.shape[0] // step)
                q = _head(src.rows(name, c.weight.shape, c.weight.dtype, step), count, bias, tied, scheme)
            else:
                w = src.dense(f"{pre}{n}.weight", c.weight.shape, c.weight.dtype)
                q = quantize_linear(n, SimpleNamespace(weight=w, bias=bias), scheme)
                del w
            quants.append((n, q))
            layout["quant"][pre + n] = {
                "scheme": q.scheme, "group": q.group, "out": q.out_features, "in": q.in_features,
                "tensors": [a for a in runtime._QUANT_ATTRS if runtime._quant_tensor(q, a) is not None]}
        for attr in runtime._QUANT_ATTRS:  # siblings' packed weights back to back, then their scales, ...
            for n, q in quants:
                t = runtime._quant_tensor(q, attr)
                if t is None:
                    continue
                if attr == "full_weight" and tied:
                    layout["aliases"][f"{pre}{n}.{attr}"] = runtime.EMBED
                else:
                    yield f"{pre}{n}.{attr}", t.detach(), f"{pre}*.{attr}"
        del quants
    if not layout["embed"]:
        raise runtime.RuntimeFormError("the input embedding is not a parameter of the model")


@contextlib.contextmanager
def _metadata_once():
    """transformers parses a GGUF's metadata with gguf-py for the tokenizer's config and again for
    AutoConfig (~9 CPU-s each for a Qwen file: every token and merge): meanwhile, once."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    real, parsed = gguf_utils.load_gguf_checkpoint, {}

    def once(path, return_tensors=False, **kwargs):
        if return_tensors or kwargs:
            return real(path, return_tensors=return_tensors, **kwargs)
        if path not in parsed:
            parsed[path] = real(path, return_tensors=False)
        return copy.deepcopy(parsed[path])  # callers may change what they get

    gguf_utils.load_gguf_checkpoint = once
    try:
        yield
    finally:
        gguf_utils.load_gguf_checkpoint = real


def convert(gguf: Path, folder: Path, dtype: torch.dtype, scheme: str,
            on_progress: Progress | None = None) -> dict[str, str]:
    """Write the runtime form of `gguf` for (dtype, scheme) into `folder` (a fresh partial folder):
    config.json, generation_config.json, the tokenizer's files, the weights and the embedding.
    Returns {file name: sha256}."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from .integrity import sha256_file

    folder.mkdir(parents=True, exist_ok=True)
    table = read_gguf(gguf)
    check_room(gguf, folder, dtype, scheme, table[1])  # before any work
    with _metadata_once():
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tok.save_pretrained(str(folder))
        del tok
        # config.json and generation_config.json as a float32 model loaded from the GGUF saves them
        config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    with torch.device("meta"):
        dense = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    dense.config.architectures = [type(dense).__name__]
    dense.config.save_pretrained(str(folder))
    GenerationConfig.from_model_config(dense.config).save_pretrained(str(folder))
    del dense
    # the model as the converted checkpoint loads: in dtype, on the meta device (no memory)
    config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    src = _Source(table, model, on_progress)
    layout: dict = {"quant": {}, "aliases": {}, "embed": ""}
    embed = model.get_input_embeddings().weight
    embed_name = next(n for n, p in model.named_parameters() if p is embed)
    digests = runtime.write(folder, dtype, scheme, _items(model, src, scheme, layout), layout,
                            src.rows(embed_name, embed.shape, embed.dtype))
    for f in sorted(folder.iterdir()):  # config, generation config, tokenizer
        if f.is_file() and f.name not in digests:
            digests[f.name] = sha256_file(f)
    return digests


# Peak RSS measured on the Qwen2.5-Coder GGUFs (docs/conversion.md: 1.07 GB for the 0.5B, 1.45 GB for
# the 1.5B int4): ~1 GB of libraries, tokenizer and metadata, plus the output layer's quantized forms
# and a block's temporaries, ~1.5x its int8 size (the whole layer in the dtype under scheme none).
BASE_BYTES = 1_000_000_000
HEAD_FACTOR = 1.5


def needs(tensors: list[Tensor], dtype: torch.dtype, scheme: str) -> tuple[int, int]:
    """(memory, disk) in bytes the conversion of a GGUF with these tensors needs: memory for the
    libraries and the largest tensor's work (docs/conversion.md); disk for the weights file twice
    (the data is written to a scratch file, then behind the header) and the embedding."""
    size = torch.tensor([], dtype=dtype).element_size()
    elems = [t.elements for t in tensors]
    embed = next((t.elements for t in tensors if t.name == "token_embd.weight"), max(elems))
    per_weight = size if scheme == "none" else 1  # int8; int4's forms are smaller
    head = max(elems)
    residual = head if scheme != "none" else 0  # an untied output layer keeps an int8 residual
    disk = 2 * (sum(elems) * per_weight + residual) + embed * size
    return BASE_BYTES + int(HEAD_FACTOR * head * (size if scheme == "none" else 2)), disk


def available_memory() -> int:
    """Bytes of memory the kernel says can be allocated without swapping (MemAvailable)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_room(gguf: Path, folder: Path, dtype: torch.dtype, scheme: str, tensors: list[Tensor]) -> None:
    """One line (ResourceError) when this machine lacks the memory or disk to convert `gguf`."""
    mem, disk = needs(tensors, dtype, scheme)
    free_mem, free_disk = available_memory(), shutil.disk_usage(folder if folder.exists() else folder.parent).free
    gb = lambda n: f"{n / 1e9:.1f} GB"  # noqa: E731
    if free_disk < disk:
        raise ResourceError(f"not enough disk to convert {gguf.name}: it needs {gb(disk)} free in {folder.parent}, "
                            f"{gb(free_disk)} is (free some space, or set COMPLETIOND_CACHE to a larger disk)")
    if free_mem < mem:
        raise ResourceError(f"not enough memory to convert {gguf.name}: it needs {gb(mem)} available, "
                            f"{gb(free_mem)} is (close other programs, or use a smaller model)")


class ResourceError(Exception):
    """Too little memory or disk for a conversion: its message is one line for the user."""


def room_for(gguf: Path, folder: Path, dtype: torch.dtype, scheme: str) -> str | None:
    """check_room before a conversion is started (a daemon's background one): None where this machine
    has the memory and disk to convert `gguf` into `folder`, else the one line saying what is missing."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        tensors = read_gguf(gguf)[1]
    except (ValueError, OverflowError, KeyError, IndexError, struct.error) as e:  # a damaged file's table
        return f"cannot convert {gguf.name}: not a readable GGUF file ({type(e).__name__}: {e})"
    try:
        check_room(gguf, folder, dtype, scheme, tensors)
    except ResourceError as e:
        return str(e)
    return None


_idle = threading.local()


@contextlib.contextmanager
def low_priority():
    """Conversions this thread starts meanwhile run at the lowest CPU priority (nice 19 and
    SCHED_IDLE where the kernel has it): a daemon's background conversion takes only CPU time
    that its requests leave."""
    before = getattr(_idle, "on", False)
    _idle.on = True
    try:
        yield
    finally:
        _idle.on = before


_background: set = set()  # the child processes of conversions started under low_priority


def stop_background() -> None:
    """Kill the background conversions under way (a daemon stopping): each one's run_child then
    fails, and its partial folder is removed."""
    for proc in list(_background):
        try:
            proc.kill()
        except OSError:
            pass


def _lowest_priority() -> None:
    try:
        os.nice(19)
    except OSError:
        pass
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # threads started later inherit it
    except (AttributeError, OSError):
        pass


def run_child(gguf: Path, folder: Path, dtype: torch.dtype, scheme: str, progress: bool = False,
              on_progress: Callable[[float], None] | None = None) -> dict[str, str]:
    """`convert` in a child process (its memory goes back to the system when it exits); a progress
    bar on stderr (`progress`) and `on_progress(fraction)` from its progress lines. Returns its
    digests; ModelError with the child's one-line reason when it fails."""
    import subprocess
    import tempfile

    from tqdm import tqdm

    from .catalog import ModelError

    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # this checkout's completiond wins in the child too
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    cmd = [sys.executable, "-m", "completiond.models.convert", str(gguf), str(folder),
           runtime.dtype_name(dtype), scheme, str(os.getpid())]
    if getattr(_idle, "on", False):
        cmd.append("--idle")
    digests, error = None, None
    with tempfile.TemporaryFile("w+") as err, tqdm(total=100, disable=None if progress else True, file=sys.stderr,
                                                   desc=f"converting {gguf.name}", bar_format=BAR) as bar:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        background = getattr(_idle, "on", False)
        if background:
            _background.add(proc)
        try:
            for line in proc.stdout:
                kind, _, rest = line.strip().partition(" ")
                if kind == "progress":
                    done, total = (int(x) for x in rest.split())
                    fraction = done / total if total else 1.0
                    bar.update(round(100 * fraction) - bar.n)
                    if on_progress is not None:
                        on_progress(fraction)
                elif kind == "digests":
                    digests = json.loads(rest)
                elif kind == "error":
                    error = rest
            code = proc.wait()
        finally:
            _background.discard(proc)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if digests is None:
            if error is None:
                err.seek(0)
                lines = [ln for ln in err.read().splitlines() if ln.strip()]
                error = lines[-1].strip() if lines else f"the converting process exited with {code}"
                if code < 0:
                    error = f"the converting process was killed (signal {-code}; out of memory?)"
            raise ModelError(error if error.startswith("not enough") else f"cannot convert {gguf.name}: {error}")
    return digests


BAR = "{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]"


def _die_with_parent(parent: int) -> None:
    """Linux: this process is killed when the process that started it dies (a killed start leaves no
    orphan writing into its partial folder, which the next start removes)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the call
        os._exit(1)


def main(argv: list[str]) -> int:
    if "--idle" in argv:
        argv = [a for a in argv if a != "--idle"]
        _lowest_priority()
    gguf, folder, dtype, scheme = argv[:4]
    if len(argv) > 4:
        _die_with_parent(int(argv[4]))

    def progress(done: int, total: int) -> None:
        print(f"progress {done} {total}", flush=True)

    try:
        digests = convert(Path(gguf), Path(folder), getattr(torch, dtype), scheme, progress)
    except ResourceError as e:
        print(f"error {e}", flush=True)
        return 1
    except Exception as e:  # transformers' and gguf's loaders raise many types: one line for the user
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"error {first}", flush=True)
        raise
    print("digests " + json.dumps(digests), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
