"""completiond's own int8 matmul for decode and verify passes on x86 CPUs with AVX2 + FMA.

`int8_mm.c` multiplies float32 activations by int8 weights (per-output-channel scales) with every
(row, channel) dot product computed the same way whatever the number of rows, so a tree pass gives
each node exactly what a one-token pass gives that token (greedy speculation stays identical to
plain decoding). On the 2-core AVX2 EPYC it streams a 4864 x 896 int8 matrix at ~1.8x the speed
of torch's `_weight_int8pack_mm`, and tree rows reuse the widened weights (benchmarks/int8_kernel.py).

It is compiled once per CPU and compiler with the system's C compiler into the cache
(`kernels/int8_mm-<hash>.so`, written atomically) and loaded with ctypes. Its OpenMP calls resolve
to the libgomp torch has already loaded, so it shares torch's threads. Where there is no compiler,
no AVX2/FMA, or COMPLETIOND_INT8_KERNEL=torch, `library()` is None and torch's kernel runs.
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
from pathlib import Path

import torch

from ..models.device import cpu_flags
from ..paths import cache_root

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("int8_mm.c")
FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC"]
NAME = "completiond-avx2"  # what status / --json report as the int8 kernel


def wanted() -> bool:
    """Whether this machine should run completiond's kernel (before trying to build it)."""
    return (os.environ.get("COMPLETIOND_INT8_KERNEL", "auto") != "torch"
            and platform.machine().lower() in ("x86_64", "amd64") and {"avx2", "fma"} <= cpu_flags())


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def build(out_dir: Path | None = None) -> Path:
    """Compile int8_mm.c (once per source, flags and compiler) and return the shared library's path."""
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler (gcc or cc) on PATH")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha1("\0".join([SOURCE.read_text(), *FLAGS, version]).encode()).hexdigest()[:16]
    folder = out_dir or cache_root() / "kernels"
    so = folder / f"int8_mm-{key}.so"
    if so.exists():
        return so
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{so.name}.{os.getpid()}.tmp"
    try:
        done = subprocess.run([cc, *FLAGS, "-o", str(tmp), str(SOURCE)], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed on {SOURCE.name}: {done.stderr.strip()[-500:]}")
        os.replace(tmp, so)  # atomic: a second process building at once replaces it with the same bytes
    finally:
        tmp.unlink(missing_ok=True)
    return so


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernel, or None (torch's kernel runs instead; the reason is logged once)."""
    if not wanted():
        return None
    try:
        lib = ctypes.CDLL(str(build()))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        log.warning("completiond's int8 kernel is not available (%s); using torch's", e)
        return None
    fn = lib.completiond_int8_mm
    fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    fn.restype = None
    return lib


def name() -> str:
    """The int8 kernel decode passes run: NAME or "torch"."""
    return NAME if library() is not None else "torch"


def int8_mm(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [M, K] (any float dtype) @ (q [N, K] int8 * scales [N] float32)^T -> [M, N] in x's dtype."""
    lib = library()
    assert lib is not None, "int8_mm needs library()"
    xf = x.float().contiguous()
    q, scales = q.contiguous(), scales.contiguous()
    m, k = xf.shape
    y = torch.empty(m, q.shape[0], dtype=torch.float32)
    lib.completiond_int8_mm(xf.data_ptr(), q.data_ptr(), scales.data_ptr(), y.data_ptr(), m, k, q.shape[0],
                            torch.get_num_threads())
    return y if x.dtype == torch.float32 else y.to(x.dtype)
