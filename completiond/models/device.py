"""Where and how a model runs: device, dtype and weight quantization, chosen by measuring.

`--dtype auto` on CPU measures bf16 against fp32 once per CPU model (cached): CPUs with
AVX512-BF16/AMX run bf16 weights about 2x faster than fp32, others widen bf16 in software.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import logging
import os
import platform
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
    """Whether bf16 matmuls beat fp32 on this CPU, measured once and cached per CPU model.

    CPUs with AVX512-BF16/AMX run bf16 weights about 2x faster than fp32 (half the bytes); without
    them torch widens bf16 in software and fp32 wins. Measuring settles it on any CPU.
    """
    cpu = cpu_name()
    path = cache_root() / "calibration" / f"bf16-{hashlib.sha1(cpu.encode()).hexdigest()[:12]}.json"
    try:
        return bool(json.loads(path.read_text())["bf16_faster"])
    except (OSError, ValueError, KeyError):
        pass
    ms = {dt: _matvec_ms(dt) for dt in (torch.float32, torch.bfloat16)}
    faster = ms[torch.bfloat16] < 0.8 * ms[torch.float32]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"cpu": cpu, "bf16_faster": faster,
                                   "ms": {str(k).replace("torch.", ""): v for k, v in ms.items()}}))
        os.replace(tmp, path)
    except OSError:
        pass
    if not faster:
        log.info("bf16 is not faster than fp32 on this CPU (%s): --dtype auto uses float32", cpu)
    return faster


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _matvec_ms(dtype: torch.dtype, n: int = 4096, reps: int = 12) -> float:
    """Best-of time of a decode-shaped matmul ([4, n] x [n, n]: memory bound, like a pass)."""
    import time

    w = torch.randn(n, n).to(dtype)
    x = torch.randn(4, n).to(dtype)
    best = float("inf")
    with torch.inference_mode():
        for _ in range(reps):
            t0 = time.perf_counter()
            torch.nn.functional.linear(x, w)
            best = min(best, time.perf_counter() - t0)
    return best * 1000


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


QUANTS = ("auto", "none", "int8", "int4")


def pick_quant(quant: str, device: torch.device, dtype: torch.dtype) -> str:
    """Weight-only quantization: auto = int8 on CPUs with fast bf16 (a decode pass reads half the bf16
    bytes; the kernels want bf16 activations), none on CUDA and with float32 activations. int4
    (MLP layers group-32 int4 requantized from the GGUF's dequantized weights, attention and output
    layer int8) is faster still but measurably worse on the Q4_K_M models: selectable, not the
    default (README "Fast target pass")."""
    if quant not in QUANTS:
        raise ModelError(f"unknown quantization {quant!r}: use {', '.join(QUANTS)}")
    if quant == "auto":
        return "int8" if device.type == "cpu" and dtype == torch.bfloat16 else "none"
    if quant != "none" and device.type != "cpu":
        raise ModelError(f"--quant {quant} runs on CPU kernels only; use --quant none on {device.type}")
    return quant


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
