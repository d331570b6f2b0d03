"""The calibration store: pass costs measured at start-up (`measure_costs`), kept per machine, model,
dtype, threads and kernel (`calibration_path`), and when a kept table is measured again
(`stale_reason`). The cost model that uses them: budget.py; the draft gate's own store: gate.py."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ...models.device import LOADED, cpu_key
from ...models.kernels import cpu_kernel
from ...paths import cache_root
from .budget import QUANTILE, quantile

if TYPE_CHECKING:
    from ...models.loaded import LoadedModel
    from ..forward.runner import Runner

MAX_AGE_S = 7 * 86400.0  # a cached table older than this is measured again (at start-up, when quiet)


def measure_costs(runner: Runner, sizes: tuple[int, ...], context: int = 64, rounds: int = 3) -> dict[int, float]:
    """Target pass cost (ms) by tree size on this device, on a `context`-token cache.

    Sizes are interleaved over `rounds` (a burst of load elsewhere then hits every size alike) and
    each gives the QUANTILE of its passes, as real passes do in TreeBudget (the bench and the daemon
    price trees alike); a warm-up pass per size pays one-time kernel set-up. The runner's cache is
    reset before and after."""
    runner.reset()
    v = runner.lm.vocab_size
    runner.extend([i * 7919 % v for i in range(context)])
    seen: dict[int, list[float]] = {n: [] for n in sizes}
    for r in range(rounds + 1):
        for n in sizes:
            done = runner.run_pass([i * 104729 % v for i in range(n)], [-1] + list(range(n - 1)), range(n))
            if r:
                seen[n].append(done.ms)
    runner.reset()
    return {n: quantile(ms, QUANTILE) for n, ms in seen.items()}


def calibration_path(target: LoadedModel) -> Path:
    """One calibration file per (CPU or GPU, model, dtype, threads, and the CPU kernel's kind and
    build): costs differ on each."""
    cpu = cpu_key()
    if target.device.type == "cuda":
        cpu = torch.cuda.get_device_name(target.device)
    key = f"{cpu}|{target.name}|{target.dtype}|{target.device}|{torch.get_num_threads()}|{target.meta.get('quant', '')}"
    if target.device.type == "cpu" and target.meta.get("quant") in ("int8", "int4"):
        key += f"|{cpu_kernel.name()}|{cpu_kernel.build_id()}"  # a pass costs what its kernel makes it
    digest = hashlib.sha1(key.encode()).hexdigest()[:16]
    return cache_root() / "calibration" / f"{digest}.json"


def stale_reason(table: dict, now_busy: float | None, now: float | None = None) -> str | None:
    """Why a cached table should be measured again now (None: keep it, real passes refine it): it
    is older than MAX_AGE_S, or it was measured while others kept LOADED of the CPUs busy and the
    machine is quieter now. A table measured under load while the machine is still loaded is kept:
    measuring again would measure the load again."""
    now = time.time() if now is None else now
    at = table.get("measured_at")
    quiet = now_busy is not None and now_busy < LOADED
    if at is None:
        return "the cached table has no date" if quiet else None
    if now - at > MAX_AGE_S and (quiet or now_busy is None):
        return f"the cached table is {(now - at) / 86400:.0f} days old"
    busy = table.get("others_busy")
    if busy is not None and busy >= LOADED and quiet and now_busy < busy / 2:
        return f"the cached table was measured with {busy:.0%} of the CPUs busy elsewhere (now {now_busy:.0%})"
    return None


def write_json(path: Path, data: dict) -> None:
    """Write `data` atomically (several daemons may share the cache); an unwritable cache is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except OSError:
        pass


def load_table(path: Path) -> tuple[dict[int, float], dict] | None:
    """Cached pass costs and their metadata (measured_at, loadavg, others_busy), or None when there
    are none (or the file is unreadable). Files of older versions hold costs only (no date)."""
    try:
        data = json.loads(path.read_text())
        costs = {int(n): float(ms) for n, ms in data["costs"].items()}
        meta = {k: data.get(k) for k in ("measured_at", "loadavg", "others_busy")}
        if not all(v is None or isinstance(v, (int, float)) for v in meta.values()):
            meta = {"measured_at": None, "loadavg": None, "others_busy": None}
        return (costs, meta) if costs else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def load_costs(path: Path) -> dict[int, float] | None:
    """Cached pass costs, or None when there are none (or the file is unreadable)."""
    got = load_table(path)
    return got[0] if got else None


def save_costs(path: Path, costs: dict[int, float], meta: dict | None = None, sources: dict | None = None) -> None:
    """Write the table (atomically) with when and under what load it was last measured, and where
    each entry came from; a read-only cache only costs a calibration next time."""
    write_json(path, {"costs": costs,
                       **{k: v for k, v in (meta or {}).items() if k in ("measured_at", "loadavg", "others_busy")},
                       "saved_at": time.time(), **({"sources": sources} if sources else {})})
