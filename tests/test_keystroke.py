"""Keystroke latency at engine level (issue 15): preemption between layers and prefill chunks, the
cache left consistent after a cancel, typed-through served with no pass, warm-up that yields."""

import random
import threading

import pytest
import torch

import tiny
from completiond.core.engine import Engine, Request
from completiond.models.loader import self_draft
from completiond.core.forward.context import Cancelled, PassContext
from completiond.core.forward.runner import CHUNK, Runner
from completiond.core.scheduler import Scheduler
from completiond.core.prompt.stops import StopRules
from completiond.core.speculation.verify import Sampling


class Gate(threading.Event):
    """A cancel event that, at its `at`-th poll, waits until another thread sets it: the cancel then
    arrives at a known point of the work, with no timing involved."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.polls = at, 0
        self.reached = threading.Event()

    def is_set(self) -> bool:
        self.polls += 1
        if self.polls == self.at:
            self.reached.set()
            assert self.wait(30), "nobody set the cancel"
        return super().is_set()


class CancelWhen(threading.Event):
    """A cancel that reads as set once `when()` is true (polled at every check)."""

    def __init__(self, when):
        super().__init__()
        self.when = when

    def is_set(self) -> bool:
        return self.when() or super().is_set()


def cancel_from_thread(gate: Gate) -> threading.Thread:
    t = threading.Thread(target=lambda: (gate.reached.wait(30), gate.set()), daemon=True)
    t.start()
    return t


@pytest.fixture(scope="module")
def target():
    return tiny.loaded(tiny.gemma_config(window=16, layers=4), seed=1, scale=4.0)


def long_prompt(code_ids, n=3 * CHUNK + 40):
    assert len(code_ids) > n
    return code_ids[:n]


@pytest.mark.parametrize("backend", ["lean", "transformers"])
def test_cancel_mid_prefill_keeps_finished_chunks(target, code_ids, backend):
    """A warm-up stops between two layers; a request's prefill only between chunks (a request
    superseded by the next keystroke finishes the chunk the next request reuses)."""
    prompt = long_prompt(code_ids)
    layers = target.model.config.num_hidden_layers
    fresh = Engine(target, backend=backend).complete(Request(prompt=prompt, mode="ar", max_tokens=12))

    e = Engine(target, backend=backend)
    # warm polls once, then once before each chunk and each layer: the cancel lands
    # before layer 3 of the second chunk
    gate = Gate(at=1 + 1 + layers + 1 + 2)
    cancel_from_thread(gate)
    assert e.warm(prompt, cancel=gate) == CHUNK
    assert e.stats["warms_preempted"] == 1
    assert e.runner.layers_run == layers + 2 < 4 * layers  # stopped inside a pass, between two layers
    # the cache holds exactly the finished chunks, and the ids it claims
    assert e.runner.length == CHUNK and e.runner.tokens == prompt[:CHUNK]
    assert e.cached_prefix_len(prompt) == CHUNK

    # a request: once begun, its first chunk runs without a poll (the next keystroke reuses it), then
    # one poll before each later chunk, none between layers: cancelled at the first of them
    gate = Gate(at=1)
    cancel_from_thread(gate)
    res = e.complete(Request(prompt=prompt, mode="ar", max_tokens=12, cancel=gate))
    assert res.cancelled and res.token_ids == [] and res.target_passes == 0
    assert e.stats["cancelled"] == 1 and e.stats["cancelled_ms"] > 0  # stale work is reported
    assert e.runner.layers_run == layers + 2 + layers  # whole chunks only: it ran the second one
    assert e.runner.length == 2 * CHUNK and e.cached_prefix_len(prompt) == 2 * CHUNK

    again = e.complete(Request(prompt=prompt, mode="ar", max_tokens=12))
    assert again.reused_tokens == 2 * CHUNK
    assert again.token_ids == fresh.token_ids and again.text == fresh.text


@pytest.mark.parametrize("backend", ["lean", "transformers"])
def test_cancel_mid_verify_leaves_the_cache_unchanged(target, code_ids, backend):
    prompt = code_ids[:100]
    tree_ids = code_ids[100:116]
    parents = [-1] + [i // 2 for i in range(15)]  # a 16-node tree
    ref = Runner(target, backend=backend)
    ref.extend(prompt)
    want = ref.forward(tree_ids, parents, range(16))

    r = Runner(target, backend=backend)
    r.extend(prompt)
    r.forward(code_ids[200:203], [-1, 0, 1], range(3))  # uncommitted nodes an appended pass may follow
    calls = []
    cancel = CancelWhen(lambda: calls.append(1) or len(calls) == 3)
    with pytest.raises(Cancelled):
        r.forward(tree_ids, parents, range(16), append=True, ctx=PassContext(cancel))
    assert r.length == 100 and r.tokens == prompt and len(r._pass_ids) == 3
    # the earlier uncommitted nodes still work, and a fresh pass gives the reference logits
    r.forward([code_ids[203]], [2], [0], append=True)
    r.keep([0, 1, 2, 3])
    assert r.tokens == prompt + code_ids[200:204]
    r.rollback(100)
    got = r.forward(tree_ids, parents, range(16))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_resumed_prefill_matches_an_uninterrupted_one(target, code_ids):
    """Chunks sit on a fixed grid: a prefill cancelled and resumed computes bit-identical K/V."""
    prompt = long_prompt(code_ids)
    whole = Runner(target)
    want = whole.extend(prompt)
    part = Runner(target)
    layers = target.model.config.num_hidden_layers
    cancel = CancelWhen(lambda: part.layers_run > layers + 2)  # before the 2nd chunk's 3rd layer
    with pytest.raises(Cancelled):
        part.extend(prompt, ctx=PassContext(cancel))
    assert part.length == CHUNK
    got = part.extend(prompt)
    assert torch.equal(got, want)
    for a, b in zip(whole.cache.k, part.cache.k):
        assert torch.equal(a[:, :, :len(prompt)], b[:, :, :len(prompt)])


def test_warm_is_preempted_by_a_request_and_reused(target, code_ids):
    """As in the daemon: the warm-up is a low-priority job of the scheduler; a request for the same
    document arrives and cancels it (Warmer.asked); the request starts from the chunks it finished."""
    prompt = long_prompt(code_ids)
    fresh = Engine(target).complete(Request(prompt=prompt, mode="ar", max_tokens=10))
    e = Engine(target)
    sched = Scheduler(e)
    inside, release = threading.Event(), threading.Event()
    gives_way = sched._gives_way

    def held(job):  # asked between two layers of a prefill chunk: hold inside the second chunk
        if not inside.is_set() and e.runner.length >= CHUNK:
            inside.set()
            assert release.wait(30)
        return gives_way(job)

    sched._gives_way = held
    cancel = threading.Event()
    try:
        warm = sched.submit(lambda ctx: e.warming(prompt, ctx), "doc", cancel, low=True)
        assert inside.wait(30)
        req = sched.submit(lambda ctx: e.run(Request(prompt=prompt, mode="ar", max_tokens=10, slot="doc"), ctx=ctx),
                           "doc")
        cancel.set()  # the request's document: its warm-up stops
        release.set()
        cached, res = warm.result(30), req.result(30)
    finally:
        sched.stop(30)
    assert cached == CHUNK  # the chunks it finished ...
    assert e.stats["warms"] == e.stats["warms_preempted"] == 1
    assert res.reused_tokens == CHUNK  # ... are what the request started from
    assert res.token_ids == fresh.token_ids


def test_warm_then_complete_reuses_everything(target, code_ids):
    prompt = long_prompt(code_ids)
    e = Engine(target)
    assert e.cached_prefix_len(prompt) == 0
    assert e.warm(prompt) == len(prompt)
    assert e.cached_prefix_len(prompt) == len(prompt)
    assert e.warm(prompt, threading.Event()) == len(prompt)  # already warm: nothing to do
    stopped = threading.Event()
    stopped.set()
    assert e.warm(code_ids[:50], stopped) == len(prompt)  # cancelled before it starts: cache untouched
    res = e.complete(Request(prompt=prompt, mode="ar", max_tokens=5))
    assert res.reused_tokens == len(prompt) - 1  # only the last token is run again, for its logits


# ---- typed-through ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pair():
    t = tiny.loaded(tiny.gemma_config(window=16, layers=4), seed=1, scale=4.0)
    return t, self_draft(t, 2)


def cases(code_ids, n, seed=0):
    rng = random.Random(seed)
    for _ in range(n):
        end = rng.randrange(20, len(code_ids))
        yield code_ids[max(0, end - rng.choice([12, 60, 150])):end]


def test_typed_through_matches_a_fresh_engine(pair, code_ids):
    target, draft = pair
    rng = random.Random(1)
    e = Engine(target, draft, max_nodes=16, always_speculate=True)
    e.index.set_file("textwrap.py", code_ids)
    fresh_passes = typed_passes = served = 0
    for i, prompt in enumerate(cases(code_ids, 24)):
        first = e.complete(Request(prompt=prompt, mode="combined", max_tokens=rng.choice([6, 16])))
        if len(first.token_ids) < 2:
            continue
        k = rng.randrange(1, len(first.token_ids))  # the user typed k tokens of the suggestion
        stops = StopRules(multiline=True, cursor_indent=rng.choice([0, 4, 100]))
        req = dict(prompt=prompt + first.token_ids[:k], max_tokens=rng.choice([3, 12, 24]), stops=stops)
        typed = e.complete(Request(typed_through=True, mode=rng.choice(["ar", "combined"]), **req))
        ref = Engine(target)  # a fresh engine: nothing remembered, nothing cached
        want = ref.complete(Request(mode="ar", **req))
        assert typed.token_ids == want.token_ids, f"case {i} diverged"
        assert typed.text == want.text and typed.stopped_by == want.stopped_by
        assert typed.served_tokens > 0
        if typed.served_tokens > len(typed.token_ids):  # it stopped inside what was served
            assert typed.target_passes == 0
        fresh_passes += want.target_passes
        typed_passes += typed.target_passes
        served += 1
    assert served >= 15 and typed_passes < fresh_passes


def test_fully_served_request_runs_no_pass(pair, code_ids):
    target, _ = pair
    e = Engine(target)
    prompt = code_ids[100:160]
    free = StopRules(line_rules=False)
    first = e.complete(Request(prompt=prompt, mode="ar", max_tokens=12, stops=free))
    assert len(first.token_ids) == 12
    passes = e.stats["passes"]
    steps = []
    typed = e.complete(Request(typed_through=True, prompt=prompt + first.token_ids[:4], mode="ar", max_tokens=8, stops=free),
                       steps.append)
    assert typed.token_ids == first.token_ids[4:] and typed.target_passes == 0 and e.stats["passes"] == passes
    assert len(steps) == 1 and steps[0].token_ids == first.token_ids[4:]  # streamed at once, as one step


def test_not_served_when_the_prompt_does_not_match_or_samples(pair, code_ids):
    target, _ = pair
    e = Engine(target)
    prompt = code_ids[300:360]
    first = e.complete(Request(prompt=prompt, mode="ar", max_tokens=8))
    other = next(t for t in range(5, 500) if t != first.token_ids[0] and t not in e.eos)
    miss = e.complete(Request(typed_through=True, prompt=prompt + [other], mode="ar", max_tokens=4))
    assert miss.served_tokens == 0 and miss.target_passes > 0
    cut = e.complete(Request(typed_through=True, prompt=prompt[1:] + first.token_ids[:1], mode="ar", max_tokens=4))
    assert cut.served_tokens == 0  # the old prompt must be a prefix, not merely overlap
    sampled = e.complete(Request(typed_through=True, prompt=prompt + first.token_ids[:2], mode="ar", max_tokens=4,
                                 sampling=Sampling(temperature=0.8), seed=3))
    assert sampled.served_tokens == 0  # sampling is never served from what greedy verified
    # and what a sampling request produced is never remembered as greedy
    f = Engine(target)
    s = f.complete(Request(prompt=prompt, mode="ar", max_tokens=6, sampling=Sampling(temperature=1.5), seed=1))
    g = f.complete(Request(prompt=prompt + s.token_ids[:1], mode="ar", max_tokens=4))
    assert g.served_tokens == 0
    off = e.complete(Request(prompt=prompt + first.token_ids[:1], mode="ar", max_tokens=4))
    assert off.served_tokens == 0  # off unless asked for: benchmarks repeat a prompt in every mode
    on = e.complete(Request(typed_through=True, prompt=prompt + first.token_ids[:1], mode="ar", max_tokens=4))
    assert on.served_tokens > 0 and on.target_passes == 0


def test_typed_through_respects_token_healing(pair, code_ids):
    from completiond.core.prompt import Heal
    target, _ = pair
    e = Engine(target)
    prompt = code_ids[500:560]
    first = e.complete(Request(prompt=prompt, mode="ar", max_tokens=8))
    nxt = first.token_ids[2]
    ok = Heal(text="", allowed=[nxt, nxt + 1])
    bad = Heal(text="", allowed=[t for t in range(1, 20) if t != nxt])
    served = e.complete(Request(typed_through=True, prompt=prompt + first.token_ids[:2], mode="ar", max_tokens=4, heal=ok))
    assert served.served_tokens > 0 and served.token_ids[0] == nxt
    refused = e.complete(Request(typed_through=True, prompt=prompt + first.token_ids[:2], mode="ar", max_tokens=4, heal=bad))
    assert refused.served_tokens == 0
    want = Engine(target).complete(Request(prompt=prompt + first.token_ids[:2], mode="ar", max_tokens=4, heal=bad))
    assert refused.token_ids == want.token_ids


def test_typed_prompt_serves_every_keystroke_through_the_suggestion(pair, code_ids):
    """Character by character through the shown text: whole tokens extend the prompt, a partial one
    is a heal; each keystroke is served from memory and equals a fresh engine's answer."""
    target, _ = pair
    free = StopRules(line_rules=False)
    e = Engine(target)
    prompt = code_ids[1300:1380]  # the random model writes printable text here ("aserer...")
    first = e.complete(Request(prompt=prompt, mode="ar", max_tokens=10, stops=free))
    text = first.text
    assert len(text) >= 10 and text.isprintable()
    assert e.typed_prompt(prompt, "\x00" + text) is None  # typed something else
    assert e.typed_prompt(code_ids[:5], text[:1]) is None  # nothing remembered for that prompt
    fresh_passes = typed_passes = 0
    for c in range(1, len(text)):
        ids, heal = e.typed_prompt(prompt, text[:c])
        req = dict(prompt=ids, heal=heal, max_tokens=14, stops=free)
        res = e.complete(Request(typed_through=True, mode="combined", **req))
        want = Engine(target).complete(Request(mode="ar", **req))
        assert res.token_ids == want.token_ids and res.text == want.text, f"after {c} characters"
        assert res.served_tokens > 0 and res.text.startswith(text[c:])
        fresh_passes += want.target_passes
        typed_passes += res.target_passes
    assert typed_passes < fresh_passes / 2


def test_warm_with_a_draft_stops_inside_the_draft_prefill(target, code_ids):
    prompt = long_prompt(code_ids)
    draft = tiny.loaded(tiny.gemma_config(window=16, layers=2), seed=7, scale=4.0)
    layers = target.model.config.num_hidden_layers
    e = Engine(target, draft)
    # polls: 1 at the start, the target's 4 chunks (1 + layers each), then the draft's first chunk
    # (1 + 2 layers) and the check before its second chunk: the next poll is before its first layer
    gate = Gate(at=1 + 4 * (1 + layers) + 3 + 1 + 1)
    cancel_from_thread(gate)
    assert e.warm(prompt, gate) == len(prompt)  # the target finished
    assert e.draft.runner.length == CHUNK and e.draft.runner.tokens == prompt[:CHUNK]
    fresh = Engine(target, draft).complete(Request(prompt=prompt, mode="draft", max_tokens=10))
    res = e.complete(Request(prompt=prompt, mode="draft", max_tokens=10))
    assert res.token_ids == fresh.token_ids


def test_a_superseded_keystroke_prefill_of_a_few_tokens_stops_between_layers(target, code_ids):
    """A chunk of a few typed tokens costs a pass whatever its length, and the next request's prompt
    holds them too: superseded, it stops between two layers instead of running to its end."""
    prompt = code_ids[:103]
    layers = target.model.config.num_hidden_layers
    e = Engine(target)
    e.warm(prompt[:100])
    before = e.runner.layers_run
    gate = Gate(at=3)  # one poll before the chunk, then one per layer: the cancel lands before layer 2
    cancel_from_thread(gate)
    res = e.complete(Request(prompt=prompt, mode="ar", max_tokens=12, cancel=gate))
    assert res.cancelled and res.token_ids == []
    assert 0 < e.runner.layers_run - before < layers  # stopped inside the pass
    assert e.runner.length == 100 and e.cached_prefix_len(prompt) == 100  # nothing of it committed
    again = e.complete(Request(prompt=prompt, mode="ar", max_tokens=12))
    assert again.token_ids == Engine(target).complete(Request(prompt=prompt, mode="ar", max_tokens=12)).token_ids


class _Pieces:
    """A tokenizer that decodes ids to fixed pieces (typed_prompt needs only `decode`)."""
    PIECES = {0: "x", 1: "\n\n", 2: "def", 3: "\n   ", 4: " return", 5: "            ", 6: "except"}

    def decode(self, ids, **_) -> str:
        return "".join(self.PIECES[i] for i in ids)


def test_typed_whitespace_is_not_served_into_more_whitespace_than_typed():
    """The suggestion was "\n\ndef" (one "\n\n" token); the user pressed Enter once. Served, the
    heal would force the second line break (the ghost a blank line, then `def`): it is left to a
    prompt rebuilt with the typed line break as its own token, as is indentation shallower than the
    remembered one (the 1.5B on tomlkit and marshmallow: both rebuilt answers were right, both served
    ones wrong). A heal that forces code after the typed whitespace is still served."""
    from completiond.core.prompt.typed import Verified, typed_prompt

    tok, prompt = _Pieces(), [0]
    blank_first = Verified(prompt, [1, 2], None)
    assert typed_prompt(tok, blank_first, "\n") is None
    assert typed_prompt(tok, blank_first, "\n\n") == ([0, 1], None)  # both typed: served
    deeper = Verified(prompt, [5, 6], None)
    assert typed_prompt(tok, deeper, "        ") is None  # 8 of 12 spaces typed
    assert typed_prompt(tok, deeper, " " * 12) == ([0, 5], None)
    indented = Verified(prompt, [3, 4], None)
    assert typed_prompt(tok, indented, "\n") is None  # the indentation is the model's to choose again
    ids, heal = typed_prompt(tok, indented, "\n    ")
    assert ids == [0, 3] and heal.text == " " and heal.allowed == [4]
