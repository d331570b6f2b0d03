"""The draft proposer's tree: every node's children are the draft's own top tokens after its path."""

import pytest
import torch

import tiny
from completiond.core.speculation.proposers import DraftModel, Limits


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
    forward = draft.runner.forward
    draft.runner.forward = lambda *a, **kw: passes.append(len(a[0])) or forward(*a, **kw)
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
