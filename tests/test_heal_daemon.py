"""Pass costs heal in a real daemon (issue 44): a table installed in its calibration cache at 3x or
1/3x the true costs (or 3x above 2 nodes only, the shape the issue found) is only a starting point:
within 200 completions on a tiny model every tree size the controller uses is priced within 1.3x of
a fresh calibration, and trees above 2 nodes are chosen again.

The machine running the tests is shared and noisy: the daemon and the references run on one thread,
prices are the low quantile the estimator uses, the references take many rounds, and a size passes
when it is within 1.3x of the two fresh calibrations (before and after the daemon's run) or between them."""

import asyncio
import time

import pytest
import torch

from completiond.core import budget as B
from completiond.service.client import Client
from daemon_util import daemon_status, start_daemon, stop_daemon

import tiny

COMPLETIONS = 200
TOL = 1.3
ROUNDS = 8  # rounds of a reference calibration ...
REPEATS = 8  # ... and how many of them (many: the machine is shared)


@pytest.fixture(scope="module")
def reference(tiny_dir):
    """The tiny target loaded as the daemon loads it (one thread), and its reference calibrations."""
    from completiond.core.engine import Engine
    from completiond.models import load

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield Engine(load(str(tiny_dir), "target", "cpu", "float32", "auto"), None)
    finally:
        torch.set_num_threads(threads)


def calibrate(engine, sizes) -> dict[int, float]:
    """A fresh calibration at the context the daemon's prompts have (a pass costs more on a longer
    cache), spread over a few seconds as the daemon's passes are (a busy second hits one repeat):
    per size the lower quartile of REPEATS calibrations of ROUNDS rounds."""
    context = len(engine.target.tokenizer.encode(document()))
    runs = []
    for _ in range(REPEATS):
        with engine.lock:
            runs.append(B.measure_costs(engine.runner, tuple(sorted(sizes)), context=context, rounds=ROUNDS))
        time.sleep(0.3)
    return {n: B.quantile([r[n] for r in runs], 0.25) for n in sizes}


def document() -> str:
    return "\n".join((tiny.STDLIB / "textwrap.py").read_text().splitlines()[60:90]) + "\n"


async def complete_many(sock, n: int, on_half) -> None:
    c = await Client.connect(sock)
    await c.request("initialize", {"client": "test", "protocol": 1, "workspace_roots": []})
    text = document()
    lines = text.splitlines()
    uri = "file:///w/t.py"
    await c.request("document/open", {"uri": uri, "text": text, "version": 1, "language_id": "python"})
    starts = [i for i, line in enumerate(lines) if line.strip()]
    for k in range(n):
        line = starts[(k * 7) % len(starts)]
        col = len(lines[line]) - len(lines[line].lstrip())
        await asyncio.wait_for(c.request("complete", {"uri": uri, "position": {"line": line, "character": col},
                                                       "max_tokens": 16, "mode": "combined"}), 120)
        if k + 1 == n // 2:
            on_half()
    await c.close()


CASES = {"3x": lambda n: 3.0, "3x above 2": lambda n: 3.0 if n > 2 else 1.0, "1/3x": lambda n: 1 / 3}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_wrong_cached_table_heals_in_a_real_daemon(case, reference, tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("COMPLETIOND_CACHE", str(tmp_path / "cache"))
    before = calibrate(reference, B.QUICK_SIZES)
    path = B.calibration_path(reference.target)  # the daemon's: same model, dtype, threads, CPU
    factor = CASES[case]
    B.save_costs(path, {n: ms * factor(n) for n, ms in before.items()},
                 {"measured_at": time.time(), "loadavg": 0.0, "others_busy": 0.0})
    sock = tmp_path / "d.sock"
    proc = start_daemon(sock, tiny_dir, env={"COMPLETIOND_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"})
    try:
        st = daemon_status(sock)["pass_costs"]
        assert st["origin"] == "cached" and st["age_s"] is not None
        assert {e["source"] for e in st["sizes"].values()} == {"cached"}
        assert st["sizes"]["4"]["ms"] == pytest.approx(before[4] * factor(4), rel=0.01)
        half = {}
        await complete_many(sock, COMPLETIONS, lambda: half.update(daemon_status(sock)["pass_costs"]["sizes"]))
        end = daemon_status(sock)["pass_costs"]
    finally:
        assert stop_daemon(proc) == 0
    used = {int(n): e for n, e in end["sizes"].items() if e["passes"] >= B.WINDOW // 2}  # the sizes it runs
    after = calibrate(reference, set(used) | set(B.QUICK_SIZES))
    report = {n: (e["ms"], round(before.get(n, B._interpolate(sorted(before.items()), n)), 2),
                  round(after[n], 2), e["source"], e["passes"], e["probes"]) for n, e in sorted(used.items())}
    print(case, "size: (estimate, fresh before, fresh after, source, passes, probes)", report)
    for n, e in used.items():
        refs = [after[n], B._interpolate(sorted(before.items()), n)]
        assert e["source"] == "observed", (n, report)
        assert min(refs) / TOL <= e["ms"] <= max(refs) * TOL, (case, n, report)
    # trees above 2 nodes chosen by the controller (not probes) in the second half of the run
    chosen = {n: e["passes"] - e["probes"] - (half.get(n, {}).get("passes", 0) - half.get(n, {}).get("probes", 0))
              for n, e in end["sizes"].items()}
    assert sum(v for n, v in chosen.items() if int(n) > 2) > 0, (case, chosen)
