"""Pass costs heal in a real daemon (issue 44): a table installed in its calibration cache at 3x or
1/3x the true costs (or 3x above 2 nodes only, the shape the issue found) is only a starting point:
within 200 completions on a tiny model every tree size the controller uses is priced within 1.3x of
a fresh calibration, and trees above 2 nodes are chosen again.

The machine running the tests is shared and noisy, and on a tiny model a pass inside a daemon costs
more than the same pass in a calibration loop (its ~1.5 ms are mostly Python, shared with the event
loop's thread). So the fresh calibration is taken the way the daemon prices real passes: a second
daemon, started from a fresh calibration of this machine, serves the same completions alternately
with the one started from the wrong table (one request each, in turn: both see the same load), and
the wrong one's estimates must come within 1.3x of the span of the right one's and the calibration
loop's (each alone is noisy: 1.13-1.8 ms for the same pass in one CI run), and nearer them than the
wrong start. Both run on one thread."""

import asyncio
import time

import pytest
import torch

from completiond.core.speculation import budget as B
from completiond.core.speculation import calibration as C
from completiond.service.client import Client
from daemon_util import daemon_status, start_daemon, stop_daemon

import tiny

COMPLETIONS = 200
TOL = 1.3


@pytest.fixture(scope="module")
def reference(tiny_dir):
    """The tiny target loaded as the daemon loads it (one thread: the calibration cache's key)."""
    from completiond.core.engine import Engine
    from completiond.models.loader import load

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield Engine(load(str(tiny_dir), "target", "cpu", "float32", "auto"), None)
    finally:
        torch.set_num_threads(threads)


def document() -> str:
    return "\n".join((tiny.STDLIB / "textwrap.py").read_text().splitlines()[60:90]) + "\n"


async def complete_alternately(socks, n: int, on_half) -> None:
    """n completions at line starts on each daemon, one request each in turn; each in a new document
    (a counter on top), so none is served from a daemon's memory of an earlier one."""
    clients = [await Client.connect(s) for s in socks]
    for c in clients:
        await c.request("initialize", {"client": "test", "protocol": 1, "workspace_roots": []})
    lines = document().splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip()]
    for k in range(n):
        uri = f"file:///w/t{k}.py"
        line = starts[(k * 7) % len(starts)]
        col = len(lines[line]) - len(lines[line].lstrip())
        for c in clients:
            await c.request("document/open", {"uri": uri, "text": f"# {k}\n" + document(), "version": 1,
                                              "language_id": "python"})
            await asyncio.wait_for(c.request("complete", {"uri": uri, "position": {"line": line + 1, "character": col},
                                                           "max_tokens": 16, "mode": "combined"}), 120)
            await c.request("document/close", {"uri": uri})
        if k + 1 == n // 2:
            on_half()
    for c in clients:
        await c.close()


CASES = {"3x": lambda n: 3.0, "3x above 2": lambda n: 3.0 if n > 2 else 1.0, "1/3x": lambda n: 1 / 3}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_wrong_cached_table_heals_in_a_real_daemon(case, reference, tiny_dir, tmp_path, monkeypatch):
    with reference.lock:
        fresh = C.measure_costs(reference.runner, B.QUICK_SIZES, rounds=8)
    factor = CASES[case]
    procs, socks = [], []
    try:
        for name, f in (("right", lambda n: 1.0), ("wrong", factor)):
            cache = tmp_path / name / "cache"
            monkeypatch.setenv("COMPLETIOND_CACHE", str(cache))
            C.save_costs(C.calibration_path(reference.target),  # the daemon's: same model, dtype, threads, CPU
                         {n: ms * f(n) for n, ms in fresh.items()},
                         {"measured_at": time.time(), "loadavg": 0.0, "others_busy": 0.0})
            socks.append(tmp_path / name / "d.sock")
            procs.append(start_daemon(socks[-1], tiny_dir, env={"COMPLETIOND_CACHE": str(cache), "OMP_NUM_THREADS": "1"}))
        for sock in socks:
            st = daemon_status(sock)["pass_costs"]
            assert st["origin"] == "cached" and st["age_s"] is not None
            assert {e["source"] for e in st["sizes"].values()} == {"cached"}
        assert daemon_status(socks[1])["pass_costs"]["sizes"]["4"]["ms"] == pytest.approx(fresh[4] * factor(4), rel=0.01, abs=0.006)  # status rounds to 0.01 ms
        half = {}
        await complete_alternately(socks, COMPLETIONS,
                                   lambda: half.update(daemon_status(socks[1])["pass_costs"]["sizes"]))
        right, wrong = (daemon_status(s)["pass_costs"]["sizes"] for s in socks)
    finally:
        for p in procs:
            assert stop_daemon(p) == 0
    # the sizes the wrong-started daemon runs, that the right-started one has real passes of too
    used = {n: e for n, e in wrong.items() if e["passes"] >= B.WINDOW // 2 and n in right
            and right[n]["passes"] >= B.WINDOW // 2}
    report = {n: (e["ms"], right[n]["ms"], round(fresh.get(int(n), 0.0), 2), e["source"], e["passes"], e["probes"])
              for n, e in sorted(used.items(), key=lambda x: int(x[0]))}
    print(case, "size: (estimate, from a fresh table, fresh calibration, source, passes, probes)", report)
    assert len(used) >= 3, report
    for n, e in used.items():
        assert e["source"] == "observed", (n, report)
        # two honest prices of the same pass (the right-started daemon's and a calibration loop's)
        # differ by up to 1.6x on a busy CI machine; the healed one must lie within 1.3x of their span
        honest = [right[n]["ms"]] + ([fresh[int(n)]] if fresh.get(int(n)) else [])
        assert min(honest) / TOL <= e["ms"] <= max(honest) * TOL, (case, n, report)
        start = fresh.get(int(n), right[n]["ms"]) * factor(int(n))
        if factor(int(n)) != 1.0:  # and nearer the honest prices than where it started
            assert abs(e["ms"] - right[n]["ms"]) < abs(start - right[n]["ms"]), (case, n, start, report)
    # trees above 2 nodes chosen by the controller (not probes) in the second half of the run
    chosen = {n: e["passes"] - e["probes"] - (half.get(n, {}).get("passes", 0) - half.get(n, {}).get("probes", 0))
              for n, e in wrong.items()}
    assert sum(v for n, v in chosen.items() if int(n) > 2) > 0, (case, chosen)
