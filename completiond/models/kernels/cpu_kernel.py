"""completiond's own int8 matmuls for decode and verify passes on x86 CPUs with AVX2 + FMA.

y = x W^T with int8 weights (per-output-channel scales), every (row, channel) dot product computed
the same way whatever the number of rows, so a tree pass gives each node exactly what a one-token
pass gives that token (greedy speculation stays identical to plain decoding). The kinds (KINDS;
completiond_kernels.h declares the C side):

- `int8_mm.c`: float32 activations.
- `a16_mm.c`: activations rounded to int16 per block of 128 (vpmaddwd; on AVX512-VNNI vpdpwssd,
  the same bits).
- `a8_mm.c`: activations rounded to int8 per block (u8 x s8 dot products: vpmaddubsw on AVX2,
  vpdpbusd on AVX512-VNNI or AVX-VNNI, the same bits on all three), the densest arithmetic a CPU
  has: what keeps a tree pass near a one-token pass's cost.
- `w4_mm.c` (kinds `w4*`): int4 weights with a scale and zero per group of 64 (quant.pack_w4)
  times a8's int8 activations: 0.5625 bytes a weight against int8's 1, for the layers of a large target whose
  one-token pass is bound by reading them (`w4_mm`, `w4_kind`).

`activations()` picks float32, int16 or int8 by measurement once per CPU; `kind()` adds the widest
integer sums the CPU has. `qwen2_layer.c`, in the same library, runs a whole int8 Qwen2 decoder layer
of a decode or verify pass on the chosen kind (lean.LeanQwen2's native path). docs/kernels.md has
the numbers.

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

from ..device import calibrated, cpu_flags, cpu_key
from ... import cache_dir
from ...paths import private_dir

log = logging.getLogger(__name__)

SOURCES = [Path(__file__).with_name(n) for n in ("int8_mm.c", "a16_mm.c", "a8_mm.c", "w4_mm.c", "mm.c",
                                                          "qwen2_layer.c")]
# included by the sources: part of the build's key. completiond_kernels.h declares what the library exports.
HEADERS = [Path(__file__).with_name(n) for n in ("completiond_kernels.h", "a16_tiles.h", "a8_tiles.h",
                                                          "w4_tiles.h")]
FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC"]
_P, _I, _F, _C = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
# The exported functions' ctypes signatures (argtypes, restype), in completiond_kernels.h's words;
# tests/test_cpu_kernel.py parses the header and checks them against it.
SIGNATURES: dict[str, tuple[list, type | None]] = {
    "completiond_mm_supported": ([_C], _C),
    # (on) -> on where the CPU runs it: 512-bit int4 tiles (from completiond_w4_zmm_rows rows) and value sums
    "completiond_zmm": ([_C], _C),
    # (rows) -> rows from which int4 matmuls run the 512-bit tiles (rows < 1: only read it)
    "completiond_w4_zmm_rows": ([_C], _C),
    # () -> int4 weights per scale and zero along K (W4_GROUP)
    "completiond_w4_group": ([], _C),
    # (kind, x, w, scale, y, M, K, N, threads)
    "completiond_mm": ([_C, _P, _P, _P, _P, _I, _I, _I, _C], _C),
    # (max_d) -> the largest head size whose bf16 attention scores lay keys across lanes (max_d < 0: only read it)
    "completiond_score_lanes": ([_C], _C),
    # (on) -> whether bf16 attention sums values in bf16 pairs of keys (on < 0: only read it)
    "completiond_value_pairs": ([_C], _C),
    # (n, H, inter, heads, kv_heads, d, keys, threads) -> floats of scratch
    "completiond_qwen2_work": ([_I] * 7 + [_C], _I),
    # (h, n, H, in_norm, post_norm, eps, wqkv, sqkv, bqkv, wo, so, wgu, sgu, inter, wd, sd, cos, sin,
    #  kc, vc, kv_bf16, cap, begin, keys, mask, heads, kv_heads, d, scale, work, kind, mlp_kind, threads)
    "completiond_qwen2_layer": ([_P, _I, _I, _P, _P, _F, _P, _P, _P, _P, _P, _P, _P, _I, _P, _P, _P, _P, _P, _P,
                                 _C, _I, _I, _I, _P, _I, _I, _I, _F, _P, _C, _C, _C], None),
}
# completiond_mm_kind: the matmul kernels by name (activations, then where the int32 sums run)
KINDS = {"float32": 0, "int16": 1, "int16+avx512-vnni": 2, "int8": 3, "int8+avx512-vnni": 4, "int8+avx-vnni": 5,
         "w4": 6, "w4+avx512-vnni": 7, "w4+avx-vnni": 8}  # w4: int4 weights (w4_mm.c), int8 activations
ACTIVATIONS = ("float32", "int16", "int8")
# int4 weights per scale and zero along K: w4_mm.c's W4_G (quant.pack_w4 writes them). Groups of 64
# read 0.5625 bytes a weight (32: 0.625) and halve the float steps; docs/kernels.md "int4 weights".
W4_GROUP = 64
NAME = "completiond-avx2"  # what status / --json report as the int8 kernel
SUFFIX = {"float32": "", "int16": "+int16-activations", "int8": "+int8-activations"}  # appended to NAME
AVX512_VNNI = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}  # /proc/cpuinfo flags the 512-bit VNNI kernels need
AVX512_BF16 = {"avx512f", "avx512bw", "avx512vl", "avx512_bf16"}  # ... and bf16 attention scores (attention())


def wanted() -> bool:
    """Whether completiond's kernel can run here (before trying to build it): x86 with AVX2 + FMA,
    and not COMPLETIOND_INT8_KERNEL=torch."""
    return (os.environ.get("COMPLETIOND_INT8_KERNEL", "auto") != "torch"
            and platform.machine().lower() in ("x86_64", "amd64") and {"avx2", "fma"} <= cpu_flags())


def _compilers() -> list[str]:
    """$CC, then gcc, then cc (those that exist, each once). The sources need GCC's `#pragma GCC
    target` regions: clang 14 rejects them, so a user's CC=clang must not cost them the kernel."""
    found = [os.environ.get("CC"), shutil.which("gcc"), shutil.which("cc")]
    return list(dict.fromkeys(c for c in found if c))


def build(out_dir: Path | None = None) -> Path:
    """Compile int8_mm.c and qwen2_layer.c into one library (once per sources, flags and compiler)
    and return its path: one this user's process built (cache_dir.verified), in a private folder.
    A compiler that fails on the sources hands over to the next of _compilers(); a library one of
    them built before is used without compiling (a failing $CC is not retried at every start)."""
    compilers = _compilers()
    if not compilers:
        raise RuntimeError("no C compiler (gcc or cc) on PATH")
    try:
        folder = private_dir(out_dir, "kernel folder") if out_dir else cache_dir.checked("kernels")
    except cache_dir.UnsafeDirError as e:
        raise RuntimeError(str(e)) from None
    built = []
    for cc in compilers:  # in order: one --version where the first compiler's library is there
        so = folder / f"int8_mm-{_key(cc)}.so"
        if cache_dir.verified(so) is None:
            return so
        built.append((cc, so))
    for (cc, so), then in zip(built, compilers[1:]):
        try:
            return _compile(cc, so)
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            log.warning("%s; trying %s", (str(e).splitlines() or [repr(e)])[0][:200], then)
    return _compile(*built[-1])


def _key(cc: str) -> str:
    """The library's name key: its sources, flags and compiler version (none for a compiler that
    does not run: its build then fails and says why)."""
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        version = ""
    texts = (src.read_text() for src in SOURCES + HEADERS)
    return hashlib.sha1("\0".join([*texts, *FLAGS, version]).encode()).hexdigest()[:16]


def _compile(cc: str, so: Path) -> Path:
    folder = so.parent
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


def build_id() -> str:
    """The loaded library's build key (its sources, flags and compiler), "" without one: a change to
    the kernels changes what a pass costs even where name() stays the same."""
    lib = library()
    return _build_of(lib) if lib is not None else ""


def _build_of(lib: ctypes.CDLL) -> str:
    return Path(lib._name).stem.removeprefix("int8_mm-")


def _library() -> ctypes.CDLL | None:
    if not wanted():
        return None
    try:
        lib = ctypes.CDLL(str(build()))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        log.warning("completiond's int8 kernel is not available (%s); using torch's", e)
        return None
    for name_, (args, res) in SIGNATURES.items():
        fn = getattr(lib, name_)
        fn.argtypes, fn.restype = args, res
    if lib.completiond_w4_group() != W4_GROUP:  # a stale build beside newer Python
        log.warning("completiond's int8 kernel groups int4 weights by %d, not %d; using torch's",
                    lib.completiond_w4_group(), W4_GROUP)
        return None
    global _zmm_rows
    _zmm_rows = _zmm_choice(lib)
    lib.completiond_zmm(int(_zmm_rows > 0))
    lib.completiond_w4_zmm_rows(_zmm_rows)
    return lib


@functools.cache
def kinds_here() -> tuple[str, ...]:
    """The matmul kinds this CPU runs (KINDS' names), where the library loads."""
    lib = library()
    return () if lib is None else tuple(k for k, v in KINDS.items() if lib.completiond_mm_supported(v))


def kind_of(activations: str, wide: bool = True) -> str:
    """The kind for these activations: where `wide`, on the widest integer sums this CPU has (the same
    bits as the AVX2 loop, faster); else the AVX2 loop."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"unknown activations {activations!r} (expected one of {', '.join(ACTIVATIONS)})")
    if wide and activations != "float32":
        for k in (f"{activations}+avx512-vnni", f"{activations}+avx-vnni"):
            if k in kinds_here():
                return k
    return activations


def w4_kind() -> str | None:
    """The int4-weight kind on the widest integer sums this CPU has (all give the same bits), or None."""
    for k in ("w4+avx512-vnni", "w4+avx-vnni", "w4"):
        if k in kinds_here():
            return k
    return None


def kind() -> str:
    """The kind every int8 matmul on completiond's kernel runs in this process (read on every pass:
    benchmarks swap it for side-by-side runs)."""
    return kind_of(activations())


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
        runs = {"completiond": int8_mm, "completiond-int16": functools.partial(int8_mm, kind=kind_of("int16")),
                "torch": lambda x, q, sc: torch.ops.aten._weight_int8pack_mm(x, q, sc.to(x.dtype))}
        best = _fastest_ms(runs, [(4864, 896)] * 12, (1, 4), 4, torch.bfloat16)
        faster = min(best["completiond"], best["completiond-int16"]) <= best["torch"]
        log.info("int8 kernel on this CPU (%s): %s (%s)", cpu_key(), "completiond's" if faster else "torch's", best)
        return {"ours_faster": faster, "ms": best}

    # "-v2": before int16 activations counted, AVX512 CPUs measured (and cached) torch's as faster
    return calibrated("int8-kernel-v2", measure, ("ours_faster",))


# rows of the activation calibration: one-token passes, and the trees verification runs
CALIBRATION_ROWS = (1, 4, 8)


@functools.cache
def activations() -> str:
    """What int8 matmuls on completiond's kernel do with their activations in this process: keep them
    float32 (int8_mm.c), or round them per block to int16 (a16_mm.c) or int8 (a8_mm.c) for denser
    integer arithmetic. That runs in the native Qwen2 layer (qwen2_layer.c) and QuantLinear (the
    output layer, drafts, the torch-ops path). The fastest on a pass's matmul shapes, one-token and
    tree rows together, measured once per CPU and cached; "float32" where completiond's kernel does
    not run. Rounding changes what the model computes a little (docs/kernels.md measures how often a
    greedy token changes), the same way in every pass, so greedy speculation stays identical to `ar`.
    COMPLETIOND_INT8_ACTIVATIONS=float32|int16|int8 overrides the measurement."""
    if not enabled():
        return "float32"
    forced = os.environ.get("COMPLETIOND_INT8_ACTIVATIONS", "auto")
    if forced in ACTIVATIONS:
        return forced

    def measure() -> dict:
        # a pass's matmul shapes of the 0.5B (qkv, o, gate + up, down), 6 layers' worth
        runs = {a: functools.partial(int8_mm, kind=kind_of(a)) for a in ACTIVATIONS}
        best = _fastest_ms(runs, [(1152, 896), (896, 896), (9728, 896), (896, 4864)] * 6, CALIBRATION_ROWS, 5,
                           torch.float32)
        fastest = min(best, key=best.get)
        log.info("int8 matmul activations on this CPU (%s): %s (%s)", cpu_key(), fastest, best)
        return {"int16_fastest": fastest == "int16", "int8_fastest": fastest == "int8", "ms": best}

    # "-v2": before int8 activations existed, the file held int16_faster. (A machine keeps its
    # choice when kernels change: int8 activations change the model's greedy text more often than
    # int16, so a cached int16 is not re-measured away for a few percent of speed.)
    got = calibrated("int8-activations-v2", measure, ("int16_fastest", "int8_fastest"))
    return "int8" if got["int8_fastest"] else "int16" if got["int16_fastest"] else "float32"


ATTENTION = ("float32", "bf16")  # what the native layer's attention scores multiply in


@functools.cache
def attention() -> str:
    """What the native Qwen2 layer's attention scores multiply in this process, where its KV cache
    is bf16: "bf16" (`vdpbf16ps`: the queries rounded to bf16, as the cache's keys already are; two
    exact products a lane per instruction) where the CPU has AVX512-BF16, else "float32". A long
    prompt makes every node of a tree attend over it (docs/kernels.md "Attention": 6-11 % off a pass
    of either Qwen target at 2,048 tokens); rounding the queries changes the model a little, the same way in every
    pass, so greedy speculation stays identical to `ar`. COMPLETIOND_ATTENTION=float32 keeps the
    float32 scores (bf16 is used only where the CPU has it)."""
    forced_off = os.environ.get("COMPLETIOND_ATTENTION", "auto") == "float32"
    return "bf16" if AVX512_BF16 <= cpu_flags() and not forced_off else "float32"


_zmm_rows = 0  # library()'s choice for this process (_zmm_choice): the fewest int4 matmul rows that run the
# 512-bit tiles, 0 where the 512-bit code is off
ZMM_GAIN = 0.95  # 512-bit code runs where it takes at most this share of the 256-bit code's time
ZMM_ROWS = (2, 3, 4, 5, 6, 8)  # int4 matmul row counts both widths are timed at (7 goes with 8 and 6)


def zmm() -> bool:
    """Whether the kernels run 512-bit code in this process: int4-weight matmuls of enough rows (tree
    passes, prefill chunks: `vpdpbusd` over two vectors of 8 channels at once, w4_mm.c) and the
    native layer's attention value sums. Same bits either way; only the time differs, so it is
    measured once per CPU and kernel build (`_zmm_choice`): on Zen 5 a 512-bit instruction does
    twice a 256-bit one's work in the same time (an 8-row int4 matmul of the 1.5B's shapes: 0.77x,
    docs/kernels.md "512-bit tiles"), where Zen 4 splits it in two halves and some Intel CPUs lower their
    clock for it.
    COMPLETIOND_ZMM=0 / 1 skips the measurement (1: only where the CPU has AVX512-VNNI)."""
    return library() is not None and _zmm_rows > 0


def zmm_rows() -> int:
    """The fewest rows of an int4 matmul that run the 512-bit tiles where zmm() (0 where it is off)."""
    return _zmm_rows if zmm() else 0


def _zmm_choice(lib: ctypes.CDLL) -> int:
    """The fewest rows of an int4 matmul that run the 512-bit code on this CPU, 0 where it is off:
    forced by COMPLETIOND_ZMM (1: from 3 rows), else timed once per CPU and kernel build and cached.
    It is on where 8 rows gain at least ZMM_GAIN; it runs from the smallest timed row count from which
    every timed count gains that (docs/kernels.md "512-bit tiles": on a Zen 5 from 3 rows; one row reads
    as fast either way)."""
    if not AVX512_VNNI <= cpu_flags():
        return 0
    forced = os.environ.get("COMPLETIOND_ZMM", "auto")
    if forced in ("0", "1"):
        return 3 if forced == "1" else 0

    def measure() -> dict:
        ms = _zmm_ms(lib)
        gains = [r for r in ZMM_ROWS if ms[str(r)]["zmm"] <= ZMM_GAIN * ms[str(r)]["ymm"]]
        rows = next((r for r in ZMM_ROWS if all(g in gains for g in ZMM_ROWS if g >= r)), 0)
        log.info("512-bit kernels on this CPU (%s): %s (%s)", cpu_key(), f"from {rows} rows" if rows else "off", ms)
        return {"zmm_rows": rows, "ms": ms}

    # per build too: a kernel change moves the two widths' times apart (the activation broadcasts inside vpdpbusd: the
    # 256-bit tiles' 2 rows 0.88x, the 512-bit tiles' 8 rows 0.97x)
    return calibrated(f"zmm-v2-{_build_of(lib)}", measure, ("zmm_rows",))["zmm_rows"]


def _zmm_ms(lib: ctypes.CDLL, layers: int = 2, reps: int = 5) -> dict[str, dict[str, float]]:
    """The 1.5B's MLP matmuls with int4 weights (gate + up [17920, 1536], down [1536, 8960]; `layers`
    of them, 41 MB each: from memory, as a pass reads them) at each of ZMM_ROWS rows, the 512-bit and
    256-bit code interleaved rep by rep: the fastest rep's ms of each, by row count. The weights are
    random bytes: the time does not depend on them. It calls `lib` itself, not w4_mm: library() is
    still loading it."""
    g = torch.Generator().manual_seed(0)
    mats = []
    for _ in range(layers):
        for n, k in ((17920, 1536), (1536, 8960)):
            kp = (k + 127) // 128 * 128
            mats.append((torch.randint(0, 256, (n, kp // 2), dtype=torch.uint8, generator=g),
                         torch.rand(n, 2, kp // W4_GROUP, generator=g).to(torch.bfloat16), n, k))
    xs = {(m, k): torch.randn(m, k, generator=g) for m in ZMM_ROWS for k in (1536, 8960)}
    ys = {(m, n): torch.empty(m, n) for m in ZMM_ROWS for n in (17920, 1536)}
    best = {str(m): {"zmm": float("inf"), "ymm": float("inf")} for m in ZMM_ROWS}
    before = lib.completiond_w4_zmm_rows(0)
    try:
        lib.completiond_w4_zmm_rows(1)  # "zmm": every row count in 512-bit tiles
        for _ in range(reps):
            for m in ZMM_ROWS:
                for name in ("zmm", "ymm"):
                    lib.completiond_zmm(int(name == "zmm"))
                    t0 = time.perf_counter()
                    for packed, scales, n, k in mats:
                        lib.completiond_mm(KINDS["w4+avx512-vnni"], xs[m, k].data_ptr(), packed.data_ptr(),
                                           scales.data_ptr(), ys[m, n].data_ptr(), m, k, n, torch.get_num_threads())
                    best[str(m)][name] = min(best[str(m)][name], (time.perf_counter() - t0) * 1000)
    finally:
        lib.completiond_zmm(0)
        lib.completiond_w4_zmm_rows(before)
    return {m: {k: round(v, 3) for k, v in b.items()} for m, b in best.items()}


def name() -> str:
    """The int8 kernel decode passes run: NAME + the activations' SUFFIX (+ where the integer sums
    run, e.g. "+avx512-vnni", + "+zmm" where zmm(), + "+bf16-attention" where attention() is bf16,
    then "+value-pairs" where its value sums take keys in bf16 pairs), or "torch". (Calibration
    tables are kept per name: each of these changes what a pass costs.)"""
    if not enabled():
        return "torch"
    acts, k = activations(), kind()
    bf16 = attention() == "bf16"
    return (NAME + SUFFIX[acts] + k[len(acts):] + ("+zmm" if zmm() else "")
            + ("+bf16-attention" if bf16 else "")
            + ("+value-pairs" if bf16 and library().completiond_value_pairs(-1) == 1 else ""))


def int8_mm(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, kind: str = "float32") -> torch.Tensor:
    """x [M, K] (any float dtype) @ (q [N, K] int8 in [-127, 127] * scales [N] float32)^T -> [M, N]
    in x's dtype, on the matmul `kind` (KINDS; one this CPU runs, kinds_here())."""
    lib = library()
    assert lib is not None, "int8_mm needs library()"
    if kind not in kinds_here():
        raise ValueError(f"matmul kind {kind!r} does not run on this CPU (it runs {', '.join(kinds_here())})")
    if kind.startswith("w4"):
        raise ValueError(f"matmul kind {kind!r} takes int4 weights: w4_mm")
    xf = x.float().contiguous()
    q, scales = q.contiguous(), scales.contiguous()
    m, k = xf.shape
    y = torch.empty(m, q.shape[0], dtype=torch.float32)
    lib.completiond_mm(KINDS[kind], xf.data_ptr(), q.data_ptr(), scales.data_ptr(), y.data_ptr(), m, k, q.shape[0],
                       torch.get_num_threads())
    return y if x.dtype == torch.float32 else y.to(x.dtype)


def w4_mm(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, kind: str | None = None,
          n: int | None = None) -> torch.Tensor:
    """x [M, K] (any float dtype) @ W^T for int4 weights packed by quant.pack_w4 (packed uint8 [N8,
    kp / 2], scales bfloat16 [N8, 2, kp / W4_GROUP]: scales, zeros; N8 = n up to a multiple of 8) -> [M, n]
    in x's dtype; `n` defaults to N8, `kind` to w4_kind()."""
    lib = library()
    assert lib is not None, "w4_mm needs library()"
    kind = kind or w4_kind()
    if kind not in kinds_here() or not kind.startswith("w4"):
        raise ValueError(f"matmul kind {kind!r} is not an int4 kind this CPU runs ({', '.join(kinds_here())})")
    xf = x.float().contiguous()
    m, k = xf.shape
    n8, g = scales.shape[0], scales.shape[-1]
    n = n8 if n is None else n
    if (packed.shape != (n8, g * W4_GROUP // 2) or packed.dtype != torch.uint8 or scales.shape != (n8, 2, g)
            or scales.dtype != torch.bfloat16 or (k + 127) // 128 * (128 // W4_GROUP) != g or n8 % 8 or not n8 - 8 < n <= n8):
        raise ValueError(f"w4 weights {tuple(packed.shape)} / scales {tuple(scales.shape)} do not fit K = {k}, "
                         f"N = {n}")
    packed, scales = packed.contiguous(), scales.contiguous()
    y = torch.empty(m, n, dtype=torch.float32)
    lib.completiond_mm(KINDS[kind], xf.data_ptr(), packed.data_ptr(), scales.data_ptr(), y.data_ptr(), m, k, n,
                       torch.get_num_threads())
    return y if x.dtype == torch.float32 else y.to(x.dtype)
