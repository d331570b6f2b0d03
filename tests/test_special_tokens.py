"""No special token reaches a completion's text: a model that writes <|fim_middle|> (or any other
special token) mid-completion has ended it, in every mode, in the streamed increments and in the
alternatives. A tiny Qwen2 whose output row for <|fim_middle|> is made to win after a few tokens
stands for the real model that answered `return self._value<|fim_middle|>`."""

import pytest
import torch

import tiny
from completiond.core.engine import Engine, Request
from completiond.core.prompt import build_prompt, special_ids

TEXT = "class Box:\n    def value(self):\n        return self.\n\n\ndef main():\n    pass\n"
CURSOR = TEXT.index("self.\n") + len("self.")


def greedy(model, ids: list[int], n: int) -> list[int]:
    """Plain greedy decoding with the HF model (no engine): the tokens the model writes."""
    out = list(ids)
    with torch.no_grad():
        for _ in range(n):
            out.append(int(model(torch.tensor([out])).logits[0, -1].argmax()))
    return out[len(ids):]


@pytest.fixture(scope="module")
def leaky():
    """(target, prompt, k): a tiny FIM model whose greedy continuation writes <|fim_middle|> as its
    k-th token (k >= 2: after some text), and the prompt it does so for."""
    target = tiny.loaded(tiny.qwen2_config(), seed=3, scale=4.0)
    tok = target.tokenizer
    mid = tok.convert_tokens_to_ids("<|fim_middle|>")
    p = build_prompt(tok, TEXT, CURSOR, multiline=True)
    head = target.model.get_output_embeddings().weight
    plain = greedy(target.model, p.ids, 6)
    for k in range(2, 6):
        saved = head[mid].clone()
        with torch.no_grad():  # the k-th token's row, doubled: <|fim_middle|> wins where that token did
            head[mid] = 2 * head[plain[k]]
        got = greedy(target.model, p.ids, k + 1)
        if mid in got[2:] and mid not in got[:2]:
            return target, p, got.index(mid)
        with torch.no_grad():
            head[mid] = saved
    pytest.skip("no step where the special token wins after text")


def test_special_ids_hold_the_fim_and_chat_tokens_not_text():
    tok = tiny.qwen_tokenizer()
    ids = special_ids(tok)
    for t in tiny.QWEN_SPECIALS:
        assert tok.convert_tokens_to_ids(t) in ids
    assert not ids & set(tok.encode("def f(x):\n    return x", add_special_tokens=False))
    assert special_ids(None) == frozenset()


@pytest.mark.parametrize("mode", ["ar", "pld", "combined"])
def test_a_special_token_ends_the_completion_and_never_shows(leaky, mode):
    target, p, k = leaky
    tok = target.tokenizer
    engine = Engine(target)
    steps = []
    res = engine.complete(Request(prompt=p.ids, mode=mode, max_tokens=16, stops=p.stops),
                          on_step=lambda s: steps.append(s.text))
    assert "<|" not in res.text and "<|" not in "".join(steps)
    assert res.stopped_by in ("eos", "stop_rule")
    assert not set(res.token_ids) & special_ids(tok)
    assert len(res.token_ids) <= k


def test_alternatives_never_carry_a_special_token(leaky):
    target, p, k = leaky
    engine = Engine(target)
    res = engine.complete(Request(prompt=p.ids, mode="ar", max_tokens=16, stops=p.stops, n=3))
    for a in [res, *res.alternatives]:
        assert "<|" not in a.text
        assert not set(a.token_ids) & special_ids(target.tokenizer)
