"""How much to speculate: measured pass costs against measured acceptance.

A target pass over n nodes costs `cost(n)` ms (measured on this device at start-up, then kept fresh
with every pass). A tree node is worth the probability that its whole path is accepted (the tree's
`value`). The controller keeps the n best nodes that maximise expected tokens per millisecond,
(1 + sum of their values) / cost(n + 1); with no good guesses that is the root alone, i.e. plain
decoding, so speculation never costs much more than `ar`.
"""

from __future__ import annotations

import bisect

SIZES = (1, 2, 4, 8, 16, 32, 64)


class Ewma:
    def __init__(self, value: float, alpha: float = 0.1):
        self.value = value
        self.alpha = alpha

    def add(self, x: float) -> None:
        self.value += self.alpha * (x - self.value)


class Adaptive:
    def __init__(self, max_nodes: int = 64, always: bool = False):
        self.max_nodes = max_nodes
        self.always = always  # verify every proposed node and always run the draft (tests, experiments)
        self._cost: dict[int, Ewma] = {}
        self._trees = 0  # trees with candidates seen (for the periodic probe in best_size)

    def costs(self) -> dict[int, float]:
        """Measured ms per pass by tree size (what a calibration cache stores)."""
        return {s: e.value for s, e in sorted(self._cost.items())}

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
        size = SIZES[min(bisect.bisect_left(SIZES, n), len(SIZES) - 1)]
        if size not in self._cost:
            self._cost[size] = Ewma(ms)
        elif n == size:
            self._cost[size].add(ms)

    def cost(self, n: int) -> float:
        """Estimated ms of a target pass over n nodes (linear between measured sizes)."""
        if not self._cost:
            return 1.0 + 0.02 * n
        known = sorted((s, e.value) for s, e in self._cost.items())
        if n <= known[0][0]:
            return known[0][1]
        for (s0, c0), (s1, c1) in zip(known, known[1:]):
            if n <= s1:
                return c0 + (c1 - c0) * (n - s0) / (s1 - s0)
        (s0, c0), (s1, c1) = known[-2:] if len(known) > 1 else (known[0], (known[0][0] * 2, known[0][1] * 2))
        return c1 + (c1 - c0) * (n - s1) / max(1, s1 - s0)

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
        best_n, best_rate, gain = 0, 1.0 / self.cost(1), 1.0
        for n in range(1, min(len(values), self.max_nodes + 1)):
            gain += values[n]
            rate = gain / self.cost(n + 1)
            if rate > best_rate:
                best_n, best_rate = n, rate
        return best_n
