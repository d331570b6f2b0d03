"""How much to speculate: measured pass costs against measured acceptance.

A target pass over n nodes costs `cost(n)` ms, per exact size (on AVX2 the int8 kernel's row tiles
make an odd size cost about as much as the next even one, which no interpolation between powers of
two sees). A tree node is worth the probability that its whole path is accepted (the tree's
`value`). The controller keeps the n best nodes that maximise expected tokens per millisecond,
(1 + sum of their values) / cost(n + 1); with no good guesses that is the root alone, i.e. plain
decoding, so speculation never costs much more than `ar`.

The costs are estimates that follow this machine both ways (docs/pass-costs.md). Per size: a low quantile of
its last WINDOW real passes, or of all its passes in the last HORIZON_S when there were more (a slow
pass under load elsewhere, or a busy second of them, moves it little; a sustained change moves it
within a few passes down, within HORIZON_S up), and until there are PRIOR_WEIGHT of them a prior (a
calibration, the cached table of an earlier run, or the interpolation of its neighbours) counts as
that many passes. A size the controller stopped choosing, because its estimate is too high (a bad
minute) or because it was only ever calibrated, is probed: a tree is verified at that size now and
then, at most PROBE_SHARE of the pass time, so no estimate is kept that real passes would not
confirm. No clamp: a bound that only lets costs in one way keeps a bad minute for good.
"""

from __future__ import annotations

import time
from collections import deque

SIZES = (1, 2, 4, 8, 16, 32, 64)  # the sizes reported side by side (bench, pass-cost benchmarks)
CALIBRATION_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 32, 64)  # `Engine.calibrate` (bench): odd sizes too
QUICK_SIZES = (1, 2, 3, 4, 8, 16, 64)  # a daemon's first start (then cached, and real passes fill in)
WINDOW = 32  # real passes per size the estimate looks at, at least ...
HORIZON_S = 30.0  # ... and all of the last this many seconds (up to KEPT): a burst of passes in a busy
KEPT = 256  # second does not flush what the passes before it showed
QUANTILE = 0.1  # the estimate: this quantile of them (low: load elsewhere only ever slows a pass down; the
# 4th fastest of 32 moves down after 4 faster passes, up only when 29 of the last 32 were slower)
PRIOR_WEIGHT = 4  # a calibrated or cached cost counts as this many passes until real ones replace it
PROBE_SHARE = 0.03  # at most this share of pass time is spent verifying at a size the controller did not pick
PROBE_AFTER = 64  # passes: a size not run for this long may be probed
SOURCES = ("calibrated", "cached", "interpolated", "observed")  # where an estimate came from (`status`)
OUTLIER = 2.0  # kept for older benchmarks (budget_ab.py): the bound the estimator had before it followed the machine both ways


def quantile(xs: list[float], q: float) -> float:
    """The q-quantile of xs, the order statistic below (not interpolated: of up to 4 passes that is
    the fastest, so one slow pass among few moves nothing; a pass is never spuriously fast)."""
    return sorted(xs)[int(q * (len(xs) - 1))]


class SizeCost:
    """The cost of one tree size: a low quantile of its recent real passes, with a prior that counts
    as `weight` passes until that many real ones replace it."""

    def __init__(self, prior: float, source: str, weight: int = PRIOR_WEIGHT):
        self.prior = prior
        self.source = source  # of the prior: calibrated, cached or interpolated
        self.weight = weight
        self.samples: deque[tuple[float, float]] = deque(maxlen=KEPT)  # (time, ms)
        self.value = prior
        self.passes = 0  # real passes seen at this size (probes included)
        self.probes = 0  # of which were probes
        self.last = -1  # the budget's pass count at the last real pass (-1: none yet)
        self.last_time: float | None = None  # time.time() of the last real pass

    def add(self, ms: float, at: int, now: float) -> None:
        self.samples.append((now, ms))
        self.passes += 1
        self.last, self.last_time = at, now
        recent = [x for t, x in self.samples if t >= now - HORIZON_S]
        xs = recent if len(recent) > WINDOW else [x for _, x in list(self.samples)[-WINDOW:]]
        left = max(0, self.weight - len(self.samples))
        self.value = quantile(xs + [self.prior] * left, QUANTILE)

    @property
    def origin(self) -> str:
        """Where the estimate comes from now: `observed` once real passes replaced the prior."""
        return "observed" if len(self.samples) >= self.weight else self.source


class TreeBudget:
    def __init__(self, max_nodes: int = 64, always: bool = False):
        self.max_nodes = max_nodes
        self.always = always  # verify every proposed node and always run the draft (tests, experiments)
        self._cost: dict[int, SizeCost] = {}
        self._passes = 0  # real passes observed
        self._credit = 0.0  # ms of pass time the probes may still spend (PROBE_SHARE of every pass)
        self._probing: int | None = None  # the size best_size chose as a probe (counted when it runs)
        # the table the costs started from: how it was made (calibrated / cached / re-measured), when,
        # and the load it was measured under (`status`, bench and keystroke JSON)
        self.table: dict = {"origin": "none", "measured_at": None, "loadavg": None, "others_busy": None}

    def costs(self) -> dict[int, float]:
        """Estimated ms per pass by tree size (what a calibration cache stores)."""
        return {s: e.value for s, e in sorted(self._cost.copy().items())}  # copy: atomic, any thread

    def load_costs(self, costs: dict[int, float], source: str = "calibrated") -> None:
        """Install a table as priors (`calibrated`: measured now; `cached`: an earlier run's). Each
        size's real passes replace its prior after PRIOR_WEIGHT of them; the sizes it lacks are
        interpolated until they are run."""
        for n, ms in costs.items():
            self._cost[int(n)] = SizeCost(float(ms), source)

    def observe_pass(self, n: int, ms: float, now: float | None = None) -> None:
        """A real pass over n nodes took ms: its size's estimate follows (a size seen for the first
        time starts from the interpolation of its neighbours, counted as one pass until a second
        real pass replaces it)."""
        e = self._cost.get(n)
        if e is None:
            e = self._cost[n] = SizeCost(self.cost(n) if self._cost else ms, "interpolated", weight=2)
        self._passes += 1
        if self._probing == n:
            e.probes += 1
        self._probing = None
        e.add(ms, self._passes, time.time() if now is None else now)
        # probes get a share of what passes cost, capped: an idle hour does not buy a burst of probes
        top = max(x.value for x in self._cost.copy().values())
        self._credit = min(self._credit + PROBE_SHARE * ms, 2 * top)

    def cost(self, n: int) -> float:
        """Estimated ms of a target pass over n nodes (linear between measured sizes)."""
        return _interpolate(self._known(), n)

    def _known(self) -> list[tuple[int, float]]:
        """(size, ms) of the measured sizes, ascending."""
        return sorted((s, e.value) for s, e in self._cost.copy().items())

    def best_size(self, values: list[float]) -> int:
        """How many nodes (beyond the root) of a best-first tree to verify; values[0] is the root.

        Now and then a tree is verified at a size the controller did not pick (a probe): the size
        of the table this tree reaches that has gone longest without a real pass, when the probe
        credit pays for its extra cost. So an estimate that is too high (a bad minute, a table
        measured under load) is corrected by real passes, not kept because it is never run.
        """
        if self.always:
            return min(len(values) - 1, self.max_nodes)
        known = self._known()  # once per tree: this runs before every verify pass
        best_n = self._best_n(known, values)
        if len(values) > 1:
            probe = self._probe(known, min(len(values) - 1, self.max_nodes) + 1, best_n + 1)
            if probe is not None:
                self._probing = probe
                return probe - 1
        return best_n

    def useful_nodes(self) -> int:
        """The most nodes beyond the root that can pay in one pass even if the target accepted every
        one: what best_size would pick for such a tree. A costly proposer stops growing there, since
        best_size cuts what lies past it (a 13-token draft chain cost 12 draft passes to be cut to 4)."""
        if self.always:
            return self.max_nodes
        return self._best_n(self._known(), [1.0] * (self.max_nodes + 1))

    def _best_n(self, known: list[tuple[int, float]], values: list[float]) -> int:
        """The node count past the root whose expected tokens (1 + the values of the nodes kept) per
        ms of pass is highest, by the table `known`."""
        best_n, best_rate, gain = 0, 1.0 / _interpolate(known, 1), 1.0
        for n in range(1, min(len(values), self.max_nodes + 1)):
            gain += values[n]
            rate = gain / _interpolate(known, n + 1)
            if rate > best_rate:
                best_n, best_rate = n, rate
        return best_n

    def _probe(self, known: list[tuple[int, float]], reach: int, chosen: int) -> int | None:
        """The size to probe instead of `chosen` (None: no probe now): among the table's sizes up to
        `reach`, the one longest without a real pass, if that is over PROBE_AFTER passes ago and
        the credit covers its extra cost (a smaller size pays a tenth of a one-node pass: the
        tokens it may lose)."""
        stale, stalest = None, None
        for s, e in self._cost.copy().items():
            if not isinstance(e, SizeCost):
                continue  # an older controller's entry (benchmarks/budget_ab.py): never probed
            if s <= reach and s != chosen and self._passes - e.last > PROBE_AFTER and (
                    stalest is None or e.last < stalest.last or (e.last == stalest.last and s < stale)):
                stale, stalest = s, e
        if stale is None:
            return None
        extra = max(0.0, _interpolate(known, stale) - _interpolate(known, chosen)) + 0.1 * _interpolate(known, 1)
        if self._credit < extra:
            return None
        self._credit -= extra
        return stale

    def table_status(self) -> dict:
        """The table for `status` and the benchmarks' JSON: per size its estimate, where it came from
        (calibrated / cached / interpolated / observed), real passes and probes at that size, and
        seconds since its last real pass; with the table's origin, age and the load it was measured under."""
        now = time.time()
        sizes = {}
        for s, e in sorted(self._cost.copy().items()):
            sizes[str(s)] = {"ms": round(e.value, 2), "source": getattr(e, "origin", "observed"),
                             "prior_ms": round(getattr(e, "prior", e.value), 2), "passes": getattr(e, "passes", 0),
                             "probes": getattr(e, "probes", 0),
                             "last_pass_s": round(now - e.last_time, 1) if getattr(e, "last_time", None) else None}
        t = self.table
        return {**t, "age_s": round(now - t["measured_at"], 1) if t.get("measured_at") else None,
                "passes": self._passes, "sizes": sizes}


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
    return c1 + max(0.0, c1 - c0) * (n - s1) / max(1, s1 - s0)  # never cheaper past the last size
