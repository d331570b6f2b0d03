"""What a target's one-token pass costs on this CPU, measured in seconds without its weights.

A decode pass on a CPU is bound by reading the weights: per layer the q/k/v and o matmuls and the
MLP's gate + up and down, then the output layer. This runs those matmuls, with the shapes of a
named model (catalog.Shape) and every layer's weights in memory of their own (so that they come from
memory as a real pass's do, not from cache), on the kernels and weights forms the runtime would use
(int8: attention, MLP and output layer int8; int4: MLP and output layer "w4", attention int8, as
quant.quantize makes them). The values are constant fills: these kernels take the same time
whatever the weights hold. Nothing is converted or assembled, so the larger target is measured
before it is ever converted (converting it is a minute and gigabytes of memory).

Left out: attention over the KV cache, norms and the rotary embedding (a few percent of a pass at
a 2k-token context, in both models alike), and the Python around each call (the native layer has
none; here it is the same per matmul for both models). The models are measured in turn, pass by
pass, so that load elsewhere on the machine slows both alike and their ratio holds.
"""

from __future__ import annotations

import statistics
import time

import torch

from .catalog import Shape
from .kernels import cpu_kernel

FORMS = ("int8", "int4")  # weights forms measured (no quantization reads 2-4x the bytes: never the faster)
REPS = 5  # passes per model; the fastest counts (load elsewhere only slows a pass down)


class Weights:
    """One model's matmul weights in a weights form, every layer its own: lists of (packed, scales,
    n, kind) per matmul in pass order. `avx2`: the kinds a CPU without VNNI runs (forcing them on
    a CPU that has it answers what an AVX2-only CPU would choose)."""

    def __init__(self, shape: Shape, form: str, avx2: bool = False):
        if form not in FORMS:
            raise ValueError(f"unknown weights form {form!r}: {', '.join(FORMS)}")
        acts = cpu_kernel.activations()
        self.int8_kind = cpu_kernel.kind_of(acts, wide=not avx2)
        self.w4_kind = "w4" if avx2 else cpu_kernel.w4_kind()
        h, i, d = shape.hidden, shape.intermediate, shape.head_dim
        qkv = (shape.heads + 2 * shape.kv_heads) * d
        mlp = "w4" if form == "int4" else "int8"
        layer = [(qkv, h, "int8"), (h, shape.heads * d, "int8"), (2 * i, h, mlp), (h, i, mlp)]
        self.mats = [_matrix(n, k, kind) for _ in range(shape.layers) for n, k, kind in layer]
        self.mats.append(_matrix(shape.vocab, h, mlp))  # the output layer: w4 under int4, as quantize makes it
        self.hidden = h
        self.bytes = sum(p.numel() * p.element_size() + s.numel() * s.element_size() for p, s, *_ in self.mats)

    def pass_ms(self) -> float:
        """Wall ms of one one-token pass over every matmul."""
        xs: dict[int, torch.Tensor] = {}
        t0 = time.perf_counter()
        for packed, scales, n, k, scheme in self.mats:
            x = xs.get(k)
            if x is None:
                x = xs[k] = torch.full((1, k), 0.5)
            if scheme == "int8":
                cpu_kernel.int8_mm(x, packed, scales, kind=self.int8_kind)
            else:
                cpu_kernel.w4_mm(x, packed, scales, kind=self.w4_kind, n=n)
        return (time.perf_counter() - t0) * 1000


def _matrix(n: int, k: int, scheme: str) -> tuple[torch.Tensor, torch.Tensor, int, int, str]:
    """(packed, scales, n, k, scheme) of an [n, k] weight in quant's layouts, filled with constants."""
    if scheme == "int8":
        return torch.full((n, k), 3, dtype=torch.int8), torch.full((n,), 0.01), n, k, scheme
    rows = (n + 7) // 8 * 8  # quant.w4_rows: whole vectors of 8 channels
    groups = (k + 127) // 128 * 128 // cpu_kernel.W4_GROUP  # K padded to 128 (quant.W4_PAD)
    packed = torch.full((rows, groups * cpu_kernel.W4_GROUP // 2), 0x37, dtype=torch.uint8)
    return packed, torch.full((rows, 2, groups), 0.01, dtype=torch.bfloat16), n, k, scheme


def available() -> str | None:
    """Why the measurement cannot run here, or None: it times completiond's own kernels."""
    if not cpu_kernel.enabled():
        return "completiond's int8 kernel does not run on this CPU"
    if cpu_kernel.w4_kind() is None:
        return "completiond's int4 kernel does not run on this CPU"
    return None


def pass_costs(smaller: Shape, larger: Shape, avx2: bool = False, reps: int = REPS) -> dict:
    """Fastest one-token pass ms of `smaller` in int8 (its default form on a CPU) and of `larger` in
    each of FORMS, measured in turn, and `ratio`: per form, the median of larger / smaller over
    back-to-back pairs of passes: {"smaller_ms", "larger_ms": {form: ms}, "ratio": {form: x},
    "larger_gb": {form: GB}, ...}.
    One larger form at a time is in memory beside the smaller (the 1.5B int8: 1.6 GB)."""
    small = Weights(smaller, "int8", avx2)
    small_ms, larger_ms, larger_gb, ratio = [], {}, {}, {}
    with torch.inference_mode():
        small.pass_ms()  # first touch of its pages
        for form in FORMS:
            big = Weights(larger, form, avx2)
            big.pass_ms()
            pairs = []
            for _ in range(reps):
                pairs.append((small.pass_ms(), big.pass_ms()))
            small_ms += [a for a, _ in pairs]
            larger_ms[form] = round(min(b for _, b in pairs), 2)
            # the median of back-to-back pairs: load that comes and goes slows both passes of a pair alike
            ratio[form] = round(statistics.median(b / a for a, b in pairs), 3)
            larger_gb[form] = round(big.bytes / 1e9, 2)
            del big
    return {"smaller_ms": round(min(small_ms), 2), "larger_ms": larger_ms, "ratio": ratio, "larger_gb": larger_gb,
            "smaller_gb": round(small.bytes / 1e9, 2), "int8_kind": small.int8_kind, "w4_kind": small.w4_kind,
            "threads": torch.get_num_threads()}
