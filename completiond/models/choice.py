"""Which target and weights form `--target default` means: by device, and on a CPU by this CPU's own
measurement. The side-by-side bench (`completiond bench --targets`, kept in the calibration cache)
decides where it was run; before that, a measurement of both targets' one-token passes on this CPU
(models/estimate.py: seconds, at the first start on a CPU and again when the CPU, the kernels, torch
or the thread count change) decides whether the larger target's `combined` is expected within the
line the bench uses."""

from __future__ import annotations

import datetime
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from .catalog import CODER_05B, CODER_15B, NAMED, default_models, installed, spelled
from .device import LOADED, OthersBusy, cpu_file, quiet_now, write_cpu_file

# On a CPU the 1.5B is the default where its `combined` p50 is within this factor of the 0.5B's `ar`
# p50 on this CPU: it is right more often (README "Models" has both targets' quality), and a wait this
# much longer is the most a user should pay for that.
LARGER_DEFAULT_WITHIN = 1.25
MEASURED_PAIR = (CODER_15B.name, CODER_05B.name)  # (larger, smaller): the pair the measurement compares
MIN_POSITIONS = 16  # a bench run on fewer positions does not decide the default
# A package's ratio is the median of its last runs: runs of the same code on one package spread by
# ±0.07 around the 1.25x line (1.21-1.35x on boltons in three runs), and one run must not flip it.
KEPT_RUNS = 3
# the side-by-side run that checks or overrides the choice, as a message prints it (it runs as printed)
SIDE_BY_SIDE = ("completiond bench --repo pypi:toolz==1.0.0 --positions 40 --modes ar,combined "
                "--targets {larger}@int4,{smaller}")
KIND = "default-target"  # calibration/default-target-<cpu>.json
# The larger target's `combined` p50 over the smaller's `ar` p50, per unit of their one-token pass
# ratio, in the committed side-by-side runs of the current kernels (benchmarks/results/zen4/round23/
# targets-{toolz,boltons}.json: (268.8 / 266.1) / (42.42 / 21.13) = 0.50 and (253.0 / 212.6) /
# (34.25 / 21.28) = 0.74; the median 0.62): speculation saves the 1.5B ~30 % of its passes (combined
# 0.68-0.75x its ar there) and it ends its completions in fewer tokens (ar 1.48-1.59x at a pass ratio
# of 1.61-2.01x). Text decides both, not the machine, so a CPU's pass ratio times this is its expected
# `combined` ratio; the bench measures the real one where it runs.
PASS_TO_COMPLETION = 0.62
ESTIMATE_KIND = "default-estimate"  # calibration/default-estimate-<cpu>.json: models/estimate.py's pass costs
ESTIMATE_VERSION = 2  # a file of another version (what it measures changed) is measured again


@dataclass(frozen=True)
class Choice:
    """What `--target default` means here: a named target, the weights form its measurement chose
    (None: --quant auto's), and why (for status and --json)."""
    name: str
    form: str | None
    why: str


def _ratio(m: dict) -> float:
    return float(m["larger_combined_p50_ms"]) / float(m["smaller_ar_p50_ms"])


def _runs() -> dict[str, list[dict]]:
    """Each package's last side-by-side runs on this CPU, oldest first (a file of an older version:
    its one run per package); {} where there is none or the file is damaged."""
    try:
        m = json.loads(cpu_file(KIND).read_text())
        by_repo = m.get("by_repo") or {m["repo"]: m}
        runs = {repo: (kept if isinstance(kept, list) else [kept]) for repo, kept in by_repo.items()}
        for kept in runs.values():
            for run in kept:
                _ratio(run)
        return {repo: kept for repo, kept in runs.items() if kept}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ZeroDivisionError):
        return {}


def _median_ratio(kept: list[dict]) -> float:
    return statistics.median(_ratio(m) for m in kept)


def record_choice(measured: dict) -> None:
    """Keep a side-by-side bench's run for this CPU: `measured` has larger_combined_p50_ms,
    smaller_ar_p50_ms, positions, repo, date, command, larger_quant (the larger target's weights
    as measured, e.g. "int4" for `qwen2.5-coder-1.5b@int4`; "auto" for the default's) and
    larger_weights (its runtime form's file, whose name says the format, e.g. the int4 groups). The
    package keeps its last KEPT_RUNS runs of the same weights (a run of other weights, or of another
    form of them, is another model and starts afresh); the other packages are kept (`_cpu_choice`
    picks the one that decides)."""
    runs = _runs()

    def weights(m: dict) -> tuple[str, str | None]:
        return m.get("larger_quant") or "auto", m.get("larger_weights")

    kept = [m for m in runs.get(measured["repo"], []) if weights(m) == weights(measured)]
    runs[measured["repo"]] = [*kept, measured][-KEPT_RUNS:]
    write_cpu_file(KIND, {"by_repo": runs})


def default_quant(device: str) -> str:
    """The weights `--target default --quant auto` loads: where this CPU's measurement made the
    larger target the default, the form it measured fastest (its speed is that one's); else "auto"."""
    if device != "cpu":
        return "auto"
    return cpu_default().form or "auto"


def default_target(device: str) -> tuple[str, str]:
    """(named target, why) that `--target default` means on this device type. On a CPU: the 1.5B
    where this CPU's measurement expects its `combined` p50 within LARGER_DEFAULT_WITHIN of the 0.5B's
    `ar` p50 and it is installed, else the 0.5B (`cpu_default`). A device default that is not
    installed (CUDA without the 1.5B's parts) falls back to the CPU's. `why` is for status and --json."""
    if device != "cpu":
        name = default_models(device)[0]
        m = NAMED[name]
        if m is None or installed(m):
            return name, f"the {device} default"
        fallback = default_models("cpu")[0]
        print(f"completiond: the {device} default {name} is not installed ({m.install_hint}); using {fallback}",
              file=sys.stderr)
        return fallback, f"{name} is the {device} default but is not installed ({m.install_hint})"
    c = cpu_default()
    return c.name, c.why


@dataclass(frozen=True)
class Unconverted:
    """The larger target this CPU chose whose weights form is not converted yet: what a daemon's
    background upgrade converts and then serves (service/upgrade.py)."""
    name: str
    form: str  # the weights form it will run (quant.pick_quant's scheme)
    why: str  # why it is the default here, as `default_reason` will say once it serves
    dtype: str = "auto"  # the --dtype of the start that found it: its form is converted in that dtype

    @property
    def spelled(self) -> str:
        return spelled(self.name, self.form)

    @property
    def convert_command(self) -> str:
        """The `completiond convert` that converts the form this start would load (it runs as printed)."""
        return f"completiond convert {self.spelled}" + ("" if self.dtype == "auto" else f" --dtype {self.dtype}")


def choose_default(device: torch.device, quant: str, pick: Callable[[str], str],
                   converted: Callable[[str, str], bool], dtype: str = "auto") -> tuple[str, str, str]:
    """(named target, --quant to load it with, why) for `--target default`, what status and --json
    say. `pick(quant)` is the weights form a --quant resolves to here (quant.pick_quant);
    `converted(name, form)` whether that form of a named model is in the cache already. A larger
    target this CPU chose but whose weights are not converted yet is not converted here (it takes a
    minute and gigabytes): the smaller serves, and `why` says so and how it gets converted (in
    `dtype`, the start's --dtype)."""
    name, quant, why, pending = _choose(device, quant, pick, converted)
    if pending is not None:
        pending = replace(pending, dtype=dtype)
        smaller = MEASURED_PAIR[1]
        return smaller, quant, (f"{spelled(smaller, pick(quant))} serves while {pending.spelled}, this CPU's "
                                f"default ({pending.why}), is not converted yet: `completiond serve` converts it "
                                f"in the background and switches to it, or `{pending.convert_command}` "
                                "converts it now (a minute or more)")
    return name, quant, why


def pending_default(device: torch.device, quant: str, pick: Callable[[str], str],
                    converted: Callable[[str, str], bool]) -> Unconverted | None:
    """The larger target `--target default` would serve here once its weights are converted (None
    where it serves what this CPU chose already, or chose the smaller); arguments as choose_default's."""
    return _choose(device, quant, pick, converted)[3]


def _choose(device: torch.device, quant: str, pick: Callable[[str], str],
            converted: Callable[[str, str], bool]) -> tuple[str, str, str, Unconverted | None]:
    """(named target, --quant, why, the pending larger target) for choose_default and pending_default."""
    asked = quant
    if device.type == "cpu":
        c = cpu_default()  # once: it may probe the machine's load
        name, why, measured = c.name, c.why, c.form
    else:
        (name, why), measured = default_target(device.type), None
    if quant == "auto" and measured is not None:
        quant, form_why = measured, "the weights form measured fastest"
    elif quant == "auto":
        form_why = "--quant auto's form on this device"
    else:
        form_why = "as --quant asked"
    form = pick(quant)
    if device.type == "cpu" and name == MEASURED_PAIR[0] and not converted(name, form):
        return MEASURED_PAIR[1], asked, why, Unconverted(name, form, f"{spelled(name, form)}: {why}; {form}: {form_why}")
    return name, quant, f"{spelled(name, form)}: {why}; {form}: {form_why}", None


def cpu_default() -> Choice:
    """`--target default` on a CPU: by the side-by-side bench where it ran here, else by the pass
    costs measured here (`_estimated`)."""
    if _runs():
        name, why, m = _cpu_choice()
        quant = m.get("larger_quant") or "auto"
        return Choice(name, quant if name == MEASURED_PAIR[0] and quant != "auto" else None, why)
    return _estimated()


def _estimated() -> Choice:
    """The choice from this CPU's one-token pass costs of both targets (models/estimate.py, cached):
    the larger target in its fastest form where its expected `combined` p50, PASS_TO_COMPLETION times
    its pass ratio, is within LARGER_DEFAULT_WITHIN of the smaller's `ar` p50, measured while the
    machine was quiet (under load the timings move by tens of percent between runs: they do not make
    a 3x heavier model the default)."""
    larger, smaller = MEASURED_PAIR
    bench = f"`{SIDE_BY_SIDE.format(larger=larger, smaller=smaller)}` checks it"
    est = pass_estimate()
    if "ratio" not in est:
        return Choice(smaller, None, f"no measurement of the larger target on this CPU ({est.get('unavailable')}); "
                                     f"{bench}")
    ratios = est["ratio"]
    form = min(ratios, key=ratios.get)
    expected = ratios[form] * PASS_TO_COMPLETION
    measured = (f"{larger}@{form}'s one-token pass measured {ratios[form]:.2f}x {smaller}'s on this CPU "
                f"({est['larger_ms'][form]:.1f} vs {est['smaller_ms']:.1f} ms, {est['threads']} threads, "
                f"{est['date']}): its `combined` p50 expected at {expected:.2f}x {smaller}'s `ar` p50 "
                f"(x{PASS_TO_COMPLETION}, as measured side by side)")
    if expected > LARGER_DEFAULT_WITHIN:
        return Choice(smaller, None, f"{measured}; the larger model is the default within "
                                     f"{LARGER_DEFAULT_WITHIN}x; {bench}")
    if (busy := est.get("others_busy") or 0) >= LOADED:  # passes that took turns with other work
        return Choice(smaller, None, f"{measured}, but other processes used {busy:.0%} of the CPUs meanwhile: "
                                     "not enough to make the larger model the default (measured again at a "
                                     f"start that finds the machine quiet); {bench}")
    if not installed(CODER_15B):
        return Choice(smaller, None, f"{measured}, but {larger} is not installed ({CODER_15B.install_hint})")
    return Choice(larger, form, f"{measured}, within {LARGER_DEFAULT_WITHIN}x; {bench}")


def pass_estimate() -> dict:
    """This CPU's pass costs of both targets (models/estimate.pass_costs), measured once and cached
    per CPU with the kernel build, torch version and thread count they were measured with (another
    of those is measured again). One taken while other processes held the CPUs is measured again at
    a start that finds the machine quiet. {"unavailable": why} where it cannot run."""
    from . import estimate

    key = {"version": ESTIMATE_VERSION, "kernels": _kernels(), "torch": torch.__version__,
           "threads": torch.get_num_threads()}
    try:
        got = json.loads(cpu_file(ESTIMATE_KIND).read_text())
        if all(got.get(k) == v for k, v in key.items()) and "ratio" in got:
            if (got.get("others_busy") or 0) < LOADED or (now := quiet_now()) is None or now >= LOADED:
                return got  # measured quiet, or no quieter now
    except (OSError, ValueError, AttributeError):
        pass
    if (why := estimate.available()) is not None:
        return {"unavailable": why}
    busy = OthersBusy()
    got = {**key, **estimate.pass_costs(CODER_05B.shape, CODER_15B.shape),
           "date": datetime.date.today().isoformat()}
    got["others_busy"] = busy.share()
    try:
        write_cpu_file(ESTIMATE_KIND, got)
    except OSError:
        pass  # an unwritable cache only means measuring again next time
    return got


def _kernels() -> str:
    from .kernels import cpu_kernel

    return cpu_kernel.build_id()


def _cpu_choice() -> tuple[str, str, dict]:
    """default_target on a CPU by the side-by-side runs kept here, and the latest run of the package
    that decided. That package is the one where the larger target is slowest against the smaller, by
    the median of its kept runs: packages disagree (1.24x on toolz, 1.33x on boltons in one pair of runs), and
    the order they were benched in must not choose the default."""
    larger, smaller = MEASURED_PAIR
    runs = _runs()
    kept = max(runs.values(), key=_median_ratio)
    m, ratio = kept[-1], _median_ratio(kept)
    where = f"{m['positions']} positions of {m['repo']}, {m['date']}"
    if len(kept) > 1:
        where += f", the median of its last {len(kept)} runs"
    if len(runs) > 1:
        where += f"; the slowest of {len(runs)} packages measured"
    quant = m.get("larger_quant") or "auto"
    shown = larger if quant == "auto" else f"{larger}@{quant}"
    measured = f"{shown} `combined` p50 is {ratio:.2f}x {smaller} `ar` p50 on this CPU ({where})"
    if ratio > LARGER_DEFAULT_WITHIN:
        return smaller, f"{measured}; the larger model is the default within {LARGER_DEFAULT_WITHIN}x", m
    if not installed(CODER_15B):
        return smaller, f"{measured}, but {larger} is not installed ({CODER_15B.install_hint})", m
    return larger, measured, m
