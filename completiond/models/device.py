"""Where and how a model runs: device, dtype and weight quantization, chosen by measuring.

`--dtype auto` on CPU measures bf16 against fp32 once per CPU model (cached, `cpu_bf16`): CPUs with
AVX512-BF16/AMX run bf16 weights about 2x faster than fp32; others widen bf16 in software, which
can still win a memory-bound decode pass but loses prefill's many-row matmuls (`pick_bulk_dtype`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch

from .catalog import ModelError
from ..paths import cache_root

log = logging.getLogger(__name__)


def pick_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelError("--device cuda was asked for but no CUDA device is available")
    if device not in ("cpu",) and not device.startswith("cuda"):
        raise ModelError(f"unknown device {device!r}: use auto, cpu or cuda")
    return torch.device(device)


def cpu_has_fast_bf16() -> bool:
    """Whether bf16 decode-shaped matmuls beat fp32 on this CPU (see `cpu_bf16`)."""
    return cpu_bf16()["bf16_faster"]


def cpu_has_fast_bf16_gemm() -> bool:
    """Whether bf16 prefill-shaped matmuls (hundreds of rows) beat fp32 on this CPU (see `cpu_bf16`)."""
    return cpu_bf16()["bf16_gemm_faster"]


def cpu_bf16() -> dict:
    """bf16 against fp32 on this CPU, measured once and cached per CPU model.

    bf16_faster: a decode-shaped matmul ([4, n] x [n, n], memory bound). CPUs with AVX512-BF16/AMX
    run it about 2x faster than fp32 (half the bytes); CPUs without them often still win, since the
    widening costs less than the bytes saved (an AVX2 EPYC: 6.8 vs 14.8 ms).
    bf16_gemm_faster: a prefill-shaped one ([256, n] x [n, n], compute bound). Without bf16 units
    torch widens every product in software: 5x slower than fp32 on that AVX2 EPYC, where the
    0.5B prefilled 25 tokens/s in bf16 (benchmarks/results/prefill-cost-avx2.json). Prefill then widens the weights to fp32
    (`LoadedModel.bulk_dtype`).
    """
    def measure() -> dict:
        ms = {str(dt).replace("torch.", ""): _matmul_ms(dt, rows=4) for dt in (torch.float32, torch.bfloat16)}
        gemm = {str(dt).replace("torch.", ""): _matmul_ms(dt, rows=256, n=1024, reps=4)
                for dt in (torch.float32, torch.bfloat16)}
        out = {"bf16_faster": ms["bfloat16"] < 0.8 * ms["float32"], "bf16_gemm_faster": gemm["bfloat16"] < gemm["float32"]}
        if not out["bf16_faster"]:
            log.info("bf16 is not faster than fp32 on this CPU (%s): --dtype auto uses float32", cpu_key())
        elif not out["bf16_gemm_faster"]:
            log.info("bf16 matmuls over many rows are slower than fp32 on this CPU (%s): prefill runs in float32",
                     cpu_key())
        return {**out, "ms": ms, "gemm_ms": gemm}

    return calibrated("bf16", measure, ("bf16_faster", "bf16_gemm_faster"))


def cpu_file(kind: str) -> Path:
    """calibration/<kind>-<hash>.json: a measurement of this CPU (`cpu_key`)."""
    return cache_root() / "calibration" / f"{kind}-{hashlib.sha1(cpu_key().encode()).hexdigest()[:12]}.json"


def write_cpu_file(kind: str, data: dict) -> Path:
    """Write `cpu_file(kind)` atomically, with the CPU it describes; OSError when the cache is unwritable."""
    path = cpu_file(kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"cpu": cpu_key(), **data}))
    os.replace(tmp, path)
    return path


def calibrated(kind: str, measure: Callable[[], dict], decisions: tuple[str, ...]) -> dict:
    """A measurement of this CPU taken once and cached per CPU in `cpu_file(kind)`: returns the
    `decisions` of what `measure()` returned, booleans or integers (the rest, its timings, stays in
    the file for the record). A file without one of them is measured again. An unwritable cache
    only means measuring again next time."""
    try:
        got = json.loads(cpu_file(kind).read_text())
        return {k: _decision(got[k]) for k in decisions}
    except (OSError, ValueError, KeyError):
        pass
    busy = OthersBusy()
    got = measure()
    share = busy.share()
    if share is not None and share >= LOADED:
        # others held the CPUs while it ran: the timings say more about them than about this CPU
        # (a busy minute picked float32 activations over int8 here); decide for this process only
        log.info("not caching %s: other processes used %.0f%% of the CPUs while it was measured", kind, 100 * share)
        return {k: _decision(got[k]) for k in decisions}
    try:
        write_cpu_file(kind, {**got, "others_busy": share})
    except OSError:
        pass
    return {k: _decision(got[k]) for k in decisions}


def _decision(v: object) -> bool | int:
    """A cached decision: an integer stays one (a row count), anything else is a yes or no."""
    return v if isinstance(v, int) and not isinstance(v, bool) else bool(v)


LOADED = 0.25  # others' share of the CPUs from which a measurement counts as taken under load


class OthersBusy:
    """The share of this machine's CPU time that other processes used between two readings (0..1;
    None where /proc/stat is missing): the load a measurement ran under, without this process's own
    work (a 2-core machine's load average counts the daemon's own model load and calibration)."""

    def __init__(self) -> None:
        self.start = _cpu_times()

    def share(self) -> float | None:
        end = _cpu_times()
        if self.start is None or end is None:
            return None
        (busy0, total0, own0), (busy1, total1, own1) = self.start, end
        if total1 <= total0:
            return None
        return round(min(1.0, max(0.0, (busy1 - busy0 - (own1 - own0)) / (total1 - total0))), 3)


def _cpu_times() -> tuple[float, float, float] | None:
    """(busy, total) seconds of all CPUs from /proc/stat, and this process's CPU seconds."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    t = os.times()
    return (total - idle) / hz, total / hz, t.user + t.system


def quiet_now(seconds: float = 0.5) -> float | None:
    """Others' share of the CPUs over the next `seconds` (see OthersBusy)."""
    probe = OthersBusy()
    time.sleep(seconds)
    return probe.share()


def loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


VECTOR_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "avx_vnni")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """Every feature flag /proc/cpuinfo lists for the first CPU (empty where there is none); read once."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_features() -> list[str]:
    """The vector extensions (of VECTOR_FLAGS) this CPU reports: what decides bf16/int8 speed."""
    have = cpu_flags()
    return [f for f in VECTOR_FLAGS if f in have]


def cpu_key() -> str:
    """The CPU for calibration caches: its name and vector extensions (a name like "AMD EPYC" is
    shared by cloud machines with and without AVX512-BF16)."""
    return "|".join([cpu_name(), *cpu_features()])


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _matmul_ms(dtype: torch.dtype, rows: int, n: int = 4096, reps: int = 12) -> float:
    """Best-of time of x [rows, n] @ w [n, n]^T (4 rows: memory bound like a decode pass; hundreds:
    compute bound like prefill)."""
    import time

    w = torch.randn(n, n).to(dtype)
    x = torch.randn(rows, n).to(dtype)
    best = float("inf")
    with torch.inference_mode():
        for _ in range(reps):
            t0 = time.perf_counter()
            torch.nn.functional.linear(x, w)
            best = min(best, time.perf_counter() - t0)
    return best * 1000


def pick_bulk_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype prefill chunks multiply in: the model's, except bf16 on a CPU whose bf16 matmuls
    over many rows are slower than fp32 (weights and activations widened block by block, results
    cast back: the same products, summed in float32 either way)."""
    if device.type == "cpu" and dtype == torch.bfloat16 and not cpu_has_fast_bf16_gemm():
        return torch.float32
    return dtype


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    table = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16,
             "fp16": torch.float16, "float32": torch.float32, "fp32": torch.float32}
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16
        return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32
    if dtype not in table:
        raise ModelError(f"unknown dtype {dtype!r}: use auto, bfloat16, float16 or float32")
    return table[dtype]


def trim_heap() -> None:
    """Give freed heap memory back to the system (glibc's malloc_trim; elsewhere nothing): loading
    and quantizing free ~0.7 GB of temporaries that malloc otherwise keeps in the process's RSS."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is not None and hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)
    except OSError:
        pass
