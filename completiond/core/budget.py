"""How much to speculate: measured pass costs against measured acceptance.

A target pass over n nodes costs `cost(n)` ms (measured on this device at start-up, then kept fresh
with every pass, per exact size: on AVX2 the int8 kernel's row tiles make an odd size cost about as
much as the next even one, 3 nodes 1.4x 2 nodes and as much as 4, which no interpolation between
powers of two sees). A tree node is worth the probability that its whole path is accepted (the tree's
`value`). The controller keeps the n best nodes that maximise expected tokens per millisecond,
(1 + sum of their values) / cost(n + 1); with no good guesses that is the root alone, i.e. plain
decoding, so speculation never costs much more than `ar`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..models.device import cpu_key
from . import cpu_kernel
from ..paths import cache_root

if TYPE_CHECKING:
    from ..models import LoadedModel
    from .runner import Runner

SIZES = (1, 2, 4, 8, 16, 32, 64)  # the sizes reported side by side (bench, pass-cost benchmarks)
CALIBRATION_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 32, 64)  # `Engine.calibrate` (bench): odd sizes too
QUICK_SIZES = (1, 2, 3, 4, 8, 16, 64)  # a daemon's first start (then cached, and real passes fill in)
OUTLIER = 2.0  # a pass counts at most this many times the estimate for its size (a burst of load elsewhere)


class Ewma:
    def __init__(self, value: float, alpha: float = 0.1):
        self.value = value
        self.alpha = alpha

    def add(self, x: float) -> None:
        self.value += self.alpha * (x - self.value)


class TreeBudget:
    def __init__(self, max_nodes: int = 64, always: bool = False):
        self.max_nodes = max_nodes
        self.always = always  # verify every proposed node and always run the draft (tests, experiments)
        self._cost: dict[int, Ewma] = {}
        self._trees = 0  # trees with candidates seen (for the periodic probe in best_size)

    def costs(self) -> dict[int, float]:
        """Measured ms per pass by tree size (what a calibration cache stores)."""
        return {s: e.value for s, e in sorted(self._cost.copy().items())}  # copy: atomic, any thread

    def load_costs(self, costs: dict[int, float]) -> None:
        """Install measured costs, made consistent: a bigger tree never costs less than a smaller
        one, and n nodes never more than n one-node passes (a noisy outlier otherwise switches
        speculation off for good: the controller would never run that size again to correct it)."""
        known = sorted((int(n), float(ms)) for n, ms in costs.items())
        one = known[0][1] / known[0][0] if known else 0.0
        prev = 0.0
        for n, ms in known:
            ms = max(prev, min(ms, one * n)) if one else ms
            self._cost[n] = Ewma(ms)
            prev = ms

    def observe_pass(self, n: int, ms: float) -> None:
        """A real pass over n nodes took ms: the estimate for exactly n moves toward it. A size seen
        for the first time starts from it, within [1/OUTLIER, OUTLIER] x the interpolated estimate;
        later passes count at most OUTLIER x the estimate (one slow pass must not make a size look
        too dear to be tried again)."""
        if n not in self._cost:
            guess = self.cost(n) if self._cost else ms
            self._cost[n] = Ewma(min(max(ms, guess / OUTLIER), guess * OUTLIER))
        else:
            e = self._cost[n]
            e.add(min(ms, e.value * OUTLIER))

    def cost(self, n: int) -> float:
        """Estimated ms of a target pass over n nodes (linear between measured sizes)."""
        return _interpolate(self._known(), n)

    def _known(self) -> list[tuple[int, float]]:
        """(size, ms) of the measured sizes, ascending."""
        return sorted((s, e.value) for s, e in self._cost.copy().items())

    def best_size(self, values: list[float]) -> int:
        """How many nodes (beyond the root) of a best-first tree to verify; values[0] is the root.

        Every 64th tree that has candidates is verified at 2 or 4 nodes whatever the estimate says,
        so a cost that was measured too high is corrected by a real pass.
        """
        if self.always:
            return min(len(values) - 1, self.max_nodes)
        self._trees += len(values) > 1
        if len(values) > 1 and self._trees % 64 == 0:
            return min(len(values) - 1, 3 if self._trees % 128 == 0 else 1)
        known = self._known()  # once per tree: this runs before every verify pass
        best_n, best_rate, gain = 0, 1.0 / _interpolate(known, 1), 1.0
        for n in range(1, min(len(values), self.max_nodes + 1)):
            gain += values[n]
            rate = gain / _interpolate(known, n + 1)
            if rate > best_rate:
                best_n, best_rate = n, rate
        return best_n


def _interpolate(known: list[tuple[int, float]], n: int) -> float:
    """ms of n nodes from measured (size, ms), ascending: linear between them, extended past the last
    two; a prior before any measurement."""
    if not known:
        return 1.0 + 0.02 * n
    if n <= known[0][0]:
        return known[0][1]
    for (s0, c0), (s1, c1) in zip(known, known[1:]):
        if n <= s1:
            return c0 + (c1 - c0) * (n - s0) / (s1 - s0)
    (s0, c0), (s1, c1) = known[-2:] if len(known) > 1 else (known[0], (known[0][0] * 2, known[0][1] * 2))
    return c1 + (c1 - c0) * (n - s1) / max(1, s1 - s0)


def measure_costs(runner: Runner, sizes: tuple[int, ...], context: int = 64, rounds: int = 3) -> dict[int, float]:
    """Target pass cost (ms) by tree size on this device, on a `context`-token cache.

    Sizes are interleaved over `rounds` (a burst of load elsewhere then hits every size alike) and
    each keeps its fastest pass; a warm-up pass per size pays one-time kernel set-up. The runner's
    cache is reset before and after."""
    runner.reset()
    v = runner.lm.vocab_size
    runner.extend([i * 7919 % v for i in range(context)])
    best = {n: float("inf") for n in sizes}
    for r in range(rounds + 1):
        for n in sizes:
            runner.forward([i * 104729 % v for i in range(n)], [-1] + list(range(n - 1)), range(n))
            if r:
                best[n] = min(best[n], runner.last_pass_ms)
    runner.reset()
    return best


def calibration_path(target: LoadedModel) -> Path:
    """One calibration file per (CPU or GPU, model, dtype, threads): costs differ on each."""
    cpu = cpu_key()
    if target.device.type == "cuda":
        cpu = torch.cuda.get_device_name(target.device)
    key = f"{cpu}|{target.name}|{target.dtype}|{target.device}|{torch.get_num_threads()}|{target.meta.get('quant', '')}"
    if target.device.type == "cpu" and target.meta.get("quant") in ("int8", "int4"):
        key += f"|{cpu_kernel.name()}"  # a pass costs what its kernel makes it
    digest = hashlib.sha1(key.encode()).hexdigest()[:16]
    return cache_root() / "calibration" / f"{digest}.json"


def load_costs(path: Path) -> dict[int, float] | None:
    """Cached pass costs, or None when there are none (or the file is unreadable)."""
    try:
        costs = json.loads(path.read_text())["costs"]
        return {int(n): float(ms) for n, ms in costs.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def save_costs(path: Path, costs: dict[int, float]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"costs": costs}))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs a calibration next time
