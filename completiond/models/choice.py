"""Which target `--target default` means (issue 37): by device, and on a CPU by this CPU's own
side-by-side measurement, kept by `completiond bench --targets` in the calibration cache."""

from __future__ import annotations

import json
import statistics
import sys

from .catalog import CODER_05B, CODER_15B, NAMED, default_models, installed
from .device import cpu_file, write_cpu_file

# On a CPU the 1.5B is the default where its `combined` p50 is within this factor of the 0.5B's `ar`
# p50 on this CPU: it is right more often (README "Models" has both targets' quality), and a wait this
# much longer is the most a user should pay for that.
LARGER_DEFAULT_WITHIN = 1.25
MEASURED_PAIR = (CODER_15B.name, CODER_05B.name)  # (larger, smaller): the pair the measurement compares
MIN_POSITIONS = 16  # a bench run on fewer positions does not decide the default
# A package's ratio is the median of its last runs: runs of the same code on one package spread by
# ±0.07 around the 1.25x line (round 16: 1.21-1.35x on boltons), and one run must not flip the default.
KEPT_RUNS = 3
# the side-by-side run that checks or overrides the choice, as a message prints it (it runs as printed)
SIDE_BY_SIDE = ("completiond bench --repo pypi:toolz==1.0.0 --positions 40 --modes ar,combined "
                "--targets {larger}@int4,{smaller}")
KIND = "default-target"  # calibration/default-target-<cpu>.json


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
    larger target the default, the quantization it was measured with (its speed is that one's);
    else "auto"."""
    if device != "cpu":
        return "auto"
    name, _, m = _cpu_choice()
    return (m.get("larger_quant") or "auto") if name == MEASURED_PAIR[0] else "auto"


def default_target(device: str) -> tuple[str, str]:
    """(named target, why) that `--target default` means on this device type. On a CPU: the 1.5B
    where this CPU's measurement puts its `combined` p50 within LARGER_DEFAULT_WITHIN of the 0.5B's
    `ar` p50 and it is installed, else the 0.5B. A device default that is not installed (CUDA without
    the `coder` extra) falls back to the CPU's. `why` is for status and --json."""
    if device != "cpu":
        name = default_models(device)[0]
        m = NAMED[name]
        if m is None or installed(m):
            return name, f"the {device} default"
        fallback = default_models("cpu")[0]
        print(f"completiond: the {device} default {name} is not installed ({m.install_hint}); using {fallback}",
              file=sys.stderr)
        return fallback, f"{name} is the {device} default but is not installed ({m.install_hint})"
    return _cpu_choice()[:2]


def _cpu_choice() -> tuple[str, str, dict]:
    """default_target on a CPU, and the latest run of the package that decided ({} where none did).
    That package is the one where the larger target is slowest against the smaller, by the median of
    its kept runs: packages disagree (round 13: 1.24x on toolz, 1.33x on boltons), and the order they
    were benched in must not choose the default."""
    larger, smaller = MEASURED_PAIR
    bench = f"`{SIDE_BY_SIDE.format(larger=larger, smaller=smaller)}`"
    runs = _runs()
    if not runs:
        return smaller, f"no side-by-side measurement on this CPU yet ({bench} makes one)", {}
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
