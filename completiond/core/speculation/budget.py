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

import hashlib
import json
import os
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ...models.device import LOADED, cpu_key
from ...models.kernels import cpu_kernel
from ...paths import cache_root

if TYPE_CHECKING:
    from ...models import LoadedModel
    from .tree import Candidate
    from ..forward.runner import Runner

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
MAX_AGE_S = 7 * 86400.0  # a cached table older than this is measured again (at start-up, when quiet)
SOURCES = ("calibrated", "cached", "interpolated", "observed")  # where an estimate came from (`status`)
OUTLIER = 2.0  # kept for older benchmarks (budget_ab.py): the bound the estimator had before it followed the machine both ways


class Ewma:
    def __init__(self, value: float, alpha: float = 0.1):
        self.value = value
        self.alpha = alpha

    def add(self, x: float) -> None:
        self.value += self.alpha * (x - self.value)


class StepGate:
    """Whether a proposer that costs time (a draft model, heads) pays, measured: at the moments it
    says it would pay (its `pays`, a model of its own gain), the engine runs the step with it or
    without it, and this keeps the wall ms per emitted token of each (propose + verify, EWMAs of ms
    and of tokens; only the tokens the completion kept: a step that verifies past a stop rule is worth
    what came before it). It runs while its steps are cheaper per token; while not, a probe still runs it
    after PROBE such steps, then after twice as many each time a probe finds it slower (up to
    MAX_PROBE: a probe of the 0.5B drafting for the 1.5B on 2 cores costs about three steps' time
    per token), and after PROBE again once a probe's step was the cheaper. The two arms are first
    measured in turn (WARM steps each). The estimate models nothing: whatever the draft costs on
    this machine now, and whatever it adds beyond prompt lookup on this code, combined ends about
    as fast as the faster of the two ("never slower than ar")."""

    WARM = 4
    PROBE = 8
    MAX_PROBE = 64
    restored = False  # started from an earlier daemon's state (`restore`)
    measured_at: float | None = None  # unix time of the last step with the proposer (kept by `state`)

    def __init__(self) -> None:
        self.excluded = 0  # steps where the proposer could not pay at all (`could_pay`): not asked, not counted
        # ms per level of its proposals: a proposal's wall time (its cache's catch-up, every pass,
        # the sampling) over its deepest candidate's length (one pass a level): what `could_pay` prices
        self.level_ms = Ewma(0.0, 0.2)
        self.ms = {True: Ewma(0.0, 0.1), False: Ewma(0.0, 0.1)}  # by "ran": ms per step ...
        self.tokens = {True: Ewma(0.0, 0.1), False: Ewma(0.0, 0.1)}  # ... and tokens per step
        self.steps = {True: 0, False: 0}
        self.every = self.PROBE  # steps left out between two probes, now
        self._since = 0  # steps left out since the last probe

    def observe_level(self, ms: float) -> None:
        """A proposal's wall ms over its deepest candidate: `level_ms` (the first is the estimate)."""
        if self.level_ms.value <= 0:
            self.level_ms.value = ms
        else:
            self.level_ms.add(ms)

    def ms_per_token(self, ran: bool) -> float | None:
        return self.ms[ran].value / self.tokens[ran].value if self.steps[ran] else None

    def allows(self) -> bool:
        """Run the proposer on this step (it said it pays)?"""
        if min(self.steps.values()) < self.WARM:
            return self.steps[True] <= self.steps[False]
        if self.ms_per_token(True) < self.ms_per_token(False):
            self.every, self._since = self.PROBE, 0
            return True
        self._since += 1
        if self._since < self.every:
            return False
        self._since, self.every = 0, min(2 * self.every, self.MAX_PROBE)  # a probe
        return True

    def record(self, ran: bool, ms: float, tokens: int) -> None:
        """A step taken at such a moment: `ran` with the proposer or not, its wall ms, tokens emitted."""
        without = self.ms_per_token(False)
        if ran and without is not None and ms < without * max(tokens, 1):
            self.every = self.PROBE  # this probe paid: the next comes soon, so the estimate can follow
        if ran:
            self.measured_at = time.time()
        for e, x in ((self.ms[ran], ms), (self.tokens[ran], float(tokens))):
            if self.steps[ran] == 0:
                e.value = x  # the first step is the estimate, not a tenth of it
            else:
                e.add(x)
        self.steps[ran] += 1

    def state(self) -> dict:
        """What a later daemon on this machine starts from (`restore`): the estimates and the probe
        interval reached; a warm-up and the probes that found it slower are not paid again."""
        return {"ms": {k: self.ms[ran].value for k, ran in (("with", True), ("without", False))},
                "tokens": {k: self.tokens[ran].value for k, ran in (("with", True), ("without", False))},
                "steps": {k: self.steps[ran] for k, ran in (("with", True), ("without", False))},
                "every": self.every, "measured_at": self.measured_at, "level_ms": self.level_ms.value}

    @classmethod
    def restore(cls, state: dict) -> StepGate:
        """A gate from `state`; an arm measured fewer than WARM steps is measured on as at a first
        start. Raises ValueError on a damaged state."""
        g = cls()
        try:
            for k, ran in (("with", True), ("without", False)):
                ms, tokens, steps = float(state["ms"][k]), float(state["tokens"][k]), int(state["steps"][k])
                if not (ms >= 0 and tokens > 0 and steps >= 0):
                    raise ValueError(f"bad gate arm {k}: {ms}, {tokens}, {steps}")
                g.ms[ran].value, g.tokens[ran].value, g.steps[ran] = ms, tokens, min(steps, cls.WARM)
            g.every = min(max(int(state["every"]), cls.PROBE), cls.MAX_PROBE)
            at = state.get("measured_at")
            g.measured_at = float(at) if at is not None else None
            g.level_ms.value = max(float(state.get("level_ms") or 0.0), 0.0)
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"damaged gate state: {e!r}") from None
        g.restored = True
        return g

    def status(self) -> dict:
        return {"steps_with": self.steps[True], "steps_without": self.steps[False], "restored": self.restored,
                "steps_excluded": self.excluded, "level_ms": round(self.level_ms.value, 2),
                **{f"ms_per_token_{k}": round(v, 2) for k, ran in (("with", True), ("without", False))
                   if (v := self.ms_per_token(ran)) is not None}}


def could_pay(found: list[Candidate], depth: int, step_ms: float, pass_ms: float, node_ms: float) -> bool:
    """Whether a costly proposer (a draft model, heads) could pay at this step at all, even if every
    token it proposed were accepted: from measured costs and the candidates already found, no model
    of its own. Each of its passes adds at most one token to an accepted path (one target pass saved,
    `pass_ms`) and costs `step_ms`, plus `node_ms` for its node in the verify pass; a chain of `depth`
    passes saves at most `depth` target passes less those the best candidate found already saves
    (the sum of its path values: where prompt lookup's guess is taken, a draft's tokens on the same
    path add nothing). Where even that loses, the engine does not ask it: not its `pays`, not the
    StepGate's warm-up or probes (whose steps there cost 2-3x a step per token and land in a few
    completions: the p95). step_ms 0: not measured yet, it could. A depth under 1 counts as 1: a
    draft always proposes the root's first child (one pass)."""
    if step_ms <= 0:
        return True
    depth = max(depth, 1)
    saved = max((_path_value(c.probs) for c in found), default=0.0)
    return (depth - saved) * pass_ms > depth * (step_ms + max(node_ms, 0.0))


def _path_value(probs: list[float]) -> float:
    """Expected accepted tokens of one candidate: the sum of its path values (products of its
    conditional acceptances)."""
    total, value = 0.0, 1.0
    for q in probs:
        value *= q
        total += value
    return total


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


def gates_path(target: LoadedModel) -> Path:
    """The StepGates' states beside the pass costs: they are worth what those passes cost."""
    path = calibration_path(target)
    return path.with_name(f"{path.stem}.gates.json")


def load_gates(path: Path, draft: str) -> dict[str, StepGate]:
    """The gates kept for this draft (by proposer name); {} where there are none or they are damaged."""
    try:
        kept = json.loads(path.read_text())[draft]
        return {name: StepGate.restore(state) for name, state in kept.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def slower_draft(path: Path, name: str, now: float | None = None) -> str | None:
    """Why a draft model called `name` need not be loaded beside this target on this machine, or None.

    An earlier daemon's gate (any dtype or quantization of it: the keys of `save_gates` begin with the
    name) found its steps dearer per kept token than steps without it through its warm-up and every
    probe since (its interval at MAX_PROBE, doubled by each probe that found it slower), with a step
    of it within MAX_AGE_S. A gate never measured, measured long ago or still deciding: None (load
    it). So a draft that does not pay here costs no memory and no warm-ups, and is measured again by
    a start after MAX_AGE_S (the 0.5B drafting for the 1.5B on 2 cores: 2-3x the ms per token)."""
    now = time.time() if now is None else now
    try:
        data = json.loads(path.read_text())
        kept = [StepGate.restore(state) for key, gates in data.items() if key.split("|")[0] == name
                for state in gates.values()]
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    for g in kept:  # restore counts an arm's steps up to WARM: both at WARM = both measured
        with_, without = g.ms_per_token(True), g.ms_per_token(False)
        if (min(g.steps.values()) >= g.WARM and g.every >= g.MAX_PROBE and with_ > without
                and g.measured_at is not None and 0 <= now - g.measured_at <= MAX_AGE_S):
            hours = (now - g.measured_at) / 3600
            ago = f"{hours:.0f} hours" if hours < 48 else f"{hours / 24:.0f} days"
            return (f"{name} measured slower here: {with_:.0f} against {without:.0f} ms a kept token without "
                    f"it, {ago} ago; measured again after {MAX_AGE_S / 86400:.0f} days")
    return None


def save_gates(path: Path, draft: str, gates: dict[str, StepGate]) -> None:
    """Keep these gates for this draft (others' are kept too); a read-only cache only costs a
    warm-up next time."""
    try:
        data = json.loads(path.read_text())
        data = data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        data = {}
    data[draft] = {name: g.state() for name, g in gates.items()}
    _write_json(path, data)


def _write_json(path: Path, data: dict) -> None:
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
    _write_json(path, {"costs": costs,
                       **{k: v for k, v in (meta or {}).items() if k in ("measured_at", "loadavg", "others_busy")},
                       "saved_at": time.time(), **({"sources": sources} if sources else {})})
