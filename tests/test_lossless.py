"""Greedy speculative output is token-identical to plain decoding (fp32), in every mode."""

import random

import pytest
import torch

import tiny
from completiond.core.engine import MODES, Engine, Request
from completiond.models.heads import EagleHead, MedusaHeads
from completiond.models.loader import self_draft
from completiond.core.prompt.stops import StopRules

N_PROMPTS = 50


@pytest.fixture(scope="module")
def models():
    target = tiny.loaded(tiny.gemma_config(window=16, layers=4), seed=1, scale=4.0)
    return {
        "self-draft": (target, self_draft(target, 2)),  # correlated: many accepted tokens
        "random-draft": (target, tiny.loaded(tiny.gemma_config(window=16, layers=1), seed=7, scale=4.0)),
        "medusa": (target, random_medusa(target)),  # heads on the target's own hidden states
        "eagle": (target, random_eagle(target)),
    }


def random_medusa(target, k=3, seed=5, scale=0.05):
    """Medusa heads with small random blocks: head k guesses near the target's own next token (a tiny
    random model repeats itself often, so some guesses land), over a sub-vocabulary."""
    hidden, vocab = target.model.config.hidden_size, target.vocab_size
    torch.manual_seed(seed)
    heads = MedusaHeads(hidden, k, torch.randperm(vocab)[: vocab // 2].sort().values)
    with torch.no_grad():
        heads.w.normal_(0, scale / hidden ** 0.5)
    return heads


def prompts(code_ids, n=N_PROMPTS, seed=0):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        end = rng.randrange(5, len(code_ids))
        out.append(code_ids[max(0, end - rng.choice([8, 40, 120])):end])  # some longer than the window
    return out


def engines_agree(target, draft, code_ids, n: int, seed: int, max_tokens: int = 16) -> dict:
    """Engines of every mode on (target, draft), prompt lookup over textwrap.py: on n prompts, pld,
    draft and combined give ar's tokens. Returns the engines (mode -> Engine)."""
    engines = {m: Engine(target, draft, max_nodes=32, always_speculate=True) for m in MODES}
    for e in engines.values():
        e.index.set_file("textwrap.py", code_ids)
    for i, prompt in enumerate(prompts(code_ids, n=n, seed=seed)):
        prompt = [t % (target.vocab_size - 16) for t in prompt]
        ar = engines["ar"].complete(Request(prompt=prompt, mode="ar", max_tokens=max_tokens))
        for m in ("pld", "draft", "combined"):
            res = engines[m].complete(Request(prompt=prompt, mode=m, max_tokens=max_tokens))
            assert res.token_ids == ar.token_ids, (m, i)
    return engines


def random_eagle(target, seed=6, scale=0.05):
    """An EAGLE-style head with a small random MLP: its next state stays near the one it came from."""
    hidden, vocab = target.model.config.hidden_size, target.vocab_size
    torch.manual_seed(seed)
    head = EagleHead(hidden, 2 * hidden, torch.randperm(vocab)[: vocab // 2].sort().values)
    with torch.no_grad():
        head.w2.normal_(0, scale / hidden ** 0.5)
    return head


@pytest.mark.parametrize("pair", ["self-draft", "random-draft", "medusa", "eagle"])
def test_greedy_identical_across_modes(models, pair, code_ids):
    target, draft = models[pair]
    # always_speculate: every proposal is verified, whatever this machine's timings say
    engines = {m: Engine(target, draft, max_nodes=32, always_speculate=True) for m in MODES}
    # workspace text for prompt lookup: the same file, so lookups hit often
    for e in engines.values():
        e.index.set_file("textwrap.py", code_ids)
        e.calibrate(sizes=(1, 4, 16, 32), context=8)
    accepted = {m: 0 for m in MODES}
    for i, prompt in enumerate(prompts(code_ids, seed=hash(pair) % 1000)):
        ar = engines["ar"].complete(Request(prompt=prompt, mode="ar", max_tokens=24))
        assert ar.target_passes == len(ar.token_ids) - 1 or ar.stopped_by == "eos"
        for m in ("pld", "draft", "combined"):
            res = engines[m].complete(Request(prompt=prompt, mode=m, max_tokens=24))
            assert res.token_ids == ar.token_ids, f"{pair} mode {m} prompt {i} diverged"
            assert res.text == ar.text
            accepted[m] += round(res.mean_accepted * res.target_passes)
    # the trees were really exercised
    assert accepted["pld"] > 50 and accepted["combined"] > 50
    if pair in ("self-draft", "medusa", "eagle"):
        assert accepted["draft"] > 50


def test_ar_equals_transformers_generate(models, code_ids):
    """An independent reference: transformers' own greedy generate with its own cache."""
    target, draft = models["self-draft"]
    engine = Engine(target, draft)
    for prompt in prompts(code_ids, n=10, seed=3):
        with torch.no_grad():
            ref = target.model.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False,
                                        eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
        for mode in ("ar", "combined"):
            got = engine.complete(Request(prompt=prompt, mode=mode, max_tokens=20)).token_ids
            eos = target.eos_ids()
            cut = next((i for i, t in enumerate(ref) if t in eos), len(ref))
            assert got == ref[:cut]


def test_identical_under_stop_rules(models, code_ids):
    """Multi-line and single-line stops cut the same place whatever the mode."""
    target, draft = models["self-draft"]
    engines = {m: Engine(target, draft, always_speculate=True) for m in MODES}
    for e in engines.values():
        e.index.set_file("f", code_ids)
    for prompt in prompts(code_ids, n=15, seed=5):
        for stops in (StopRules(multiline=False), StopRules(multiline=True, cursor_indent=4)):
            outs = {m: engines[m].complete(Request(prompt=prompt, mode=m, max_tokens=32, stops=stops))
                    for m in MODES}
            assert len({(tuple(o.token_ids), o.text) for o in outs.values()}) == 1
