"""The runtime form of a converted model: the tensors a loaded model holds, as files mapped at start.

`save` writes a model as it runs (after `quant.quantize`: int8 weights and their scales exactly as
quantization produced them, the output layer's residual or error norms, norms, biases, rotary
tables) into `weights.<dtype>-<scheme>.safetensors`, and its input embedding into
`embed_tokens.<dtype>.bin`. `open_model` builds the module skeleton on the meta device (no
allocation, no random init) and gives it tensors that are views of read-only private file
mappings: a start reads no float checkpoint and quantizes nothing, and only the pages a pass
touches become resident (clean pages the kernel can drop and share between processes).

The weights file is a valid safetensors file (any reader opens it) written by our own writer: the
tensors in module order with the sibling layers that the lean forward fuses (q/k/v, gate/up) back
to back, so `QuantLinear.cat` can view them as one matrix instead of copying; each group starts
on a 64-byte boundary (padding entries named `__pad__.N`). `__metadata__["layout"]` says which
modules are QuantLinear (scheme, sizes, extra tensors) and which names share a tensor (tied
weights).
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from . import pages
from .kernels.cpu_kernel import W4_GROUP

FORMAT = "completiond-runtime-1"
ALIGN = 64
EMBED = "@embed"  # the input embedding, kept in its own file
_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int8: "I8",
           torch.uint8: "U8", torch.int32: "I32", torch.int64: "I64", torch.bool: "BOOL", torch.float64: "F64"}
_FROM = {v: k for k, v in _DTYPES.items()}
# QuantLinear attributes saved, in file order (see _ordered); residual is a pair, saved as two
_QUANT_ATTRS = ("packed", "scales", "bias", "residual_q", "residual_s", "err_norm", "deq_norm", "full_weight")


class RuntimeFormError(Exception):
    """A runtime file that does not describe a complete model of this configuration (damaged or foreign)."""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# completiond's int4 form: its group size, vectors of 8 channels in interleaved pairs, a w4 output layer
W4_FORM = f"int4-w4g{W4_GROUP}x16-w4head"


def weights_file(dtype: torch.dtype, scheme: str) -> str:
    """int4 forms name their format: "-w4g64x16-w4head" (completiond's int4 kernel for the MLP and the
    output layer, quant.w4_native; groups of 64, vectors of 8 channels in interleaved pairs) or torch's."""
    if scheme == "int4":
        from .quant import w4_native

        scheme = W4_FORM if w4_native() else "int4"
    return f"weights.{dtype_name(dtype)}-{scheme}.safetensors"


# forms of an older layout that a new form replaces: deleted when it is written (1.3 GB for a 1.5B):
# w4 channels in vectors of 8 replaced one per row; a w4 output layer an int8 one; interleaved pairs
# of vectors replaced vectors one after the other; groups of 64 replaced groups of 32 (docs/decisions.md)
_SUPERSEDED = {W4_FORM: ("int4-w4", "int4-w4x8", "int4-w4x8-w4head", "int4-w4x16-w4head")}


def superseded_files(dtype: torch.dtype, scheme: str) -> list[str]:
    """Weight files of older layouts that the form weights_file(dtype, scheme) replaces."""
    name = weights_file(dtype, scheme)[len(f"weights.{dtype_name(dtype)}-"):-len(".safetensors")]
    return [f"weights.{dtype_name(dtype)}-{old}.safetensors" for old in _SUPERSEDED.get(name, ())]


def embed_file(dtype: torch.dtype) -> str:
    return f"embed_tokens.{dtype_name(dtype)}.bin"


def form_files(dtype: torch.dtype, scheme: str) -> list[str]:
    return [weights_file(dtype, scheme), embed_file(dtype)]


def _quant_tensor(q: nn.Module, attr: str) -> torch.Tensor | None:
    if attr.startswith("residual_"):
        return None if q.residual is None else q.residual[0 if attr == "residual_q" else 1]
    return getattr(q, attr)


def _ordered(model: nn.Module) -> tuple[list[tuple[str, torch.Tensor, str]], dict]:
    """(name, tensor, group) in file order, and the layout. Tensors shared by several names are
    stored once (the others are aliases); the input embedding is the alias target EMBED."""
    from .quant import QuantLinear

    embed = model.get_input_embeddings().weight
    key = lambda t: (t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()))  # noqa: E731
    seen = {key(embed): EMBED}
    out: list[tuple[str, torch.Tensor, str]] = []
    layout: dict = {"quant": {}, "aliases": {}, "embed": ""}

    def add(name: str, t: torch.Tensor, group: str) -> None:
        k = key(t)
        if k in seen:
            layout["aliases"][name] = seen[k]
        else:
            seen[k] = name
            out.append((name, t.detach(), group))

    for path, mod in model.named_modules():
        if isinstance(mod, QuantLinear):
            continue  # saved by its parent, next to its siblings
        pre = f"{path}." if path else ""
        for n, p in mod._parameters.items():
            if p is not None:
                if p is embed:
                    layout["embed"] = pre + n
                add(pre + n, p, pre + n)
        for n, b in mod._buffers.items():
            if b is not None:
                add(pre + n, b, pre + n)
        quants = [(n, c) for n, c in mod.named_children() if isinstance(c, QuantLinear)]
        for n, c in quants:
            layout["quant"][pre + n] = {
                "scheme": c.scheme, "group": c.group, "out": c.out_features, "in": c.in_features,
                "tensors": [a for a in _QUANT_ATTRS if _quant_tensor(c, a) is not None]}
        for attr in _QUANT_ATTRS:  # siblings' packed weights back to back, then their scales, ...
            for n, c in quants:
                t = _quant_tensor(c, attr)
                if t is not None:
                    add(f"{pre}{n}.{attr}", t, f"{pre}*.{attr}")
    if not layout["embed"]:
        raise RuntimeFormError("the input embedding is not a parameter of the model")
    return out, layout


def save(model: nn.Module, folder: Path, dtype: torch.dtype, scheme: str, progress: bool = True) -> dict[str, str]:
    """Write the runtime form of `model` (loaded in `dtype`, quantized with `scheme`) into folder;
    returns {file name: sha256} of what it wrote (hashed while writing)."""
    tensors, layout = _ordered(model)
    return write(folder, dtype, scheme, tensors, layout, [model.get_input_embeddings().weight.detach()], progress)


def write(folder: Path, dtype: torch.dtype, scheme: str, tensors: Iterable[tuple[str, torch.Tensor, str]],
          layout: dict, embed: Iterable[torch.Tensor], progress: bool = False) -> dict[str, str]:
    """Write a runtime form from (name, tensor, group) in file order (`_ordered`'s order; a generator
    may make them one at a time: each is written as it comes and can then be freed) and the input
    embedding's rows, in chunks of [rows, H]. `layout` must be complete once `tensors` is exhausted.
    The data goes to a scratch file first (the header before it needs every entry), then is copied
    behind the header; returns {file name: sha256}."""
    entries, at, pads, prev = {}, 0, 0, None
    path = folder / weights_file(dtype, scheme)
    scratch = path.with_name(path.name + ".data")
    try:
        with open(scratch, "wb") as data:
            for name, t, group in tensors:
                if group != prev and at % ALIGN:  # a new group starts aligned; siblings stay back to back
                    pad = ALIGN - at % ALIGN
                    entries[f"__pad__.{pads}"] = {"dtype": "U8", "shape": [pad], "data_offsets": [at, at + pad]}
                    data.write(bytes(pad))
                    pads, at = pads + 1, at + pad
                if t.dtype not in _DTYPES:
                    raise RuntimeFormError(f"cannot store {name} of dtype {t.dtype}")
                size = t.numel() * t.element_size()
                entries[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [at, at + size]}
                data.write(_bytes(t))
                at, prev = at + size, group
        entries["__metadata__"] = {"format": FORMAT, "layout": json.dumps(layout), "dtype": dtype_name(dtype),
                                   "scheme": scheme}
        header = json.dumps(entries, separators=(",", ":")).encode()
        header += b" " * (-(8 + len(header)) % ALIGN)  # tensors start 64-byte aligned in the file
        digests = {path.name: _copy_behind(path, struct.pack("<Q", len(header)) + header, scratch, at, progress)}
    finally:
        scratch.unlink(missing_ok=True)
    h = hashlib.sha256()
    with open(folder / embed_file(dtype), "wb") as f:
        for rows in embed:
            chunk = _bytes(rows)
            f.write(chunk)
            h.update(chunk)
    digests[embed_file(dtype)] = h.hexdigest()
    return digests


def _copy_behind(path: Path, head: bytes, scratch: Path, size: int, progress: bool) -> str:
    """Write `head` then scratch's `size` bytes into path, in 16 MB pieces; their sha256."""
    from tqdm import tqdm

    h = hashlib.sha256(head)
    with open(path, "wb") as f, open(scratch, "rb") as src, tqdm(
            total=size, unit="B", unit_scale=True, disable=not progress, file=sys.stderr,
            desc=f"writing {path.name}") as bar:
        f.write(head)
        while piece := src.read(16 << 20):
            f.write(piece)
            h.update(piece)
            bar.update(len(piece))
    return h.hexdigest()


def _bytes(t: torch.Tensor) -> memoryview:
    return memoryview(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())


def map_file(path: Path, huge_pages: bool = False) -> dict[str, torch.Tensor | dict]:
    """The tensors of a safetensors file as views of one private read-only mapping of it, and its
    metadata (under "__metadata__"). With `huge_pages`, mapped at a 2 MB boundary where this OS can
    then move it into huge pages (pages.map_file, pages.move_later: passes cost less)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > min(size - 8, 1 << 28):
            raise RuntimeFormError(f"{path.name}: header length {n} exceeds the file")
        header = json.loads(f.read(n))
    data = pages.map_file(path, size) if huge_pages else None
    if data is None:
        data = torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)
    base = 8 + n
    out: dict = {"__metadata__": header.pop("__metadata__", {})}
    for name, e in header.items():
        lo, hi = e["data_offsets"]
        dt = _FROM[e["dtype"]]
        if not 0 <= lo <= hi <= size - base:
            raise RuntimeFormError(f"{path.name}: {name} lies outside the file")
        out[name] = data[base + lo:base + hi].view(dt).view(e["shape"])
    return out


def open_model(folder: Path, config, dtype: torch.dtype, scheme: str, huge_pages: bool = False) -> nn.Module:
    """The model of `config` in `dtype` with `scheme` weights, every tensor mapped from folder's
    runtime files (written by `save`); `huge_pages`: the weights file mapped for pages.move_later
    (map_file). The embedding stays in 4 KB pages: a pass reads a few of its rows. RuntimeFormError if they do not fill the model. A
    `skeleton.Config` builds the transformers-free Qwen2Skeleton, any other config transformers' model."""
    from .quant import QuantLinear
    from .skeleton import Config, Qwen2Skeleton

    files = map_file(folder / weights_file(dtype, scheme), huge_pages)
    meta = files.pop("__metadata__")
    if meta.get("format") != FORMAT or meta.get("dtype") != dtype_name(dtype) or meta.get("scheme") != scheme:
        raise RuntimeFormError(f"{weights_file(dtype, scheme)} is not a {FORMAT} file of this form")
    layout = json.loads(meta["layout"])
    if isinstance(config, Config):  # Qwen2 for the lean forward: no transformers import (skeleton.py)
        model = Qwen2Skeleton(config, folder, dtype)
    else:
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    embed_shape = tuple(model.get_submodule(layout["embed"].rsplit(".", 1)[0]).weight.shape)
    n_embed = embed_shape[0] * embed_shape[1]
    embed_path = folder / embed_file(dtype)
    if embed_path.stat().st_size != n_embed * torch.tensor([], dtype=dtype).element_size():
        raise RuntimeFormError(f"{embed_path.name} does not hold a {embed_shape} embedding")
    made: dict[str, torch.Tensor] = {EMBED: nn.Parameter(
        torch.from_file(str(embed_path), shared=False, size=n_embed, dtype=dtype).view(embed_shape),
        requires_grad=False)}

    def tensor(name: str) -> torch.Tensor:
        name = layout["aliases"].get(name, name)
        if name not in made:
            if name not in files:
                raise RuntimeFormError(f"{weights_file(dtype, scheme)} lacks {name}")
            made[name] = files[name]
        return made[name]

    for path, q in layout["quant"].items():
        t = {a: tensor(f"{path}.{a}") for a in q["tensors"]}
        # checked: quantize wrote these weights (in range) and the file's digest was verified
        layer = QuantLinear(q["scheme"], t["packed"], t["scales"], q["out"], q["in"], t.get("bias"), q["group"],
                            checked=True)
        if "residual_q" in t:
            layer.residual = (t["residual_q"], t["residual_s"])
        layer.err_norm, layer.deq_norm = t.get("err_norm"), t.get("deq_norm")
        layer.full_weight = t.get("full_weight")
        parent, _, child = path.rpartition(".")
        setattr(model.get_submodule(parent), child, layer)
    for path, mod in model.named_modules(remove_duplicate=False):
        if isinstance(mod, QuantLinear):
            continue  # filled above
        pre = f"{path}." if path else ""
        for attr in [a for a, p in mod._parameters.items() if p is not None]:
            t = tensor(pre + attr)
            if not isinstance(t, nn.Parameter):  # one Parameter per stored tensor: tied weights stay tied
                t = made[layout["aliases"].get(pre + attr, pre + attr)] = nn.Parameter(t, requires_grad=False)
            mod._parameters[attr] = t
        for attr in [a for a, b in mod._buffers.items() if b is not None]:
            mod._buffers[attr] = tensor(pre + attr)
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise RuntimeFormError(f"{weights_file(dtype, scheme)} does not fill {', '.join(left[:3])}")
    return model.eval()
