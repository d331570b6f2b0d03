"""completiond's own int8 matmul for decode and verify passes on x86 CPUs with AVX2 + FMA.

`int8_mm.c` multiplies float32 activations by int8 weights (per-output-channel scales) with every
(row, channel) dot product computed the same way whatever the number of rows, so a tree pass gives
each node exactly what a one-token pass gives that token (greedy speculation stays identical to
plain decoding). On the 2-core AVX2 EPYC a pass's int8 matmuls take 0.50-0.58x the time of torch's
`_weight_int8pack_mm` at 1-64 rows (benchmarks/int8_kernel.py); tree rows reuse the widened weights.

`a16_mm.c` is the same product with the activations rounded to int16 per block of 128 first
(vpmaddwd, exact int32 sums; batch-invariant too). On some AVX2 CPUs it streams a pass's weights
faster; `int16_activations()` measures that once per CPU, and where it wins every int8 matmul on
completiond's kernel uses it (a slightly different model, the same in every pass). On CPUs with
AVX512-VNNI its integer sums run 32 activations per instruction (`avx512_vnni()`), the same bits as
its AVX2 loop: on a 2-core Zen 5 EPYC a 4-node pass of the 0.5B costs 0.84x the AVX2 loop's
(benchmarks/results/pass-cost-qwen2.5-coder-0.5b-avx512-vnni.json).

`qwen2_layer.c`, in the same library, runs a whole int8 Qwen2 decoder layer of a decode or verify pass
on it (lean.LeanQwen2's native path), with the same property.

It is compiled once per CPU and compiler with the system's C compiler into the cache
(`kernels/int8_mm-<hash>.so`, written atomically) and loaded with ctypes. Its OpenMP calls resolve
to the libgomp torch has already loaded, so it shares torch's threads. Where there is no compiler
or no AVX2/FMA, `library()` is None and torch's kernel runs. Where both run, `enabled()` takes
ours only if it (the faster of its float32 and int16 activations) streams a decode pass's weights at
least as fast as torch's on this CPU (measured once per CPU, cached beside the bf16 calibration:
torch's kernel has AVX512 paths of its own).
COMPLETIOND_INT8_KERNEL=torch|completiond overrides the measurement. The choice is made once per
process: every pass of a model runs the same kernel, which greedy identity needs.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable

import torch

from ..models.device import calibrated, cpu_flags, cpu_key
from .. import cache_dir
from ..paths import private_dir

log = logging.getLogger(__name__)

SOURCES = [Path(__file__).with_name(n) for n in ("int8_mm.c", "a16_mm.c", "qwen2_layer.c")]
HEADERS = [Path(__file__).with_name("a16_tiles.h")]  # included by a16_mm.c: part of the build's key
FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC"]
_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
# completiond_qwen2_layer(h, n, H, in_norm, post_norm, eps, wqkv, sqkv, bqkv, wo, so, wgu, sgu, inter,
#   wd, sd, cos, sin, kc, vc, kv_bf16, cap, begin, keys, mask, heads, kv_heads, d, scale, work, a16, threads)
QWEN2_LAYER_ARGS = [_P, _I, _I, _P, _P, _F, _P, _P, _P, _P, _P, _P, _P, _I, _P, _P, _P, _P, _P, _P,
                    ctypes.c_int, _I, _I, _I, _P, _I, _I, _I, _F, _P, ctypes.c_int, ctypes.c_int]
# completiond_qwen2_work(n, H, inter, heads, kv_heads, d, keys, threads) -> floats of scratch
QWEN2_WORK_ARGS = [_I] * 7 + [ctypes.c_int]
NAME = "completiond-avx2"  # what status / --json report as the int8 kernel
A16 = "+int16-activations"  # appended where int8 matmuls round their activations to int16
VNNI = "+avx512-vnni"  # appended where those int16 matmuls sum on AVX512-VNNI
AVX512_VNNI = {"avx512f", "avx512bw", "avx512_vnni"}  # /proc/cpuinfo flags a16_mm.c's wide path needs


def wanted() -> bool:
    """Whether completiond's kernel can run here (before trying to build it): x86 with AVX2 + FMA,
    and not COMPLETIOND_INT8_KERNEL=torch."""
    return (os.environ.get("COMPLETIOND_INT8_KERNEL", "auto") != "torch"
            and platform.machine().lower() in ("x86_64", "amd64") and {"avx2", "fma"} <= cpu_flags())


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def build(out_dir: Path | None = None) -> Path:
    """Compile int8_mm.c and qwen2_layer.c into one library (once per sources, flags and compiler)
    and return its path: one this user's process built (cache_dir.verified), in a private folder."""
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler (gcc or cc) on PATH")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    texts = (src.read_text() for src in SOURCES + HEADERS)
    key = hashlib.sha1("\0".join([*texts, *FLAGS, version]).encode()).hexdigest()[:16]
    try:
        folder = private_dir(out_dir, "kernel folder") if out_dir else cache_dir.checked("kernels")
    except cache_dir.UnsafeDirError as e:
        raise RuntimeError(str(e)) from None
    so = folder / f"int8_mm-{key}.so"
    with cache_dir.locked(folder):  # one build at a time; the second finds the first's, recorded
        if (why := cache_dir.verified(so)) is None:
            return so
        if os.path.lexists(so):
            log.warning("not loading %s: %s; rebuilding it", so, why)
        tmp = folder / f".{so.name}.{os.getpid()}.tmp"
        try:
            done = subprocess.run([cc, *FLAGS, "-o", str(tmp), *map(str, SOURCES)], capture_output=True, text=True,
                                  timeout=300)
            if done.returncode != 0:
                raise RuntimeError(f"{cc} failed on {', '.join(s.name for s in SOURCES)}: {done.stderr.strip()[-500:]}")
            os.chmod(tmp, 0o700)
            os.replace(tmp, so)  # atomic: a process loading meanwhile sees the old file or this one
            cache_dir.record(so)
        finally:
            tmp.unlink(missing_ok=True)
    return so


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernel, or None (torch's kernel runs instead; the reason is logged once, one line)."""
    try:
        return _library()
    except (AttributeError, ValueError, TypeError) as e:  # loaded, but not this kernel: a symbol is missing
        log.warning("completiond's int8 kernel is not usable (%s); using torch's", e)
        return None


def _library() -> ctypes.CDLL | None:
    if not wanted():
        return None
    try:
        lib = ctypes.CDLL(str(build()))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        log.warning("completiond's int8 kernel is not available (%s); using torch's", e)
        return None
    for fn in (lib.completiond_int8_mm, lib.completiond_int8_mm_a16):
        fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
        fn.restype = None
    layer = lib.completiond_qwen2_layer
    layer.argtypes = QWEN2_LAYER_ARGS
    layer.restype = None
    work = lib.completiond_qwen2_work
    work.argtypes, work.restype = QWEN2_WORK_ARGS, ctypes.c_int64
    ctypes.c_int.in_dll(lib, "completiond_a16_avx512").value = int(AVX512_VNNI <= cpu_flags())  # same bits, faster
    return lib


def avx512_vnni() -> bool:
    """Whether a16_mm.c sums on AVX512-VNNI in this process (where the CPU has it: bit-identical
    to its AVX2 loop and faster on trees; int16 activations only)."""
    lib = library()
    return lib is not None and bool(ctypes.c_int.in_dll(lib, "completiond_a16_avx512").value)


def use_avx512_vnni(on: bool) -> None:
    """Switch a16_mm.c's AVX512-VNNI sums on or off (side-by-side runs and tests; the outputs are
    the same bits either way). On needs a CPU that has it."""
    lib = library()
    assert lib is not None and (not on or AVX512_VNNI <= cpu_flags()), "no AVX512-VNNI kernel here"
    ctypes.c_int.in_dll(lib, "completiond_a16_avx512").value = int(on)


@functools.cache
def enabled() -> bool:
    """Whether int8 layers run completiond's kernel in this process (see the module docstring)."""
    if library() is None:
        return False
    if os.environ.get("COMPLETIOND_INT8_KERNEL", "auto") == "completiond":
        return True
    return calibrate()["ours_faster"]


def _fastest_ms(runs: dict[str, Callable], shapes: list[tuple[int, int]], rows: tuple[int, ...], reps: int,
                dtype: torch.dtype) -> dict[str, float]:
    """Each run(x, q, scales) over random int8 matrices of `shapes` (read in turn, so that they come
    from memory as a pass's do) at each row count, kernels interleaved rep by rep; the fastest rep's
    ms per kernel."""
    g = torch.Generator().manual_seed(0)
    mats = [(torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g), torch.rand(n, generator=g))
            for n, k in shapes]
    best = {k: float("inf") for k in runs}
    with torch.inference_mode():
        for _ in range(reps):
            for k, run in runs.items():
                t0 = time.perf_counter()
                for m in rows:
                    xs = {kk: torch.randn(m, kk, generator=g).to(dtype) for kk in {k_ for _, k_ in shapes}}
                    for q, sc in mats:
                        run(xs[q.shape[1]], q, sc)
                best[k] = min(best[k], (time.perf_counter() - t0) * 1000)
    return best


def calibrate() -> dict:
    """Both kernels on a decode pass's shape ([1 and 4 rows, 896] x [4864, 896] int8, 12 matrices),
    ours with float32 and with int16 activations (the faster counts), torch's with bfloat16 ones,
    measured once per CPU and cached."""
    def measure() -> dict:
        runs = {"completiond": int8_mm, "completiond-int16": functools.partial(int8_mm, int16=True),
                "torch": lambda x, q, sc: torch.ops.aten._weight_int8pack_mm(x, q, sc.to(x.dtype))}
        best = _fastest_ms(runs, [(4864, 896)] * 12, (1, 4), 4, torch.bfloat16)
        faster = min(best["completiond"], best["completiond-int16"]) <= best["torch"]
        log.info("int8 kernel on this CPU (%s): %s (%s)", cpu_key(), "completiond's" if faster else "torch's", best)
        return {"ours_faster": faster, "ms": best}

    # "-v2": before int16 activations counted, AVX512 CPUs measured (and cached) torch's as faster
    return calibrated("int8-kernel-v2", measure, ("ours_faster",))


@functools.cache
def int16_activations() -> bool:
    """Whether int8 matmuls on completiond's kernel round their activations to int16 first
    (a16_mm.c) in this process: the native Qwen2 layer's (qwen2_layer.c) and QuantLinear's (the
    output layer, drafts, the torch-ops path). Where completiond's kernel runs and the int16 kernel
    streams a decode pass's matmuls faster than the float one on this CPU (measured once per CPU,
    cached). It changes what the model computes a little (each activation within 2^-16 of its
    block's largest), the same way in every pass, so greedy speculation stays identical to `ar`.
    COMPLETIOND_INT8_ACTIVATIONS=float32|int16 overrides the measurement."""
    if not enabled():
        return False
    forced = os.environ.get("COMPLETIOND_INT8_ACTIVATIONS", "auto")
    if forced in ("float32", "int16"):
        return forced == "int16"

    def measure() -> dict:
        # a pass's matmul shapes of the 0.5B (qkv, o, gate + up, down), 6 layers' worth; 1, 2 and 4
        # rows: one-token passes and the small trees that dominate
        runs = {"float32": int8_mm, "int16": functools.partial(int8_mm, int16=True)}
        best = _fastest_ms(runs, [(1152, 896), (896, 896), (9728, 896), (896, 4864)] * 6, (1, 2, 4), 5, torch.float32)
        faster = best["int16"] < best["float32"]
        log.info("int8 matmul activations on this CPU (%s): %s (%s)", cpu_key(), "int16" if faster else "float32",
                 best)
        return {"int16_faster": faster, "ms": best}

    return calibrated("int8-activations", measure, ("int16_faster",))["int16_faster"]


def name() -> str:
    """The int8 kernel decode passes run: NAME (+ A16 where activations are rounded to int16, + VNNI
    where those sum on AVX512-VNNI) or "torch"."""
    if not enabled():
        return "torch"
    return NAME + (A16 + (VNNI if avx512_vnni() else "") if int16_activations() else "")


def int8_mm(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, int16: bool = False) -> torch.Tensor:
    """x [M, K] (any float dtype) @ (q [N, K] int8 * scales [N] float32)^T -> [M, N] in x's dtype.
    int16: round x to int16 first (a16_mm.c: what int8 layers run where int16_activations())."""
    lib = library()
    assert lib is not None, "int8_mm needs library()"
    xf = x.float().contiguous()
    q, scales = q.contiguous(), scales.contiguous()
    m, k = xf.shape
    y = torch.empty(m, q.shape[0], dtype=torch.float32)
    fn = lib.completiond_int8_mm_a16 if int16 else lib.completiond_int8_mm
    fn(xf.data_ptr(), q.data_ptr(), scales.data_ptr(), y.data_ptr(), m, k, q.shape[0], torch.get_num_threads())
    return y if x.dtype == torch.float32 else y.to(x.dtype)
