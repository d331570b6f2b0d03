"""The tree-size controller (core/speculation/budget.py): costs per exact tree size that follow this machine both
ways (issue 44). Synthetic timings: deterministic."""

import itertools
import json
import time

import pytest
import tiny

from completiond.core.speculation import budget as B
from completiond.core.speculation import gate as G
from completiond.core.speculation import calibration as C
from completiond.models import device
from completiond.core.speculation.budget import PRIOR_WEIGHT, PROBE_AFTER, PROBE_SHARE, TreeBudget

# a pass's true cost by tree size (ms): flat to 4 nodes, then growing (the shape of a calibrated CPU table)
TRUE = {1: 20.0, 2: 21.0, 3: 24.0, 4: 25.0, 8: 42.0, 16: 98.0, 64: 400.0}


CLOCK = itertools.count(1_000_000, 2)  # synthetic time: a pass every 2 s (no two share a horizon)


def observe(b: TreeBudget, n: int, ms: float) -> None:
    b.observe_pass(n, ms, now=next(CLOCK))


def true_cost(n: int) -> float:
    return B._interpolate(sorted(TRUE.items()), n)


def budget(costs: dict[int, float], source: str = "calibrated") -> TreeBudget:
    b = TreeBudget()
    b.load_costs(costs, source)
    return b


# a best-first tree's path values: good guesses, worth verifying 4-8 nodes at the true costs
VALUES = [1.0, 0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05, 0.02, 0.01, 0.01, 0.01]


def run(b: TreeBudget, trees: int, cost=true_cost, values=VALUES) -> list[tuple[int, bool]]:
    """The controller on `trees` trees whose passes take `cost(n)`: (size run, was it a probe)."""
    sizes = []
    for _ in range(trees):
        n = b.best_size(values) + 1
        probe = b._probing is not None
        observe(b, n, cost(n))
        sizes.append((n, probe))
    return sizes


def test_an_observed_size_is_used_exactly_not_interpolated():
    # the AVX2 kernel's shape: 3 nodes cost what 4 do (calibrated at powers of two only)
    b = budget({1: 40.0, 2: 40.0, 4: 58.0, 8: 95.0})
    assert b.cost(3) == 49.0  # interpolated until 3-node passes are seen
    observe(b, 3, 58.0)
    assert b.cost(3) == 49.0  # the interpolation counts as one pass: the faster of the two
    observe(b, 3, 58.0)
    assert b.cost(3) == 58.0 and b.cost(4) == 58.0 and b.cost(2) == 40.0
    assert b.cost(6) == 58.0 + (95.0 - 58.0) / 2  # sizes not seen still interpolate between neighbours


def test_the_controller_does_not_pay_for_a_node_that_costs_like_two():
    values = [1.0, 0.9, 0.5, 0.3]  # root, then the best-first candidates' path probabilities
    b = budget({1: 40.0, 2: 40.0, 4: 58.0})
    assert b.best_size(values) == 2  # believes 3 nodes cost 49: (1 + 0.9 + 0.5) / 49 beats 1.9 / 40
    observe(b, 3, 58.0)
    observe(b, 3, 58.0)
    assert b.best_size(values) == 1  # 2.4 / 58 and 2.7 / 58 both lose to 1.9 / 40


def test_one_slow_pass_moves_nothing_a_bad_minute_is_followed_both_ways():
    b = budget({1: 40.0, 2: 40.0, 4: 58.0, 8: 95.0})
    observe(b, 2, 10_000.0)  # one pass hit by a burst of load elsewhere
    assert b.cost(2) == 40.0
    for _ in range(3):
        observe(b, 2, 40.0)
    observe(b, 2, 10_000.0)
    assert b.cost(2) == 40.0
    for _ in range(B.WINDOW):  # a bad minute: every pass 3x (a pass every 2 s)
        observe(b, 2, 120.0)
    assert b.cost(2) == 120.0  # the machine is slower now: the estimate says so
    for i in range(1, 5):  # ... and back: a few quiet passes bring it down again
        observe(b, 2, 40.0)
        assert b.cost(2) == (40.0 if i == 4 else 120.0)
    observe(b, 5, 10_000.0)  # first sight of a size: a slow pass does not set it
    assert b.cost(5) == 58.0 + (95.0 - 58.0) / 4


def test_a_prior_gives_way_to_real_passes_both_ways():
    for factor in (3.0, 1 / 3):
        b = budget({n: ms * factor for n, ms in TRUE.items()}, "cached")
        assert b.table_status()["sizes"]["4"]["source"] == "cached"
        for i in range(PRIOR_WEIGHT):
            observe(b, 4, TRUE[4])
        assert b.cost(4) == TRUE[4]
        st = b.table_status()["sizes"]["4"]
        assert st["source"] == "observed" and st["passes"] == PRIOR_WEIGHT and st["prior_ms"] == round(TRUE[4] * factor, 2)


def test_inflated_and_deflated_tables_heal_and_big_trees_come_back():
    """The issue's table: sizes above 2 priced at 3x (a bad minute), or everything at 3x or 1/3x:
    within a few hundred trees every size the controller runs costs what it truly does, and trees
    above 2 nodes are chosen again (not only probed)."""
    fresh = run(budget(TRUE), 400)
    fresh_sizes = {n for n, probe in fresh[200:] if not probe}
    assert max(fresh_sizes) > 2
    tables = {"3x above 2": {n: ms * (3 if n > 2 else 1) for n, ms in TRUE.items()},
              "3x": {n: ms * 3 for n, ms in TRUE.items()}, "1/3x": {n: ms / 3 for n, ms in TRUE.items()}}
    for name, table in tables.items():
        b = budget(table, "cached")
        ran = run(b, 400)
        used = {n for n, _ in ran}
        for n in used:
            assert abs(b.cost(n) / true_cost(n) - 1) < 1e-9, (name, n, b.cost(n))
        chosen = {n for n, probe in ran[300:] if not probe}
        assert chosen == fresh_sizes, (name, chosen, fresh_sizes)


def test_the_issues_table_stops_switching_speculation_off():
    # the daemon's cached 0.5B table from issue 44 against the quiet calibration of the same machine
    cached = {1: 36.5, 2: 39.4, 3: 80.6, 4: 93.0, 8: 137.4, 16: 305.3}
    quiet = {1: 19.5, 2: 21.2, 3: 24.7, 4: 24.7, 8: 41.8, 16: 97.7}
    cost = lambda n: B._interpolate(sorted(quiet.items()), n)  # noqa: E731
    values = [1.0, 0.8, 0.6, 0.45, 0.3, 0.2, 0.1, 0.05]
    b = budget(cached, "cached")
    assert b.best_size(values) + 1 <= 2  # priced out: as the issue found
    ran = run(b, 600, cost, values)
    assert max(n for n, probe in ran[-100:] if not probe) > 2
    for n in {n for n, _ in ran}:
        assert b.cost(n) == cost(n)


def test_probes_reach_priced_out_sizes_within_their_share_of_time():
    b = budget({n: ms * (3 if n > 2 else 1) for n, ms in TRUE.items()}, "cached")
    values = [1.0] + [0.9 ** i for i in range(1, 64)]  # trees that reach every size
    ran = run(b, 3000, true_cost, values)
    probes = [n for n, probe in ran if probe]
    assert {16, 64} <= set(probes)  # not only 2 or 4
    # what the probes cost beyond the size the controller would have run, at most their share
    plain = TreeBudget()
    plain.load_costs(TRUE)
    best = plain.best_size(values) + 1
    extra = sum(max(0.0, true_cost(n) - true_cost(best)) for n in probes)
    total = sum(true_cost(n) for n, _ in ran)
    assert extra <= 2 * PROBE_SHARE * total
    # a size run within the last PROBE_AFTER passes is not probed again
    for i, (n, probe) in enumerate(ran):
        if probe:
            assert all(m != n for m, _ in ran[max(0, i - PROBE_AFTER):i]), (i, n)


def test_no_probe_without_candidates_or_when_always():
    b = budget(TRUE)
    for _ in range(500):
        assert b.best_size([1.0]) == 0
        observe(b, 1, 20.0)
    b.always = True
    assert b.best_size([1.0, 0.1, 0.1]) == 2


def test_a_cached_table_is_measured_again_when_old_or_measured_under_load():
    now = time.time()
    fresh = {"measured_at": now - 60, "loadavg": 0.3, "others_busy": 0.02}
    assert C.stale_reason(fresh, 0.0, now) is None
    old = {**fresh, "measured_at": now - C.MAX_AGE_S - 1}
    assert "days old" in C.stale_reason(old, 0.05, now)
    loaded = {**fresh, "others_busy": 0.9}
    assert "busy elsewhere" in C.stale_reason(loaded, 0.05, now)
    assert C.stale_reason(loaded, 0.8, now) is None  # still loaded: measuring would measure the load
    assert C.stale_reason({"measured_at": None}, 0.0, now) == "the cached table has no date"


def test_the_cache_keeps_when_and_under_what_load_a_table_was_measured(tmp_path):
    path = tmp_path / "c.json"
    meta = {"measured_at": 123.0, "loadavg": 1.5, "others_busy": 0.4, "origin": "x"}
    C.save_costs(path, {1: 20.0, 4: 25.0}, meta, {"1": "observed", "4": "calibrated"})
    costs, got = C.load_table(path)
    assert costs == {1: 20.0, 4: 25.0} and got == {"measured_at": 123.0, "loadavg": 1.5, "others_busy": 0.4}
    assert json.loads(path.read_text())["sources"] == {"1": "observed", "4": "calibrated"}
    path.write_text(json.dumps({"costs": {"1": 36.5, "2": 39.4}}))  # a file from before issue 44
    assert C.load_table(path) == ({1: 36.5, 2: 39.4}, {"measured_at": None, "loadavg": None, "others_busy": None})
    path.write_text("{not json")
    assert C.load_table(path) is None


def test_others_busy_is_a_share():
    share = device.quiet_now(0.05)
    assert share is None or 0.0 <= share <= 1.0


def test_a_cpu_measurement_taken_under_load_is_not_cached(tmp_path, monkeypatch):
    """A kernel or dtype choice measured while other processes held the CPUs decides for this
    process only; the next one measures again, and a quiet measurement is kept for good."""
    monkeypatch.setenv("COMPLETIOND_CACHE", str(tmp_path))
    calls = []

    def measure() -> dict:
        calls.append(1)
        return {"fast": len(calls) > 1, "ms": 1.0}

    monkeypatch.setattr(device.OthersBusy, "share", lambda self: 0.9)
    assert device.calibrated("probe-test", measure, ("fast",)) == {"fast": False}
    assert not list(tmp_path.rglob("probe-test*"))
    monkeypatch.setattr(device.OthersBusy, "share", lambda self: 0.05)
    assert device.calibrated("probe-test", measure, ("fast",)) == {"fast": True}
    assert device.calibrated("probe-test", measure, ("fast",)) == {"fast": True}
    assert len(calls) == 2
    [path] = tmp_path.rglob("probe-test*")
    assert json.loads(path.read_text())["others_busy"] == 0.05


def test_a_burst_of_slow_passes_in_one_second_does_not_flush_the_window():
    b = budget({2: 40.0})
    for i in range(B.WINDOW):
        b.observe_pass(2, 40.0, now=100.0 + i * 0.1)
    for i in range(3 * B.WINDOW):  # a busy second: many passes, all slow
        b.observe_pass(2, 400.0, now=104.0 + i * 0.01)
    assert b.cost(2) == 40.0
    for i in range(B.WINDOW):  # the machine stays slow past the horizon: the estimate follows
        b.observe_pass(2, 400.0, now=104.0 + B.HORIZON_S + i)
    assert b.cost(2) == 400.0


def test_step_gate_keeps_the_faster_arm_and_probes_the_other():
    """A costly proposer runs while its steps cost fewer ms per emitted token than steps without it:
    both arms are measured in turn first, then the slower one only on probes, further apart while
    probes find it slower (PROBE, 2 PROBE, ... up to MAX_PROBE steps), and a change in which is
    faster is followed: a probe that pays brings the next one after PROBE steps (synthetic timings)."""
    g = G.StepGate()
    # warm-up: the arms alternate until each has WARM steps
    first = []
    for _ in range(2 * g.WARM):
        ran = g.allows()
        first.append(ran)
        g.record(ran, 100.0 if ran else 60.0, 1)  # with: 100 ms per token, without: 60
    assert first.count(True) == first.count(False) == g.WARM
    # the proposer costs more per token: it runs only on probes
    ran = []
    for _ in range(16 * g.PROBE):
        ran.append(g.allows())
        g.record(ran[-1], 100.0 if ran[-1] else 60.0, 1)
    probes = [i + 1 for i, r in enumerate(ran) if r]  # after 8, then 16, 32, 64, 64 more steps
    assert [b - a for a, b in zip([0] + probes, probes)] == [8, 16, 32, 64]
    assert g.every == g.MAX_PROBE
    # it gets good (a long accepted run per step): within a few probes it runs every time
    asked = 0
    while g.ms_per_token(True) >= g.ms_per_token(False):
        r = g.allows()
        g.record(r, 120.0 if r else 60.0, 4 if r else 1)  # with: 30 ms per token
        asked += 1
        assert asked < g.MAX_PROBE + 4 * g.PROBE
    assert all(g.allows() for _ in range(20))
    s = g.status()
    assert s["ms_per_token_with"] < s["ms_per_token_without"]


def test_step_gate_state_round_trips_and_damage_is_no_state(tmp_path):
    """A gate's state (estimates, arms measured, probe interval) comes back as it was, with an arm
    measured at least WARM steps counted as warmed up; a damaged or foreign file is no state."""
    g = G.StepGate()
    for i in range(2 * g.WARM + 3 * g.PROBE):
        ran = g.allows()
        g.record(ran, 100.0 if ran else 60.0, 2)
    back = G.StepGate.restore(json.loads(json.dumps(g.state())))
    assert back.restored and not g.restored
    assert back.ms_per_token(True) == g.ms_per_token(True) and back.ms_per_token(False) == g.ms_per_token(False)
    assert back.every == g.every > g.PROBE and back.steps == {True: g.WARM, False: g.WARM}
    assert not any(back.allows() for _ in range(back.every - 1))  # no warm-up: the next run is a probe
    for bad in ({}, {"ms": {"with": 1.0}}, {**g.state(), "tokens": {"with": 0.0, "without": 1.0}}, "x"):
        with pytest.raises(ValueError):
            G.StepGate.restore(bad)
    path = tmp_path / "g.gates.json"
    G.save_gates(path, "draft-a", {"draft": g})
    G.save_gates(path, "draft-b", {"draft": G.StepGate()})  # another draft's gates are kept beside
    assert G.load_gates(path, "draft-a")["draft"].every == g.every
    assert G.load_gates(path, "draft-c") == {}
    path.write_text("{not json")
    assert G.load_gates(path, "draft-a") == {}


def _measured_gate(with_ms: float, without_ms: float, steps: int) -> G.StepGate:
    """A gate after `steps` decisions, its proposer's steps costing with_ms, the others without_ms (2 tokens each)."""
    g = G.StepGate()
    for _ in range(steps):
        ran = g.allows()
        g.record(ran, with_ms if ran else without_ms, 2)
    return g


def test_a_draft_measured_slower_here_is_not_loaded_until_its_verdict_ages(tmp_path):
    """`slower_draft`: a kept gate whose warm-up and every probe since found the draft dearer per
    token (interval at MAX_PROBE) says why not to load it, for any dtype of that draft, until
    MAX_AGE_S after its last step with it; a draft that paid, one still deciding, one measured long
    ago or never, an older state without a date, another draft and a damaged file say nothing."""
    path = tmp_path / "t.gates.json"
    assert G.slower_draft(path, "qwen2.5-coder-0.5b") is None  # never measured
    slow = _measured_gate(100.0, 60.0, 200)
    assert slow.every == slow.MAX_PROBE and slow.measured_at is not None
    G.save_gates(path, "qwen2.5-coder-0.5b|torch.bfloat16|int8", {"draft": slow})
    why = G.slower_draft(path, "qwen2.5-coder-0.5b")
    assert why and "50 against 30 ms" in why and "0 hours ago" in why
    assert G.slower_draft(path, "qwen2.5-coder-1.5b") is None  # another draft
    later = slow.measured_at + C.MAX_AGE_S + 1
    assert G.slower_draft(path, "qwen2.5-coder-0.5b", now=later) is None  # measured again after a week
    assert "6 days ago" in G.slower_draft(path, "qwen2.5-coder-0.5b", now=slow.measured_at + 6 * 86400)
    deciding = _measured_gate(100.0, 60.0, 30)  # slower so far, probes not yet at their longest interval
    assert deciding.every < deciding.MAX_PROBE
    G.save_gates(path, "qwen2.5-coder-0.5b|torch.bfloat16|int8", {"draft": deciding})
    assert G.slower_draft(path, "qwen2.5-coder-0.5b") is None
    G.save_gates(path, "qwen2.5-coder-0.5b|torch.bfloat16|int8", {"draft": _measured_gate(40.0, 60.0, 200)})
    assert G.slower_draft(path, "qwen2.5-coder-0.5b") is None  # it pays
    undated = slow.state()
    del undated["measured_at"]  # a gate kept before this field
    path.write_text(json.dumps({"qwen2.5-coder-0.5b|torch.bfloat16|int8": {"draft": undated}}))
    assert G.StepGate.restore(undated).measured_at is None and G.slower_draft(path, "qwen2.5-coder-0.5b") is None
    path.write_text("[1, 2")
    assert G.slower_draft(path, "qwen2.5-coder-0.5b") is None


def test_a_default_draft_measured_slower_stays_unloaded(tmp_path, monkeypatch):
    """`draft_for`: the target's default draft is not loaded where its kept gate says it is slower
    here (the label says why and how to load it); a draft named by the user, or one that paid, is."""
    import completiond.models.loader as M
    from completiond.core import engine as E

    monkeypatch.setenv("COMPLETIOND_CACHE", str(tmp_path))
    target = tiny.loaded(tiny.gemma_config(window=16, layers=2), seed=1)
    loads = []
    monkeypatch.setattr(M, "default_draft", lambda t: "tiny-draft")
    monkeypatch.setattr(M, "load_draft", lambda spec, t: loads.append(spec) or "a draft")
    path = G.gates_path(target)
    G.save_gates(path, "tiny-draft|torch.float32|", {"draft": _measured_gate(100.0, 60.0, 200)})
    draft, why = E.draft_for("default", target)
    assert draft is None and loads == [] and "tiny-draft measured slower here" in why
    label = M.draft_label("default", None, target, why)
    assert label.startswith("none (tiny-draft measured slower") and "--draft tiny-draft loads it" in label
    assert E.draft_for("tiny-draft", target) == ("a draft", None) and loads == ["tiny-draft"]
    G.save_gates(path, "tiny-draft|torch.float32|", {"draft": _measured_gate(40.0, 60.0, 200)})
    assert E.draft_for("default", target) == ("a draft", None) and loads == ["tiny-draft", "default"]


def test_useful_nodes_is_the_size_that_pays_when_every_node_is_accepted():
    """A costly proposer grows no more nodes than a verify pass of certain nodes would keep: with
    the 1.5B's table from a 2-core run (ms by size), 4 nodes past the root; where more nodes cost
    nothing, all of them; never more than a tree whose best_size is larger."""
    b = TreeBudget(max_nodes=64)
    b.load_costs({1: 49.5, 4: 80.6, 5: 84.5, 8: 147.7, 16: 335.1})
    assert b.useful_nodes() == 4
    assert b.best_size([1.0] * 20) <= 4  # the controller cuts a certain chain there too
    flat = TreeBudget(max_nodes=16)
    flat.load_costs({1: 10.0, 64: 10.0})
    assert flat.useful_nodes() == 16
    steep = TreeBudget(max_nodes=64)
    steep.load_costs({1: 10.0, 2: 30.0, 8: 200.0})  # a second node costs two passes
    assert steep.useful_nodes() == 0
    assert TreeBudget(max_nodes=8, always=True).useful_nodes() == 8


def test_a_kernel_change_starts_a_new_calibration_table(monkeypatch):
    """A table is worth what its kernel made the passes cost: a changed kernel build (the same kind's
    name) reads and writes another file, so a daemon after an upgrade measures afresh."""
    import types

    import torch
    from completiond.models.kernels import cpu_kernel

    target = types.SimpleNamespace(device=torch.device("cpu"), name="qwen2.5-coder-0.5b", dtype=torch.bfloat16,
                                   meta={"quant": "int8"})
    monkeypatch.setattr(cpu_kernel, "build_id", lambda: "aaaa")
    first = C.calibration_path(target)
    assert C.calibration_path(target) == first
    monkeypatch.setattr(cpu_kernel, "build_id", lambda: "bbbb")
    assert C.calibration_path(target) != first
    assert G.gates_path(target).stem.startswith(C.calibration_path(target).stem)


def test_a_draft_is_not_asked_where_even_a_perfect_draft_would_not_pay():
    """`could_pay`: each draft pass adds at most one accepted token, and prompt lookup's own guess
    saves its path values already. The 1.5B's 2-core numbers (pass 49.5 ms, the 0.5B's step 17 ms,
    a node 14 ms, 4 useful nodes): with nothing found it could pay; beside a long confident prompt
    lookup candidate (expected 3+ tokens of 4) it cannot, whatever its acceptance; a draft whose
    pass costs a target pass never can; one not measured yet (step 0) may run."""
    from completiond.core.speculation.tree import Candidate

    long_pld = [Candidate(list(range(16)), [0.8] * 16, "pld")]
    short_pld = [Candidate([7], [0.3], "pld")]
    assert G.could_pay([], 4, 17.0, 49.5, 14.0)
    assert G.could_pay(short_pld, 4, 17.0, 49.5, 14.0)  # 3.7 passes to win, 4 x 31 ms to pay
    assert not G.could_pay(long_pld, 4, 17.0, 49.5, 14.0)  # 0.8 + 0.64 + ... = 3.9 saved already
    assert not G.could_pay([], 4, 49.5, 49.5, 0.0)  # as dear as the pass it would save
    assert G.could_pay(long_pld, 4, 0.0, 49.5, 14.0)
    assert G.could_pay([], 0, 30.0, 49.5, 0.0) and not G.could_pay([], 0, 60.0, 49.5, 0.0)  # depth 0: one pass
    assert G._path_value([0.5, 0.5]) == 0.75


def test_the_first_proposal_measured_is_the_level_estimate():
    """`StepGate.level_ms` starts at the first proposal's cost, not a fifth of it (an Ewma from 0 would
    price a dear draft as cheap for its next few proposals, which `could_pay` would then let run)."""
    g = G.StepGate()
    g.observe_level(100.0)
    assert g.level_ms.value == 100.0
    g.observe_level(50.0)
    assert 50.0 < g.level_ms.value < 100.0
    g.record(True, 30.0, 2)
    g.record(False, 10.0, 1)  # kept across starts with the gate
    assert G.StepGate.restore(g.state()).level_ms.value == g.level_ms.value
