"""The draft gate: whether a proposer that costs time (a draft model, heads) pays on this machine,
measured (`StepGate`) and bounded before it is asked (`could_pay`), and kept beside the pass costs
across daemon starts (`gates_path`, `save_gates`, `slower_draft`)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .calibration import MAX_AGE_S, calibration_path, write_json

if TYPE_CHECKING:
    from ...models.loaded import LoadedModel
    from .tree import Candidate


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
    write_json(path, data)
