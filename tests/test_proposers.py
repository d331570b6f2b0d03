"""The draft proposer's tree: every node's children are the draft's own top tokens after its path."""

import time
import types

import pytest
import torch

import tiny
from completiond.core.speculation.proposers import DraftModel, Limits

# What a tiny target's pass costs here, ms by tree size: the tree budget and the draft gate decide on
# these, not on a calibration and step times that others' work on a loaded machine moves (a 1 ms step
# taking 20 ms made a draft slowed by 60 ms look as if it paid).
PASS_MS = {1: 1.0, 4: 1.1, 16: 1.4, 64: 2.6}


class PassClock:
    """The engine's clock in the tests that price its work: a target pass advances it by its PASS_MS,
    a slow draft's proposal by what the test `spend`s, however long the machine takes for them."""

    def __init__(self) -> None:
        self.ms = 0.0

    def perf_counter(self) -> float:
        return self.ms / 1000

    def spend(self, ms: float) -> None:
        self.ms += ms


def priced(engine, monkeypatch) -> PassClock:
    """Price `engine`'s target passes at PASS_MS: its tree budget holds PASS_MS (real passes move
    nothing) and its steps, the gate's records, are timed on the PassClock returned."""
    clock = PassClock()
    monkeypatch.setattr("completiond.core.engine.time", types.SimpleNamespace(perf_counter=clock.perf_counter,
                                                                               time=time.time))
    engine.budget.load_costs(PASS_MS)
    engine.budget.observe_pass = lambda n, ms, now=None: None
    run_pass = engine.runner.run_pass

    def run(tokens, *a, **k):
        clock.spend(engine.budget.cost(len(tokens)))
        return run_pass(tokens, *a, **k)
    engine.runner.run_pass = run
    return clock


def reference_top(lm, ids: list[int], k: int) -> tuple[list[int], list[float]]:
    with torch.inference_mode():
        logits = lm.model(torch.tensor([ids])).logits[0, -1].float()
    q, top = torch.softmax(logits, -1).topk(k)
    return top.tolist(), q.tolist()


@pytest.mark.parametrize("branch", [1, 3])
def test_draft_tree_nodes_are_top_tokens_of_their_paths(branch, code_ids):
    lm = tiny.loaded(tiny.gemma_config(window=8, layers=2), seed=3, scale=4.0)
    draft = DraftModel(lm, branch=branch, top=2)
    context = code_ids[:30]  # longer than the window: the tree's passes must mask by position
    passes = []
    run_pass = draft.runner.run_pass
    draft.runner.run_pass = lambda *a, **kw: passes.append(len(a[0])) or run_pass(*a, **kw)
    cands = draft.propose(context, Limits(max_len=4, min_value=0.0))
    children: dict[tuple, set] = {}
    prob: dict[tuple, float] = {}
    for c in cands:
        assert c.source == "draft" and 1 <= len(c.tokens) <= 4
        for d in range(len(c.tokens)):
            children.setdefault(tuple(c.tokens[:d]), set()).add(c.tokens[d])
            prob[tuple(c.tokens[:d + 1])] = c.probs[d]
    for path, kids in children.items():
        top, q = reference_top(lm, context + list(path), 2)
        assert kids == set(top), f"children of {path}"
        for t, qt in zip(top, q):
            assert prob[path + (t,)] == pytest.approx(qt, abs=1e-5)  # uncalibrated: c = 1 at start
    # one pass for the context, then at most max_len - 1 passes of at most `branch` nodes
    assert len(passes) - 1 <= 3 and all(n <= branch for n in passes[1:])
    assert len(children) - 1 == sum(passes[1:])  # every fed node got its children
    if branch == 1:  # a greedy chain with one runner-up at each step
        chain = max(cands, key=lambda c: len(c.tokens)).tokens
        assert len(chain) == 4 and len(cands) == 5
    else:  # best-first: more than one path was grown past depth 1
        assert sum(len(k) for p, k in children.items() if len(p) == 1) >= 4
    # the next proposal after the tree starts from committed context only
    again = draft.propose(context, Limits(max_len=4, min_value=0.0))
    assert {tuple(c.tokens) for c in again} == {tuple(c.tokens) for c in cands}


def test_a_draft_that_does_not_pay_is_left_out_and_output_stays_identical(code_ids, monkeypatch):
    """The engine's StepGate: a draft whose proposals cost far more than the target passes they save
    (here: 60 ms added to each, beside passes of about a millisecond: PASS_MS) runs only while its two
    arms are measured and then on probes, every PROBE-th step it says it pays; the output is the
    target's greedy output all the same. A draft that guesses the target's own continuation at no
    cost keeps running."""
    from completiond.core.engine import Engine, Request
    from completiond.core.speculation.gate import StepGate
    from completiond.core.speculation.tree import Candidate
    from completiond.models.loader import self_draft

    monkeypatch.setattr("completiond.core.engine.could_pay", lambda *a: True)  # the gate alone decides
    target = tiny.loaded(tiny.gemma_config(window=16, layers=4), seed=1, scale=4.0)
    prompt = code_ids[40:80]
    ar = Engine(target).complete(Request(prompt=prompt, mode="ar", max_tokens=48)).token_ids
    for slow in (True, False):
        engine = Engine(target, self_draft(target, 2))
        clock = priced(engine, monkeypatch)
        engine.draft.pays = lambda *a, **k: True  # the gate alone decides
        propose = engine.draft.propose
        if slow:
            engine.draft.propose = lambda *a, **k: clock.spend(60) or propose(*a, **k)
        else:  # an oracle: the rest of the target's greedy output after the context
            def oracle(context, limits, ctx=None):
                rest = ar[len(context) - len(prompt):][:limits.max_len]
                return [Candidate(rest, [0.9] * len(rest), "draft")] if rest else []
            engine.draft.propose = oracle
        for _ in range(3):
            assert engine.complete(Request(prompt=prompt, mode="draft", max_tokens=48)).token_ids == ar
        gate = engine.gates["draft"]
        asked = gate.steps[True] + gate.steps[False]
        if slow:
            assert gate.steps[True] <= StepGate.WARM + asked // StepGate.PROBE + 1
            assert gate.steps[False] > gate.steps[True]
        else:
            assert gate.steps[True] > gate.steps[False]


def test_a_returning_daemon_does_not_warm_up_its_gate_again(code_ids, tmp_path, monkeypatch):
    """The gates are kept beside the pass costs (`save_calibration`): an engine that reads those
    costs back (`calibrate_cached`, a daemon's start) starts from the gate an earlier one measured,
    so a draft found slower runs only on probes, not in the warm-up's turns; the output stays the
    target's. Another draft starts afresh."""
    from completiond.core.engine import Engine, Request
    from completiond.core.speculation.gate import StepGate
    from completiond.models.loader import self_draft

    monkeypatch.setenv("COMPLETIOND_CACHE", str(tmp_path))
    monkeypatch.setenv("COMPLETIOND_RECALIBRATE", "0")  # a table measured under load is kept (not re-measured)
    monkeypatch.setattr("completiond.core.engine.could_pay", lambda *a: True)  # the gate alone decides
    target = tiny.loaded(tiny.gemma_config(window=16, layers=4), seed=1, scale=4.0)
    prompt = code_ids[40:80]
    ar = Engine(target).complete(Request(prompt=prompt, mode="ar", max_tokens=48)).token_ids

    def slow_engine(layers: int = 2) -> tuple[Engine, str, list[bool]]:
        engine = Engine(target, self_draft(target, layers))
        how = engine.calibrate_cached()
        clock = priced(engine, monkeypatch)  # after the cached table and gates are read
        engine.draft.pays = lambda *a, **k: True  # the gate alone decides
        propose = engine.draft.propose
        engine.draft.propose = lambda *a, **k: clock.spend(60) or propose(*a, **k)
        decisions: list[bool] = []
        real = engine.gates.setdefault("draft", StepGate())
        allows = real.allows
        real.allows = lambda: decisions.append(allows()) or decisions[-1]
        return engine, how, decisions

    first, how, ran = slow_engine()
    assert how == "measured" and not first.gates["draft"].restored
    for _ in range(2):
        assert first.complete(Request(prompt=prompt, mode="draft", max_tokens=48)).token_ids == ar
    assert ran[:2 * StepGate.WARM].count(True) == StepGate.WARM  # a first start measures both arms
    first.save_calibration()
    second, how, ran = slow_engine()
    gate = second.gates["draft"]
    assert how == "cached" and gate.restored and gate.every == first.gates["draft"].every
    assert second.complete(Request(prompt=prompt, mode="draft", max_tokens=48)).token_ids == ar
    assert len(ran) >= StepGate.PROBE and not any(ran[:StepGate.PROBE - 1])
    other, how, _ = slow_engine(layers=1)  # a different draft: its own warm-up
    assert how == "cached" and not other.gates["draft"].restored


def test_the_gate_counts_only_the_tokens_a_completion_keeps(code_ids, monkeypatch):
    """A step that verifies tokens past the completion's end (a stop rule) is worth only those before
    it: the StepGate records the tokens the completion kept, else a draft that runs past the end of
    short completions would look cheaper per token than it is (docs/kernels.md "Round 16")."""
    from completiond.core.engine import Engine, Request
    from completiond.core.prompt.stops import StopRules
    from completiond.core.speculation.gate import StepGate
    from completiond.core.speculation.tree import Candidate
    from completiond.models.loader import self_draft

    target = tiny.loaded(tiny.gemma_config(window=16, layers=4), seed=1, scale=4.0)
    prompt = code_ids[40:80]
    ar = Engine(target).complete(Request(prompt=prompt, mode="ar", max_tokens=24))
    # a stop string the text reaches at its 4th token or later, first there
    at = next(i for i in range(3, len(ar.tokens)) if ar.tokens[i].strip()
              and ar.text.find(ar.tokens[i]) == len("".join(ar.tokens[:i])))
    stops = StopRules(line_rules=False, stop_strings=(ar.tokens[at],))
    engine = Engine(target, self_draft(target, 2))
    priced(engine, monkeypatch)  # a budget that keeps the oracle's long path
    engine.draft.pays = lambda *a, **k: True

    def oracle(context, limits, ctx=None):  # the target's own continuation, far past the stop
        rest = ar.token_ids[len(context) - len(prompt):][:limits.max_len]
        return [Candidate(rest, [0.99] * len(rest), "draft")] if rest else []
    engine.draft.propose = oracle
    recorded = []
    gate = engine.gates["draft"] = StepGate()
    record = gate.record
    gate.record = lambda ran, ms, tokens: recorded.append(tokens) or record(ran, ms, tokens)
    res = engine.complete(Request(prompt=prompt, mode="draft", max_tokens=24, stops=stops))
    assert res.token_ids == ar.token_ids[:at + 1]  # the stop's token ends it, as in `ar` under the same rule
    verified = round(res.mean_accepted * res.target_passes) + res.target_passes
    assert verified > len(res.token_ids) - 1  # the oracle's steps ran past the stop ...
    assert sum(recorded) == len(res.token_ids) - 1  # ... and the gate counted what the completion kept


def test_the_draft_grows_no_more_nodes_than_the_verify_pass_can_keep(code_ids):
    """Limits.max_nodes (the budget's useful_nodes): once the draft's tree holds that many nodes it
    runs no more passes, which a cut tree would waste; without the cap it grows the whole depth."""
    lm = tiny.loaded(tiny.gemma_config(window=8, layers=2), seed=3, scale=4.0)
    context = code_ids[:30]
    for cap, passes_run, depth in ((64, 8, 8), (3, 2, 2)):  # passes: the context's, then the tree's
        draft = DraftModel(lm, branch=1, top=2)
        passes = []
        run_pass = draft.runner.run_pass
        draft.runner.run_pass = lambda *a, **kw: passes.append(len(a[0])) or run_pass(*a, **kw)
        cands = draft.propose(context, Limits(max_len=8, min_value=0.0, max_nodes=cap))
        longest = max(len(c.tokens) for c in cands)
        assert len(passes) == passes_run and longest == depth


def test_prompt_lookup_values_an_alternative_below_the_candidate_ranked_before_it():
    """Only one token can follow a node, so a candidate's token beside an earlier-ranked candidate's
    (a first token, or where it leaves a shared prefix) takes the alternatives' acceptance, not its
    own match length's; each kind learns only from its own outcomes."""
    from completiond.core.speculation.index import TokenIndex
    from completiond.core.speculation.proposers import Outcome, PromptLookup

    idx = TokenIndex()
    idx.set_file("/w/a.py", [5, 10, 11, 12, 13, 14, 15])  # matches 4 tokens back: ranked first
    idx.set_file("/w/b.py", [9, 10, 11, 12, 13, 20, 21])  # 3 back, shares 13, then 20
    idx.set_file("/w/c.py", [8, 10, 11, 12, 40, 41])  # 3 back, 40 beside 13
    pld = PromptLookup(idx)
    first, nxt, alt = pld.first[4].value, pld.next.value, pld.alt.value
    assert first > 3 * alt  # the priors already rank them apart
    cands = {tuple(c.tokens): c.probs for c in pld.propose([7, 5, 10, 11, 12], Limits(max_len=3, min_value=0.0))}
    assert cands == {(13, 14, 15): [first, nxt, nxt], (13, 20, 21): [first, alt, nxt], (40, 41): [alt, nxt]}
    bucket3 = pld.first[2].value
    pld.observe([Outcome(1, first, True, (13,)), Outcome(1, alt, False, (40,)),
                 Outcome(2, nxt, True, (13, 14)), Outcome(2, alt, False, (13, 20))])
    assert pld.first[4].value > first and pld.next.value > nxt and pld.alt.value < alt
    assert pld.first[2].value == bucket3  # the alternatives' match length (3) learned nothing


def test_prompt_lookup_values_a_long_copy_run_by_its_own_acceptance():
    """A later token of a candidate whose backward match is 16+ tokens (an answer copying its source,
    as a next edit copies its region) is valued by the `run` acceptance, learned only from such
    tokens; a shorter match's later tokens keep `next`. So a run accepted to its end can grow a
    deep chain that the budget pays for, without lifting a completion's short matches."""
    from completiond.core.speculation.index import TokenIndex
    from completiond.core.speculation.proposers import Outcome, PromptLookup

    src = list(range(100, 140))  # a 40-token region; the context has copied its first 20 tokens
    idx = TokenIndex()
    idx.set_file("/w/a.py", src)
    pld = PromptLookup(idx)
    pld.run.value, pld.next.value = 0.97, 0.8
    (long,) = pld.propose([1, 2] + src[:20], Limits(max_len=32, min_value=0.0))
    assert long.tokens == src[20:40] and long.probs[1:] == [0.97] * 19
    (short,) = pld.propose([1, 2, 7, 100, 101, 102], Limits(max_len=4, min_value=0.0))
    assert short.probs[1:] == [0.8] * 3
    pld.propose([1, 2] + src[:20], Limits(max_len=32, min_value=0.0))
    pld.observe([Outcome(1, long.probs[0], True, tuple(src[20:21])),
                 Outcome(2, 0.97, False, tuple(src[20:22]))])
    assert pld.run.value < 0.97 and pld.next.value == 0.8


def test_the_engine_reports_each_tested_node_by_the_path_prompt_lookup_proposed(code_ids, monkeypatch):
    """Outcome.tokens is the node's path below the root, so prompt lookup learns of the very node
    it valued (a leading token, a later one, an alternative); output stays the target's own."""
    from completiond.core.engine import Engine, Request

    target = tiny.loaded(tiny.gemma_config(window=16, layers=2), seed=1, scale=4.0)
    prompt = code_ids[:120] + code_ids[40:70]  # repeats itself: prompt lookup has guesses
    ar = Engine(target).complete(Request(prompt=prompt, mode="ar", max_tokens=16))
    engine = Engine(target)
    priced(engine, monkeypatch)  # a budget that verifies prompt lookup's guesses
    pld = engine.prompt_lookup
    seen, observe = [], pld.observe

    def check(outcomes):
        for o in outcomes:
            assert o.tokens in pld._kinds and len(o.tokens) == o.depth
            seen.append(pld._kinds[o.tokens])
        observe(outcomes)
    pld.observe = check
    res = engine.complete(Request(prompt=prompt, mode="pld", max_tokens=16))
    assert res.token_ids == ar.token_ids
    assert seen and any(k > 0 for k in seen)  # leading first tokens were tested


class Priced:
    """A proposer's measured step (an Ewma's `value`), fixed to a share of the target pass as it costs now."""

    def __init__(self, ms):
        self.ms = ms

    @property
    def value(self) -> float:
        return self.ms()

    def add(self, ms: float) -> None:
        pass


def test_a_draft_as_dear_as_a_target_pass_is_never_asked_once_measured(code_ids, monkeypatch):
    """A draft whose proposals cost, a level, more than a target pass cannot pay at any step (each
    level saves at most one target pass): once its proposals are measured so, the engine asks
    neither its `pays` nor its gate (no warm-up, no probes) and the output stays the target's. The
    same draft measured cheap is asked where prompt lookup finds nothing."""
    from completiond.core.engine import Engine, Request
    from completiond.core.speculation.gate import StepGate
    from completiond.models.loader import self_draft

    target = tiny.loaded(tiny.gemma_config(window=16, layers=4), seed=1, scale=4.0)
    prompt = code_ids[40:80]
    ar = Engine(target).complete(Request(prompt=prompt, mode="ar", max_tokens=32)).token_ids
    for dear in (True, False):
        engine = Engine(target, self_draft(target, 2))
        priced(engine, monkeypatch)
        asked = []
        pays = engine.draft.pays
        engine.draft.pays = lambda *a, **k: asked.append(1) or pays(*a, **k)
        # its proposals measured at 1.2 target passes a level, or at a hundredth of one (of the pass cost now)
        gate = engine.gates["draft"] = StepGate()
        gate.level_ms = Priced(lambda share=1.2 if dear else 0.01, b=engine.budget: b.cost(1) * share)
        for _ in range(2):
            assert engine.complete(Request(prompt=prompt, mode="draft", max_tokens=32)).token_ids == ar
        if dear:
            assert not asked and gate.steps == {True: 0, False: 0} and gate.excluded > 0
        else:
            assert asked and gate.excluded == 0
