"""Alternatives (Request.n > 1): the first suggestion is token-identical to n = 1, the others are the
target's own greedy continuations of the first token's runners-up, all decoded in the same passes."""

import random
import threading

import pytest
import torch

import tiny
from completiond.core.engine import Engine, Request
from completiond.core.prompt.stops import StopRules
from completiond.models.loader import self_draft

N_PROMPTS = 30


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Passes of a few dozen rows of a tiny model: one thread, or a loaded machine's thread
    hand-offs make each matmul cost ms (the ratios measured here are a real model's job)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", params=["gemma", "qwen2"])
def target(request):
    if request.param == "gemma":  # sliding-window layers, transformers forward
        return tiny.loaded(tiny.gemma_config(window=16, layers=4), seed=1, scale=4.0)
    return tiny.loaded(tiny.qwen2_config(), seed=2, scale=4.0)  # the lean forward


def prompts(code_ids, n=N_PROMPTS, seed=0):
    rng = random.Random(seed)
    return [code_ids[max(0, e - rng.choice([8, 40, 120])):e]
            for e in (rng.randrange(5, len(code_ids)) for _ in range(n))]


def engine(target, draft=None):
    e = Engine(target, draft, max_nodes=32, always_speculate=True)
    e.index.set_file("textwrap.py", tiny.tokenizer().encode((tiny.STDLIB / "textwrap.py").read_text()))
    e.calibrate(sizes=(1, 4, 16, 32), context=8)
    return e


@pytest.mark.parametrize("mode", ["ar", "pld", "combined"])
def test_first_is_the_single_suggestion_and_others_are_greedy(target, mode, code_ids):
    single = engine(target, self_draft(target, 1) if mode == "combined" else None)
    several = engine(target, self_draft(target, 1) if mode == "combined" else None)
    plain = engine(target)
    with_alts = 0
    free = StopRules(line_rules=False)  # token ids compare exactly: only eos and max_tokens end a text
    for i, prompt in enumerate(prompts(code_ids, seed=len(mode))):
        one = single.complete(Request(prompt=prompt, mode=mode, max_tokens=20, stops=free))
        res = several.complete(Request(prompt=prompt, mode=mode, max_tokens=20, n=3, stops=free))
        assert res.token_ids == one.token_ids and res.text == one.text, f"prompt {i}: main diverged"
        assert one.alternatives == [] and len(res.alternatives) <= 2
        texts = [res.text] + [a.text for a in res.alternatives]
        assert len(set(texts)) == len(texts) and all(t.strip() for t in texts[1:])
        with_alts += len(res.alternatives) > 0
        for a in res.alternatives:  # the target's own greedy continuation of prompt + its first token
            ref = plain.complete(Request(prompt=prompt + a.token_ids[:1], mode="ar", max_tokens=19, stops=free))
            expect = a.token_ids[:1] + ref.token_ids
            if a.stopped_by == "alternatives_budget":
                assert expect[:len(a.token_ids)] == a.token_ids, f"prompt {i}: alternative diverged"
            else:
                assert a.token_ids == expect, f"prompt {i}: alternative diverged"
            assert a.token_ids[0] != res.token_ids[0]
        # the cache holds what a single completion leaves: the next request reuses the prompt
        again = several.complete(Request(prompt=prompt, mode=mode, max_tokens=20, stops=free))
        assert again.token_ids == one.token_ids and again.reused_tokens == len(prompt) - 1
    assert with_alts >= N_PROMPTS * 0.8


def test_alternatives_under_stop_rules_and_heal(target, code_ids):
    e = engine(target)
    for prompt in prompts(code_ids, n=10, seed=3):
        stops = StopRules(stop_strings=("\n",))
        one = e.complete(Request(prompt=prompt, mode="pld", max_tokens=24, stops=stops))
        res = e.complete(Request(prompt=prompt, mode="pld", max_tokens=24, stops=stops, n=3))
        assert res.text == one.text and res.stopped_by == one.stopped_by
        for a in res.alternatives:
            assert "\n" not in a.text


def test_cancel_during_alternatives_keeps_the_cache_usable(target, code_ids):
    e = engine(target)
    prompt = code_ids[200:300]
    cancel = threading.Event()
    passes = []

    def on_step(step):
        passes.append(step)
        if len(passes) == 3:
            cancel.set()

    res = e.complete(Request(prompt=prompt, mode="pld", max_tokens=40, n=3, cancel=cancel), on_step)
    assert res.cancelled
    one = engine(target).complete(Request(prompt=prompt, mode="pld", max_tokens=40))
    again = e.complete(Request(prompt=prompt, mode="pld", max_tokens=40, n=3))
    assert again.token_ids == one.token_ids


def test_another_documents_job_between_turns(target, code_ids):
    """The daemon's scheduler may run another slot's job between two passes of this one: the
    branches' uncommitted nodes must survive the slot switch (Runner.hold forgets pending nodes)."""
    free = StopRules(line_rules=False)
    p1, p2 = code_ids[100:180], code_ids[400:470]
    ref = engine(target).complete(Request(prompt=p1, mode="pld", max_tokens=20, n=3, stops=free))
    e = engine(target)
    steps = e.run(Request(prompt=p1, mode="pld", max_tokens=20, n=3, stops=free, slot="a"))
    with torch.inference_mode():
        while True:
            try:
                with e.turn("a"):
                    next(steps)
            except StopIteration as done:
                res = done.value
                break
            e.complete(Request(prompt=p2, mode="pld", max_tokens=4, slot="b"))
    assert res.token_ids == ref.token_ids
    assert [a.token_ids for a in res.alternatives] == [a.token_ids for a in ref.alternatives]
