"""KV cache and runner: prefix reuse, rollback past the sliding window, tree masks."""

import pytest
import torch

import tiny
from completiond.core.forward.lean import LeanGemma3, LeanQwen2
from completiond.core.forward.runner import Runner


def reference_logits(lm, ids):
    with torch.no_grad():
        return lm.model(torch.tensor([ids])).logits[0]


# name -> config; names ending in "-lean" run completiond.core.forward.lean's forward (backend="lean").
CONFIGS = {
    "gemma-window8": lambda: tiny.gemma_config(window=8, layers=3),
    "gemma-window8-lean": lambda: tiny.gemma_config(window=8, layers=3),
    "llama": lambda: tiny.llama_config(),
    "qwen2": lambda: tiny.qwen2_config(),
    "qwen2-lean": lambda: tiny.qwen2_config(),
    "qwen2-tied": lambda: tiny.qwen2_config(tied=True),
    "qwen2-tied-lean": lambda: tiny.qwen2_config(tied=True),
}
LEAN_CLASS = {"gemma3_text": LeanGemma3, "qwen2": LeanQwen2}


def load(cfg: str):
    """The config's tiny model with random norm gains (zero-initialised ones would hide a wrong 1 + w;
    Qwen2's ones would hide a wrong 1 + w the other way) and random biases (zero ones would hide
    dropped q/k/v biases)."""
    lm = tiny.loaded(CONFIGS[cfg]())
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in lm.model.named_parameters():
            if "norm" in name:
                p.normal_(0.0 if lm.model.config.model_type == "gemma3_text" else 1.0, 0.3)
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.3)
    return lm


def runner(cfg: str, lm, **kw) -> Runner:
    lean = cfg.endswith("-lean")
    r = Runner(lm, backend="lean" if lean else "transformers", **kw)
    assert r.backend == ("lean" if lean else "transformers")
    assert isinstance(r.base, LEAN_CLASS.get(lm.model.config.model_type, ())) == lean
    return r


def assert_each_node_is_its_path(lm, committed, nodes, parents, logits) -> None:
    """Each node's logits equal a plain forward over the committed tokens plus its root-to-node path."""
    for i in range(len(nodes)):
        path, j = [], i
        while j >= 0:
            path.append(nodes[j])
            j = parents[j]
        alone = reference_logits(lm, committed + path[::-1])[-1]
        torch.testing.assert_close(logits[i], alone, rtol=0, atol=1e-5)

@pytest.mark.parametrize("cfg", CONFIGS)
def test_prefix_reuse_matches_fresh_prefill(cfg, code_ids):
    lm = load(cfg)
    ids = code_ids[:70]
    ref = reference_logits(lm, ids)
    r = runner(cfg, lm, capacity=8)  # small capacity: the cache must grow
    torch.testing.assert_close(r.extend(ids[:40], chunk=7), ref[39], rtol=0, atol=1e-5)
    # a new sequence sharing 30 tokens: only the rest is computed, logits equal a fresh prefill
    other = ids[:30] + [5, 6, 7] + ids[33:60]
    fresh = reference_logits(lm, other)
    torch.testing.assert_close(r.extend(other), fresh[-1], rtol=0, atol=1e-5)
    assert r.tokens == other and r.length == len(other)


def test_rollback_past_sliding_window(code_ids):
    """Window 8; roll back from 60 tokens to 30, continue differently: logits match a fresh run."""
    lm = tiny.loaded(tiny.gemma_config(window=8, layers=3))
    ids = code_ids[:60]
    r = Runner(lm)
    r.extend(ids)
    r.rollback(30)
    cont = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]
    got = r.extend(ids[:30] + cont)
    torch.testing.assert_close(got, reference_logits(lm, ids[:30] + cont)[-1], rtol=0, atol=1e-5)


@pytest.mark.parametrize("cfg", CONFIGS)
def test_tree_pass_equals_each_path_alone(cfg, code_ids):
    """A chain of 3 uncommitted tokens with a branching tree below, past the window."""
    lm = load(cfg)
    ctx = code_ids[:50]
    r = runner(cfg, lm)
    r.extend(ctx[:40])  # committed: ctx[:40] (cache holds 40 tokens)
    r.rollback(40)
    # nodes: chain ctx[40:43], then tree under node 2: a(3) -> b(4), a -> c(5), d(6) -> e(7)
    nodes = ctx[40:43] + [101, 102, 103, 104, 105]
    parents = [-1, 0, 1, 2, 3, 3, 2, 6]
    logits = r.forward(nodes, parents, range(len(nodes)))
    assert_each_node_is_its_path(lm, ctx[:40], nodes, parents, logits)
    # keep chain + a + b; the cache must equal running that sequence
    r.keep([0, 1, 2, 3, 4])
    seq = ctx[:43] + [101, 102]
    assert r.tokens == seq
    nxt = r.forward([7], [-1], [0])[0]
    torch.testing.assert_close(nxt, reference_logits(lm, seq + [7])[-1], rtol=0, atol=1e-5)


def test_tree_keep_non_prefix_path(code_ids):
    """Keeping a path whose nodes are not the first ones moves their KV entries down."""
    lm = tiny.loaded(tiny.gemma_config(window=8, layers=3))
    ctx = code_ids[:20]
    r = Runner(lm)
    r.extend(ctx)
    r.rollback(19)
    nodes = [ctx[19], 50, 60, 51, 61]
    parents = [-1, 0, 0, 1, 2]
    r.forward(nodes, parents, [])
    r.keep([0, 2, 4])
    assert r.tokens == ctx + [60, 61]
    got = r.forward([9], [-1], [0])[0]
    torch.testing.assert_close(got, reference_logits(lm, ctx + [60, 61, 9])[-1], rtol=0, atol=1e-5)


@pytest.mark.parametrize("cfg", CONFIGS)
def test_appended_passes_grow_one_tree(cfg, code_ids):
    """A tree grown over three appended passes (as the draft grows its proposals) gives each node the
    logits of its path alone, past the sliding window; keep then commits a path across passes."""
    lm = load(cfg)
    ctx = code_ids[:45]
    r = runner(cfg, lm)
    r.extend(ctx[:40])
    r.rollback(40)
    steps = [([ctx[40], 70], [-1, -1]),  # two roots
             ([71, 72, 73], [0, 0, 1]),  # below both
             ([74, 75], [2, 4])]  # below nodes of the previous pass
    nodes, parents, logits = [], [], []
    for ids, par in steps:
        logits.append(r.forward(ids, par, range(len(ids)), append=bool(nodes)))
        nodes += ids
        parents += par
    assert_each_node_is_its_path(lm, ctx[:40], nodes, parents, torch.cat(logits))
    r.keep([0, 2, 5])  # ctx[40] -> 71 -> 74
    assert r.tokens == ctx[:41] + [71, 74]
    got = r.forward([9], [-1], [0])[0]
    torch.testing.assert_close(got, reference_logits(lm, ctx[:41] + [71, 74, 9])[-1], rtol=0, atol=1e-5)
    r.forward([9], [-1], [0])  # a plain pass drops what earlier passes left uncommitted
    r.forward([10], [0], [0], append=True)
    r.keep([0, 1])
    torch.testing.assert_close(r.forward([11], [-1], [0])[0],
                               reference_logits(lm, ctx[:41] + [71, 74, 9, 10, 11])[-1], rtol=0, atol=1e-5)


def test_backend_choice():
    """lean=True (drafts) means lean where the model type allows, without refinement; an explicit lean
    backend on a family it lacks, or an unknown backend, is a clear error."""
    llama, qwen = tiny.loaded(tiny.llama_config()), tiny.loaded(tiny.qwen2_config())
    draft = Runner(llama, lean=True)
    assert draft.backend == "transformers" and draft.refine == 0
    draft = Runner(qwen, lean=True)
    assert draft.backend == "lean" and draft.refine == 0
    target = Runner(qwen, backend="lean", refine=True)
    assert target.backend == "lean" and target.refine > 0
    with pytest.raises(ValueError, match="no lean forward"):
        Runner(llama, backend="lean")
    with pytest.raises(ValueError, match="unknown backend"):
        Runner(qwen, backend="onnx")
    with pytest.raises(ValueError, match="quantized output layer"):
        Runner(qwen, cheap_head=True)


@pytest.mark.parametrize("backend", ["transformers", "lean"])
def test_bf16_refined_tree_argmax_equals_path_argmax(backend, code_ids):
    """In bf16 with refinement (as the target runs), each tree node's argmax equals its path's one-token
    pass (through transformers this seed's nodes are clear of bf16 noise, see test_quant.BF16_NOISE;
    the lean forward, attending in float32, gives the same logits to 1e-4)."""
    lm = tiny.loaded(tiny.qwen2_config(), dtype=torch.bfloat16, scale=4.0)
    ctx = code_ids[:30]
    nodes, parents = [101, 102, 103, 104, 105, 106], [-1, 0, 0, 1, 3, 2]
    r = Runner(lm, backend=backend, refine=True)
    r.extend(ctx)
    tree = r.forward(nodes, parents, range(len(nodes)))
    for i in range(len(nodes)):
        path, j = [], i
        while j >= 0:
            path.append(nodes[j])
            j = parents[j]
        alone = Runner(lm, backend=backend, refine=True)
        alone.extend(ctx)
        for t in path[::-1][:-1]:
            alone.forward([t], [-1], [])
            alone.keep([0])
        one = alone.forward([path[0]], [-1], [0])[0]
        assert one.argmax() == tree[i].argmax(), f"node {i}"
        if backend == "lean":  # float32 attention: the pass's shape no longer shows in bf16 logits
            torch.testing.assert_close(one, tree[i], rtol=0, atol=1e-4)
