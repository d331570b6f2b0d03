"""Weight-only quantization with torch's own CPU kernels, and an output layer that stays exact.

Schemes (weights only; activations keep the model's dtype, embeddings stay as they are):
- int8: per-output-channel symmetric, w ~ q * s with q in [-127, 127], s = max|w_row| / 127;
  run by completiond's own kernel (`cpu_kernel.int8_mm`: batch-invariant, AVX2 / AVX512-VNNI)
  where it builds, else by `aten._weight_int8pack_mm(x [M, K], q [N, K] int8, s [N])` (s in x's dtype).
- w4 (what `quantize(..., "int4")` gives the MLP layers where completiond's kernel runs it,
  cpu_kernel.w4_kind): asymmetric int4 with a bf16 scale and zero per group of 64 along K (`pack_w4`),
  run by `cpu_kernel.w4_mm` with int8 activations, and by the native Qwen2 layer: 0.625 bytes a
  weight (with its scales) against int8's 1, for a one-token pass that is bound by reading them.
  Under int4 the output layer is w4 too (`quantize`); attention stays int8.
- int4 elsewhere: the MLP layers only (attention and the output layer stay int8, see INT4_KEEP_INT8 and
  `quantize`), group-wise asymmetric, groups of INT4_GROUP = 32 along K, w ~ (q - 8) * scale + zero with
  q in [0, 15] (the tinygemm convention the kernel uses); packed by
  `aten._convert_weight_to_int4pack_for_cpu(q [N, K] int32, inner_k_tiles)` into uint8 [N, K / 2]
  and run by `aten._weight_int4pack_mm_for_cpu(x [M, K], packed, group, scale_zero [K / group, N, 2])`.

What the kernels need in torch 2.13 (found by experiment, tests/test_quant.py holds the ones we rely
on): x 2-D and contiguous; scales in x's dtype; int4: N divisible by 16 (we pad rows), K divisible
by the group, group in {32, 64, 128, 256}; inner_k_tiles is ignored on CPU; the packing interleaves
blocks of 64 rows, so packed matrices concatenate along N only where every part but the last has
a multiple of 64 rows. bf16 activations are fast; fp32 activations work but run a slow path (about
4x slower than a dense fp32 matmul at one row, ~10-100x at 16-64 rows on this CPU), so quantized
models should run in bf16.

The output layer of a tied model keeps a reference to its full-precision weight (`full_weight`: the
embedding, so free): the runner's float32 refinement rescores its top rows with it. An untied one
(the Qwen2.5-Coder GGUFs) keeps, instead of a bf16 copy (260 MB of the 0.5B daemon's ~1.5 GB), its
int8 quantization error quantized to int8 again (`residual`, 130 MB): q * s + r * s2 is within
~2^-16 of a row's largest weight of the full one, finer than bf16's own rounding, so the refined
rows (`head_rows`) are the full-precision ones in all but the last bits. A w4 head (int4 targets)
keeps its w4 error in int8 the same way: within ~2^-12 of a row's largest weight, still under
bf16's 2^-9.
`quantize(..., full_head=True)` keeps the copy for `exact_head_logits`, which gives the full head's
argmax while reading the low-bit head.
"""

from __future__ import annotations

import contextlib
import functools
import threading

import torch
import torch.nn.functional as F
from torch import nn

from .catalog import ModelError
from .kernels import cpu_kernel

SCHEMES = ("int8", "int4", "w4")  # what a QuantLinear holds; quantize() takes int8 or int4
INT4_GROUP = 32
# Layers kept int8 under the int4 scheme: attention is ~12 % of a Qwen2 layer's weights but int4
# there costs the most agreement with the unquantized model (docs/kernels.md "Weights").
INT4_KEEP_INT8: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
_ROWS = 4096  # rows quantized at a time (bounds the float32 temporaries; a multiple of 64)
BULK_ROWS = 32  # int8 passes with more rows than this inside `bulk()` run on dequantized weights
DEQ_BLOCK = 1024  # weight rows dequantized at a time there (1024 x 896 bf16: under 2 MB, stays in cache)
_bulk = threading.local()


@contextlib.contextmanager
def bulk(dtype: torch.dtype | None = None):
    """Prefill: layers with many rows (> BULK_ROWS) run a dense matmul in `dtype` (default: the
    activations' dtype) on weights converted a block at a time.

    The int8 kernel's cost grows with the rows (it wins for a few decode rows and loses from ~16);
    a 512-token prefill chunk is far cheaper dense. `dtype` float32 with bf16 activations is for
    CPUs whose bf16 matmuls are slow over many rows (device.pick_bulk_dtype); the result is cast
    back. Only prefill uses it: every mode prefills the same way, while verify and one-token passes
    keep the kernel, so modes stay identical.
    """
    _bulk.on, _bulk.dtype = True, dtype
    try:
        yield
    finally:
        _bulk.on, _bulk.dtype = False, None


def is_bulk(rows: int) -> bool:
    """Whether a pass of this many rows runs dense (inside `bulk()`, more than BULK_ROWS rows)."""
    return getattr(_bulk, "on", False) and rows > BULK_ROWS


def bulk_dtype(x: torch.Tensor) -> torch.dtype | None:
    """Inside `bulk()` with more than BULK_ROWS rows: the dtype to multiply in; else None."""
    if not is_bulk(x.numel() // x.shape[-1]):
        return None
    return _bulk.dtype or x.dtype


class QuantLinear(nn.Module):
    """A linear layer y = x W^T (+ b) with int8 or int4 weights; `forward` accepts [..., K]."""

    def __init__(self, scheme: str, packed: torch.Tensor, scales: torch.Tensor, out_features: int,
                 in_features: int, bias: torch.Tensor | None = None, group: int = 0, checked: bool = False):
        """checked: the weights are known to lie in [-127, 127] (fused from checked layers, or mapped
        from a runtime file quantize wrote): the check reads every weight, ~0.3 s of a 0.5B's start."""
        super().__init__()
        self.scheme, self.group = scheme, group
        self.out_features, self.in_features = out_features, in_features
        if scheme == "int8" and not checked and packed.numel() and int(packed.min()) < -127:
            # the int8-activation kernels' sign trick negates weights: -128 has no int8 negation
            raise ValueError("int8 weights must lie in [-127, 127] (quantize with quant._int8)")
        groups = (in_features + W4_PAD - 1) // W4_PAD * W4_PAD // W4_GROUP
        rows = w4_rows(out_features)
        if scheme == "w4" and (packed.shape != (rows, groups * W4_GROUP // 2) or packed.dtype != torch.uint8
                               or scales.shape != (rows, 2, groups) or scales.dtype != torch.bfloat16):
            # the C kernel reads by these shapes: a file of another layout must not reach it
            raise ValueError(f"w4 weights {tuple(packed.shape)} {packed.dtype} / scales {tuple(scales.shape)} "
                             f"{scales.dtype} are not pack_w4's for [{out_features}, {in_features}]")
        # int8 [N, K] / int4: uint8 [N_pad, K / 2] / w4: uint8 [N8, kp / 2]
        self.register_buffer("packed", packed, persistent=False)
        self.register_buffer("scales", scales, persistent=False)  # [N] / [K / group, N_pad, 2] / bf16 [N8, 2, kp / 64]
        self.bias = bias
        self.full_weight: torch.Tensor | None = None  # the output layer's full-precision weight
        self.residual: tuple[torch.Tensor, torch.Tensor] | None = None  # untied output layer: int8 [N, K], scales [N]
        self.err_norm: torch.Tensor | None = None  # [N] float32: ||w_i - w^_i||_2 (output layer)
        self.deq_norm: torch.Tensor | None = None  # [N] float32: ||w^_i||_2 (output layer)
        self._scales_as: dict[torch.dtype, torch.Tensor] = {}
        self.exact_calls = self.exact_fallbacks = 0  # exact_head_logits, and how often it fell back

    @classmethod
    def from_linear(cls, linear: nn.Module, scheme: str, group: int = INT4_GROUP,
                    norms: bool = False) -> QuantLinear:
        """Quantize an nn.Linear (or anything with .weight [N, K] and .bias); norms=True also
        records the per-row error norms the exact output layer needs."""
        if scheme not in SCHEMES:
            raise ValueError(f"unknown quantization scheme {scheme!r} (expected one of {', '.join(SCHEMES)})")
        w = linear.weight.detach()
        n, k = w.shape
        if scheme == "int4" and (group not in (32, 64, 128, 256) or k % group):
            raise ValueError(f"int4 needs a group of 32/64/128/256 dividing the input size {k}, got {group}")
        packs, scales, err, dn = [], [], [], []
        if scheme == "int4" and _ROWS % int4_row_block():
            raise RuntimeError("int4 chunks must be whole packing blocks")
        for s in range(0, n, _ROWS):
            rows = w[s:s + _ROWS]
            if scheme == "w4":
                q, sc = pack_w4(rows)
                deq = unpack_w4(q, sc, k, len(rows)) if norms else None
            else:
                q, sc, deq = _int8(rows, norms) if scheme == "int8" else _int4(rows, group, norms)
            if scheme == "int4":
                if len(rows) % 16:  # the packer wants N % 16 == 0: zero rows (scale 0, zero 0), sliced off
                    pad = 16 - len(rows) % 16
                    q = torch.cat([q, q.new_full((pad, k), 8)])
                    sc = torch.cat([sc, sc.new_zeros(sc.shape[0], pad, 2)], 1)
                q = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
            packs.append(q)
            scales.append(sc)
            if norms:
                err.append((rows.float() - deq).norm(dim=1))
                dn.append(deq.norm(dim=1))
        bias = None if getattr(linear, "bias", None) is None else linear.bias.detach()
        out = cls(scheme, torch.cat(packs), torch.cat(scales, 1 if scheme == "int4" else 0), n, k, bias, group)
        if norms:
            out.err_norm, out.deq_norm = torch.cat(err), torch.cat(dn)
        return out

    def _scales(self, dtype: torch.dtype) -> torch.Tensor:
        """The scales in the activations' dtype (the kernels require it), converted once."""
        if self.scales.dtype == dtype:
            return self.scales
        if dtype not in self._scales_as:
            self._scales_as[dtype] = self.scales.to(dtype)
        return self._scales_as[dtype]

    def forward(self, x: torch.Tensor, activations: str | None = None) -> torch.Tensor:
        """activations: on completiond's int8 kernel, "float32", or round them to "int16" or "int8"
        first (None: this process's choice, cpu_kernel.activations)."""
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).contiguous()  # the kernels take 2-D inputs only
        dense = bulk_dtype(x2) if self.scheme == "int8" else None
        if dense is not None:
            y = dequantized_mm(x2, self.packed, self._scales(dense), dense)
        elif self.scheme == "int8" and x2.device.type == "cpu" and cpu_kernel.enabled():
            kind = cpu_kernel.kind() if activations is None else cpu_kernel.kind_of(activations)
            y = cpu_kernel.int8_mm(x2, self.packed, self._scales(torch.float32), kind=kind)
        elif self.scheme == "int8":
            y = torch.ops.aten._weight_int8pack_mm(x2, self.packed, self._scales(x.dtype))
        elif self.scheme == "w4" and x2.device.type == "cpu" and cpu_kernel.w4_kind() is not None:
            # prefill chunks too: on VNNI its int8 products beat unpacking the nibbles for a dense matmul
            y = cpu_kernel.w4_mm(x2, self.packed, self.scales, n=self.out_features)
        elif self.scheme == "w4":  # a CPU without the kernel: dense, a block of rows at a time
            dt = bulk_dtype(x2) or x2.dtype
            y = torch.cat([F.linear(x2.to(dt), unpack_w4(self.packed[i:i + DEQ_BLOCK], self.scales[i:i + DEQ_BLOCK],
                                                          self.in_features).to(dt))
                           for i in range(0, len(self.packed), DEQ_BLOCK)], 1)[:, :self.out_features].to(x.dtype)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.packed, self.group, self._scales(x.dtype))
            if y.shape[1] != self.out_features:
                y = y[:, :self.out_features]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)

    def dequantize(self) -> torch.Tensor:
        """The weight the kernels use, float32 [N, K]: the reference for tests (slow for int4 on
        big layers: it runs the kernel on an identity matrix, since the packed layout is private)."""
        if self.scheme == "int8":
            return self.packed.float() * self.scales.float()[:, None]
        if self.scheme == "w4":
            return unpack_w4(self.packed, self.scales, self.in_features, self.out_features)
        eye = torch.eye(self.in_features, dtype=torch.float32)
        wt = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed, self.group, self._scales(torch.float32))
        return wt[:, :self.out_features].T.contiguous()

    @staticmethod
    def cat(parts: list[QuantLinear]) -> nn.Module:
        """One layer for [x W1^T, x W2^T, ...] (fused q/k/v or gate/up): the packed weights
        concatenated where the kernels' layout allows it, else the parts run one after another."""
        scheme, group = parts[0].scheme, parts[0].group
        if any(p.in_features != parts[0].in_features for p in parts):
            raise ValueError("cannot fuse layers with different input sizes")
        if any(p.scheme != scheme or p.group != group for p in parts) or (
                scheme == "int4" and any(p.out_features % int4_row_block() for p in parts[:-1])) or (
                scheme == "w4" and any(p.out_features % W4_PAIR for p in parts[:-1])):
            return _Parts(parts)  # mixed schemes, or an int4 / w4 part whose row tail would land mid-block
        bias = None
        if any(p.bias is not None for p in parts):
            bias = torch.cat([p.bias if p.bias is not None else p.scales.new_zeros(p.out_features) for p in parts])
        # parts that already lie back to back (a runtime cache stores siblings so) are viewed, not copied
        packed = _joined([p.packed for p in parts])
        scales = _joined([p.scales for p in parts]) if scheme != "int4" else None
        out = QuantLinear(scheme, torch.cat([p.packed for p in parts]) if packed is None else packed,
                          scales if scales is not None else
                          torch.cat([p.scales for p in parts], 1 if scheme == "int4" else 0),
                          sum(p.out_features for p in parts), parts[0].in_features, bias, group, checked=True)
        # the parts (what transformers' forward runs) keep views of the fused weights, not a second copy
        at = 0
        for p in parts:
            rows = len(p.packed)
            p.packed = out.packed[at:at + rows]
            if scheme != "int4":
                p.scales = out.scales[at:at + rows]
            at += rows
        return out


def _joined(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """The parts concatenated along dim 0 as a view, when they are contiguous and lie back to back
    in one storage (models/runtime.py writes fused siblings so: a mapped file is not copied);
    else None."""
    first = parts[0]
    storage = first.untyped_storage().data_ptr()
    for a, b in zip(parts, parts[1:] + [None]):
        if (not a.is_contiguous() or a.dtype != first.dtype or a.shape[1:] != first.shape[1:]
                or a.untyped_storage().data_ptr() != storage):
            return None
        if b is not None and a.data_ptr() + a.numel() * a.element_size() != b.data_ptr():
            return None
    rows = sum(p.shape[0] for p in parts)
    return first.new_empty(0).set_(first.untyped_storage(), first.storage_offset(), (rows, *first.shape[1:]),
                                   first.stride())


def dequantized_mm(x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """x [M, K] @ (w [N, K] * scales [N])^T for many rows M, multiplied in `dtype`, returned in x's.

    w (int8, or a dense layer's weight in another dtype) is converted DEQ_BLOCK rows at a time, so
    each converted block is still in cache when the matmul reads it (w is read from memory once;
    converting the whole matrix first wrote and read it again at 2x the size: ~300 ms of a 0.5B
    prefill chunk on 2 cores); the scales apply to the output columns."""
    xd = x.to(dtype).contiguous()
    parts = [F.linear(xd, w[i:i + DEQ_BLOCK].to(dtype)) for i in range(0, w.shape[0], DEQ_BLOCK)]
    y = parts[0] if len(parts) == 1 else torch.cat(parts, 1)
    return (y if scales is None else y * scales).to(x.dtype)


class _Parts(nn.Module):
    def __init__(self, parts: list[nn.Module]):
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], -1)


def _int8(w: torch.Tensor, deq: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """w [n, K] -> q int8 [n, K], scales [n] (w's dtype), dequantized float32 [n, K] (if deq)."""
    wf = w.float()
    s = (wf.abs().amax(1) / 127).clamp(min=1e-12).to(w.dtype)  # the stored scale is what the kernel uses
    sf = s.float()[:, None]
    q = torch.round(wf / sf).clamp(-127, 127).to(torch.int8)
    return q, s, q.float() * sf if deq else None


def _int4(w: torch.Tensor, group: int, deq: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """w [n, K] -> q int32 [n, K] in [0, 15], scale_zero [K / group, n, 2] (w's dtype), dequantized
    float32 [n, K] (if deq)."""
    n, k = w.shape
    wg = w.float().view(n, k // group, group)
    lo, hi = wg.amin(-1), wg.amax(-1)
    scale = ((hi - lo) / 15).clamp(min=1e-12).to(w.dtype).float()  # [n, G]
    zero = (lo + 8 * scale).to(w.dtype).float()  # the value of q = 8
    q = torch.round((wg - zero[..., None]) / scale[..., None] + 8).clamp(0, 15)
    sz = torch.stack([scale, zero], -1).transpose(0, 1).contiguous().to(w.dtype)
    dq = ((q - 8) * scale[..., None] + zero[..., None]).view(n, k) if deq else None
    return q.to(torch.int32).view(n, k), sz, dq


W4_GROUP = cpu_kernel.W4_GROUP  # weights per int4 scale and zero along K
W4_PAD = 128  # K is padded to the int8 activations' block
W4_LANES = 8  # channels per vector (one per int32 lane of w4_mm.c): N is padded to a multiple
W4_PAIR = 2 * W4_LANES  # two vectors whose 32-byte pieces alternate (w4_mm.c's 512-bit tiles: one stream)


def w4_native() -> bool:
    """Whether int4 layers become "w4" (completiond's int4 kernel, the native layer) here rather than
    torch's int4 kernel: x86 with completiond's kernel enabled."""
    return cpu_kernel.enabled() and cpu_kernel.w4_kind() is not None


def w4_rows(n: int) -> int:
    """Rows of pack_w4's tensors for n channels: whole vectors of W4_LANES."""
    return (n + W4_LANES - 1) // W4_LANES * W4_LANES


def pack_w4(w: torch.Tensor, rows: int = _ROWS) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (packed uint8 [N8, kp / 2], scales bfloat16 [N8, 2, kp / 64]) for cpu_kernel.w4_mm:
    w ~ q * scale + zero per group of W4_GROUP (64) along K, q in [0, 15] (asymmetric min / max, as the torch
    int4 scheme's groups; scale and zero rounded to bf16 first, q from the rounded pair); K
    zero-padded to kp (a multiple of 128), N to N8 (a multiple of 8). In w4_mm.c's order: vectors of
    8 channels, each a nibble stream (per 32-byte piece p, lane l's 4 bytes: channel 8 v + l's
    weights 8 p .. 8 p + 3 low, 8 p + 4 .. 8 p + 7 high) with [2, G, 8] scales and zeros; two vectors
    2 u and 2 u + 1 (rows 16 u .. 16 u + 15) as one stream, their pieces and their 8 scales (zeros)
    of a group alternating (`_pairs`); a last odd vector alone."""
    n, k = w.shape
    kp = (k + W4_PAD - 1) // W4_PAD * W4_PAD
    g, n8 = kp // W4_GROUP, w4_rows(n)
    packed = torch.empty(n8, kp // 2, dtype=torch.uint8)
    scales = torch.empty(n8, 2, g, dtype=torch.bfloat16)
    for s in range(0, n8, rows):  # rows: a multiple of 8
        wb = F.pad(w[s:s + rows].float(), (0, kp - k, 0, min(rows, n8 - s) - len(w[s:s + rows])))
        wb = wb.view(-1, g, W4_GROUP)
        lo, hi = wb.amin(-1), wb.amax(-1)
        scale = ((hi - lo) / 15).clamp(min=1e-12).to(torch.bfloat16)
        zero = lo.to(torch.bfloat16)
        q = torch.round((wb - zero.float()[..., None]) / scale.float()[..., None]).clamp(0, 15)
        v = len(wb) // W4_LANES  # [v, lane, piece, half, 4] -> [v, piece, lane, 4, half]
        nib = q.to(torch.uint8).view(v, W4_LANES, kp // 8, 2, 4).permute(0, 2, 1, 4, 3)
        packed[s:s + rows] = (nib[..., 0] | (nib[..., 1] << 4)).reshape(len(wb), -1)
        sz = torch.stack([scale, zero], 1).view(v, W4_LANES, 2, g).permute(0, 2, 3, 1)  # [v, 2, G, lane]
        scales[s:s + rows] = sz.reshape(len(wb), 2, g)
    return _pairs(packed, 32), _pairs(scales, W4_LANES)


def _pairs(t: torch.Tensor, width: int, undo: bool = False) -> torch.Tensor:
    """Rows of pack_w4's tensors from vectors of 8 channels one after another to pairs of vectors
    whose pieces alternate (undo: back). A piece is `width` elements: 32 bytes of nibbles, or a
    group's 8 scales (zeros); a pair holds piece p of its first vector, then of its second, then
    piece p + 1 ... A last odd vector stays as it is."""
    u = len(t) // W4_PAIR
    if u == 0:
        return t
    pairs = t[:u * W4_PAIR].reshape((u, 2, -1, width) if not undo else (u, -1, 2, width))
    return torch.cat([pairs.transpose(1, 2).reshape(u * W4_PAIR, *t.shape[1:]), t[u * W4_PAIR:]])


def w4_scale_zero(scales: torch.Tensor) -> torch.Tensor:
    """pack_w4's scales in channel order: float32 [N8, 2, G] (scales, zeros)."""
    return _scale_zero(_pairs(scales, W4_LANES, undo=True))


def _scale_zero(scales: torch.Tensor) -> torch.Tensor:
    """w4_scale_zero of vectors one after another (no pairs)."""
    n8, _, g = scales.shape
    return scales.reshape(n8 // W4_LANES, 2, g, W4_LANES).permute(0, 3, 1, 2).reshape(n8, 2, g).float()


def unpack_w4(packed: torch.Tensor, scales: torch.Tensor, k: int, n: int | None = None) -> torch.Tensor:
    """pack_w4's weights as float32 [n, k] (the values the kernel multiplies by; n: all rows)."""
    return _unpack(_pairs(packed, 32, undo=True), _pairs(scales, W4_LANES, undo=True), k, n)


def _unpack(packed: torch.Tensor, scales: torch.Tensor, k: int, n: int | None = None) -> torch.Tensor:
    """unpack_w4 of vectors one after another (no pairs)."""
    n8, _, g = scales.shape
    v, kp = n8 // W4_LANES, g * W4_GROUP
    p = packed.reshape(v, kp // 8, W4_LANES, 4, 1)
    q = torch.cat([p & 15, p >> 4], 4).permute(0, 2, 1, 4, 3).reshape(n8, g, W4_GROUP).float()
    sc = _scale_zero(scales)
    return (q * sc[:, 0, :, None] + sc[:, 1, :, None]).view(n8, -1)[:n, :k]


def quantize(model: nn.Module, scheme: str, group: int = INT4_GROUP, full_head: bool = False) -> None:
    """Replace every nn.Linear of the decoder and the output layer by a QuantLinear, in place.

    Embeddings stay as they are. The output layer is int8, except under int4 where completiond's
    int4 kernel runs it ("w4"): the refinement rescores its top rows with the full rows
    (an int8 residual of the w4 error), so only the choice of those rows is int4's. With
    `full_head` it stays int8: the int4 head's error bound is too wide for `exact_head_logits`
    (over a quarter of the vocabulary could win on every pass, README). It keeps `full_weight`
    when that is the embedding (tied) or when `full_head` (see the module docstring).
    """
    if scheme not in ("int8", "int4"):
        raise ValueError(f"unknown quantization scheme {scheme!r} (expected int8 or int4)")
    base = getattr(model, model.base_model_prefix)
    for module in list(base.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, quantize_linear(name, child, scheme, group))
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear):
        raise ValueError(f"cannot quantize an output layer of type {type(head).__name__}")
    embed = model.get_input_embeddings().weight
    tied = embed is head.weight or (embed.shape == head.weight.shape and torch.equal(embed, head.weight))
    model.set_output_embeddings(quantize_head(head, embed if tied else None, scheme, full_head))


def quantize_linear(name: str, linear: nn.Module, scheme: str, group: int = INT4_GROUP) -> QuantLinear:
    """A decoder layer named `name` (its attribute name: q_proj, down_proj...) as `quantize` makes it:
    int8, or under int4 w4 / torch's int4 (attention stays int8, INT4_KEEP_INT8)."""
    low = "w4" if scheme == "int4" and w4_native() else scheme
    keep = scheme == "int4" and name in INT4_KEEP_INT8
    return QuantLinear.from_linear(linear, "int8" if keep else low, group)


def quantize_head(head: nn.Module, embed: torch.Tensor | None, scheme: str, full_head: bool = False) -> QuantLinear:
    """The output layer (anything with .weight [V, H] and .bias) as `quantize` makes it; `embed`: the
    input embedding when the head is tied to it (its weight, kept as full_weight), else None."""
    low = "w4" if scheme == "int4" and w4_native() else scheme
    # the int4 target's head in w4 where completiond's kernel runs it (a one-token pass reads 37 % fewer
    # head bytes), except where exact_head_logits needs int8's tight bound
    qhead = QuantLinear.from_linear(head, "w4" if low == "w4" and not full_head else "int8",
                                    norms=embed is not None or full_head)
    if embed is not None:
        qhead.full_weight = embed.detach()  # tied weights loaded as two copies: keep one (272 MB, the 0.5B)
    elif full_head:
        qhead.full_weight = head.weight.detach()
    else:
        qhead.residual = head_residual(qhead, head.weight.detach())
    return qhead


def head_residual(head: QuantLinear, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The quantized output layer's error against its full weight [V, H], in int8 per row (int8
    [V, H], float32 scales [V]): the refinement's rows to ~2^-16 (int8 head) / ~2^-12 (w4 head)."""
    parts = []
    for s in range(0, head.out_features, _ROWS):
        w = weight[s:s + _ROWS].float()
        parts.append(_int8(w - head_rows(head, torch.arange(s, s + len(w)), low_bits=True), False)[:2])
    return torch.cat([q for q, _ in parts]), torch.cat([sc.float() for _, sc in parts])


def scheme_of(model: nn.Module) -> str:
    """'int8' / 'int4' (some layer int4 or w4) for a quantized model, else 'none'."""
    schemes = {m.scheme for m in model.modules() if isinstance(m, QuantLinear)}
    return "int4" if schemes & {"int4", "w4"} else "int8" if schemes else "none"


def full_weight(head: nn.Module) -> torch.Tensor:
    """The output layer's full-precision weight [V, H]: for an untied quantized one, rebuilt from its
    int8 weight and residual (a new tensor in the scales' dtype: for training heads, not every pass)."""
    if not isinstance(head, QuantLinear):
        return head.weight
    if head.full_weight is not None:
        return head.full_weight
    return head_rows(head, torch.arange(head.out_features)).to(head.scales.dtype)


def head_rows(head: nn.Module, rows: torch.Tensor, low_bits: bool = False) -> torch.Tensor:
    """float32 rows [..., H] of the output layer's full-precision weight at these indices (low_bits:
    of the quantized weight the kernel multiplies by, without the residual)."""
    if isinstance(head, QuantLinear) and (low_bits or head.full_weight is None):
        if head.scheme == "w4":  # the vectors of W4_LANES channels holding them, unpacked once each
            flat = rows.reshape(-1)
            vecs, which = torch.unique(flat // W4_LANES, return_inverse=True)
            # their pairs (a last lone vector) put back in vector order: bytes, not the float unpacking
            pairs, at = torch.unique(vecs // 2, return_inverse=True)
            held = (pairs[:, None] * W4_PAIR + torch.arange(W4_PAIR)).reshape(-1)
            held = held[held < len(head.packed)]
            packed, scales = _pairs(head.packed[held], 32, undo=True), _pairs(head.scales[held], W4_LANES, undo=True)
            mine = ((at * 2 + vecs % 2)[:, None] * W4_LANES + torch.arange(W4_LANES)).reshape(-1)
            low = _unpack(packed[mine], scales[mine], head.in_features)
            low = low[which * W4_LANES + flat % W4_LANES].view(*rows.shape, -1)
        elif head.scheme == "int8":
            low = head.packed[rows].float() * head.scales[rows].float()[..., None]
        else:
            raise ValueError(f"a {head.scheme} output layer has no row access (quantize gives int8 or w4)")
        if low_bits:
            return low
        if head.residual is None:
            raise ValueError("this quantized output layer kept neither its full-precision weight nor a residual")
        rq, rs = head.residual
        return low + rq[rows].float() * rs[rows][..., None]
    return full_weight(head)[rows].float()


# Rounding slack of the low-bit head as run, relative (see head_bound): bf16 outputs are rounded
# to 8 significant bits (relative error <= 2^-8), and the kernels may round the dequantized weight
# or partial sums to bf16 (<= 2^-8 of sum |h_k| |w^_ik| <= 2^-8 ||h|| ||w^_i||).
_SLACK = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -9, torch.float32: 2.0 ** -18}


def head_bound(head: QuantLinear, hidden: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """Bound [n, V] on |full-precision logit - low-bit logit as computed| for each row.

    |h.w_i - h.w^_i| <= ||h|| ||w_i - w^_i|| (Cauchy-Schwarz), plus the kernel's rounding: a
    relative slack of the logit itself and of ||h|| ||w^_i||. hidden [n, H], low [n, V] float32.
    """
    if head.err_norm is None:
        raise ValueError("this quantized layer has no error norms (quantize the output layer with norms=True)")
    slack = _SLACK.get(hidden.dtype, 2.0 ** -7)
    h = hidden.float().norm(dim=-1, keepdim=True)  # [n, 1]
    return h * (head.err_norm * 1.001 + slack * head.deq_norm) + slack * low.abs() + 1e-6


def _rounding_bound(head: QuantLinear, hidden: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """Bound on |float32 logit - logit of the full-precision head run in hidden's dtype|: rounding only
    (||w_i|| <= ||w^_i|| + ||w_i - w^_i||)."""
    slack = _SLACK.get(hidden.dtype, 2.0 ** -7)
    h = hidden.float().norm(dim=-1, keepdim=True)
    return slack * (h * (head.deq_norm + head.err_norm) + low.abs()) + 1e-6


def _can_win(low: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    """Rows [c] whose upper bound reaches the best lower bound of some token (the union over tokens)."""
    best = (low - bound).amax(-1, keepdim=True)  # [n, 1]: a lower bound on each token's max logit
    return ((low + bound) >= best).any(0).nonzero().squeeze(1)


def exact_head_logits(head: QuantLinear, hidden: torch.Tensor, max_share: float = 0.25) -> torch.Tensor:
    """float32 logits [n, V] whose argmax is exactly the full-precision head's (greedy only).

    The low-bit head gives every row a logit within `head_bound` of the exact one; rows whose upper
    bound reaches the best lower bound of their token can win, and every such row (over the union of
    the n tokens) is recomputed in float32 with the full-precision weight. Other rows are -inf.
    When more than max_share of the vocabulary could win (a flat distribution, or int4's wide bound),
    the full-precision head runs in the model's dtype instead and only its rounding is bounded.
    Sampling needs the whole distribution: use the full head (`full_weight`) for it instead.
    "Exact" means float32 dot products with the full weight, as the runner's refinement computes them.
    """
    n = hidden.shape[0]
    if head.full_weight is None:
        raise ValueError("exact_head_logits needs the full-precision output layer: quantize(..., full_head=True)")
    w = head.full_weight
    low = head(hidden, activations="float32").float()  # [n, V]; head_bound covers the weights' error only
    cols = _can_win(low, head_bound(head, hidden, low))
    head.exact_calls += 1
    if len(cols) > max_share * head.out_features:
        head.exact_fallbacks += 1
        low = F.linear(hidden.to(w.dtype), w).float()
        if head.bias is not None:
            low = low + head.bias.float()
        cols = _can_win(low, _rounding_bound(head, hidden, low))
    exact = hidden.float() @ w[cols].float().T  # [n, c]
    if head.bias is not None:
        exact = exact + head.bias[cols].float()
    out = torch.full((n, head.out_features), float("-inf"), device=hidden.device)
    out[:, cols] = exact
    return out


@functools.cache
def int4_row_block() -> int:
    """Rows the int4 packer interleaves as one block (torch 2.13: 64 on AVX512 CPUs, 32 on AVX2 ones)."""
    f = torch.ops.aten._convert_weight_to_int4pack_for_cpu
    g = torch.Generator().manual_seed(0)
    for b in (16, 32, 64, 128, 256):
        a, c = (torch.randint(0, 16, (b, 64), dtype=torch.int32, generator=g) for _ in range(2))
        if torch.equal(f(torch.cat([a, c]), 1), torch.cat([f(a, 1), f(c, 1)])):
            return b
    raise RuntimeError("int4 packing does not split into row blocks of <= 256")


QUANTS = ("auto", "none", "int8", "int4")


def pick_quant(quant: str, device: torch.device, dtype: torch.dtype, dtype_asked: bool = False) -> str:
    """Weight-only quantization: auto = int8 on CPU with bf16 activations (a decode pass reads half
    the bf16 bytes), and with float32 ones that --dtype auto chose where completiond's own int8
    kernel runs (torch's wants bf16 activations: its float32 path is slower than a dense float32
    matmul); none with an explicit --dtype float32 (a user asking for full precision) and on CUDA. int4
    (MLP layers group-32 int4 requantized from the GGUF's dequantized weights, attention and output
    layer int8) is faster still but measurably worse on the Q4_K_M models: selectable, not the
    default (docs/kernels.md "Weights")."""
    if quant not in QUANTS:
        raise ModelError(f"unknown quantization {quant!r}: use {', '.join(QUANTS)}")
    if quant == "auto":
        if device.type != "cpu":
            return "none"
        if dtype == torch.bfloat16:
            return "int8"
        return "int8" if dtype == torch.float32 and not dtype_asked and cpu_kernel.enabled() else "none"
    if quant != "none" and device.type != "cpu":
        raise ModelError(f"--quant {quant} runs on CPU kernels only; use --quant none on {device.type}")
    return quant
