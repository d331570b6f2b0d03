"""Fixed-shape passes (completiond.core.forward.graphs) run eagerly on the CPU: padding rows, key
buckets, slots from a tensor, grown caches and switched documents give the logits of the runner's
own passes. tests/test_cuda.py replays the same passes from captured CUDA graphs."""

import pytest
import torch

import tiny
from completiond.core.forward import graphs
from completiond.core.forward.runner import Runner
from completiond.models.loader import self_draft
from test_lossless import engines_agree
from test_runner import load


def pair(lm, capacity: int = 4096) -> tuple[Runner, Runner]:
    fixed, eager = Runner(lm, capacity, backend="lean", cuda_graphs=True), Runner(lm, capacity, backend="lean")
    assert fixed.graphs is not None and not fixed.graphs.capture and eager.graphs is None
    return fixed, eager


def same(fixed: Runner, eager: Runner, *args, **kw) -> torch.Tensor:
    a, b = fixed.run_pass(*args, **kw), eager.run_pass(*args, **kw)
    torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(a.hidden, b.hidden, rtol=0, atol=1e-5)
    return b.logits


def test_trees_chains_and_appended_passes_match_eager(code_ids):
    lm = load("qwen2-lean")
    fixed, eager = pair(lm)
    for r in (fixed, eager):
        r.extend(code_ids[:40])
    # a tree of 5 nodes (3 padding rows in a graph of 8), a chain of 3 (1 padding row), one node
    for nodes, parents in (([5, 6, 7, 8, 9], [-1, 0, 0, 1, 3]), ([11, 12, 13], [-1, 0, 1]), ([14], [-1])):
        same(fixed, eager, nodes, parents, range(len(nodes)))
    same(fixed, eager, [21, 22], [-1, 0], [0, 1])
    same(fixed, eager, [23, 24, 25], [1, 0, 2], [0, 2], append=True)  # below the first pass's nodes
    for r in (fixed, eager):
        r.keep([0, 1, 4])
    assert fixed.tokens == eager.tokens and fixed.length == eager.length == 43
    same(fixed, eager, [30], [-1], [0])  # after a keep that moved slots
    assert len(fixed.graphs.graphs) >= 3  # rows 8, 4, 1 (and 2) over one bucket of keys


def test_key_buckets_grown_caches_and_documents(code_ids):
    """Greedy decoding crosses a KEY_STEP boundary and the cache's capacity (which doubles); a second
    document's cache (another graph key) interleaves; every step's logits match eager ones."""
    lm = load("qwen2-lean")
    fixed, eager = pair(lm, capacity=graphs.KEY_STEP - 4)
    start = graphs.KEY_STEP - 12
    for r in (fixed, eager):
        r.extend(code_ids[:start])
    other = {r: r.new_held(64) for r in (fixed, eager)}
    for r in (fixed, eager):
        mine = r.hold(other[r])
        r.extend(code_ids[500:530])
        other[r] = r.hold(mine)
    nxt = code_ids[start]
    for step in range(24):
        nxt = int(same(fixed, eager, [nxt], [-1], [0])[0].argmax())
        for r in (fixed, eager):
            r.keep([0])
        if step % 6 == 5:  # the other document takes a two-node turn
            for r in (fixed, eager):
                other[r] = r.hold(other[r])
            same(fixed, eager, [nxt, 7], [-1, 0], [0, 1])
            for r in (fixed, eager):
                r.keep([0, 1])
                other[r] = r.hold(other[r])
    assert fixed.length == start + 24 > graphs.KEY_STEP and fixed.cache.capacity > graphs.KEY_STEP - 4
    # the grown cache's graphs cover the next bucket; those of its old buffers were let go
    live = {fixed.cache.k[0].data_ptr(), other[fixed].cache.k[0].data_ptr()}
    assert max(k[1] for k in fixed.graphs.graphs) > graphs.KEY_STEP
    assert {k[2] for k in fixed.graphs.graphs} == live


def test_passes_over_the_largest_size_run_eagerly(code_ids):
    lm = load("qwen2-lean")
    fixed, eager = pair(lm)
    n = graphs.SIZES[-1] + 1
    for r in (fixed, eager):
        r.extend(code_ids[:10])
    same(fixed, eager, code_ids[10:10 + n], list(range(-1, n - 1)), [n - 1])
    assert not fixed.graphs.graphs  # the prefill and this pass: neither had a fixed shape


def test_sliding_window_models_stay_eager():
    assert Runner(tiny.loaded(tiny.gemma_config(window=8, layers=3)), backend="lean", cuda_graphs=True).graphs is None


def test_greedy_identical_across_modes_with_fixed_shapes(code_ids, monkeypatch):
    """Every runner of the engines (target and draft) on fixed-shape passes: pld, draft and combined
    give ar's tokens (fp32)."""
    monkeypatch.setattr(graphs, "wanted", lambda device: True)
    target = tiny.loaded(tiny.qwen2_config(layers=3), seed=1, scale=4.0)
    engines = engines_agree(target, self_draft(target, 1), code_ids, n=6, seed=5)
    assert all(e.runner.graphs is not None and e.draft.runner.graphs is not None for e in engines.values())
    assert len(engines["combined"].runner.graphs.graphs) > 1


@pytest.mark.parametrize("value", ["0", "1"])
def test_env_turns_them_off(monkeypatch, value):
    monkeypatch.setenv("COMPLETIOND_CUDA_GRAPHS", value)
    assert graphs.wanted(torch.device("cuda")) == (value == "1")
    assert not graphs.wanted(torch.device("cpu"))


def test_cuda_attention_matches_sdpa():
    """The CUDA passes' attention (lean._attend_cuda: two matmuls and a softmax in float32) is the
    float32 SDPA of the CPU passes, checked here on the CPU: bf16 and fp32 inputs, a tree mask."""
    from completiond.core.forward.lean import _attend_cuda

    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v = (torch.randn(1, 2, rows, 64, generator=g).to(dtype) for rows in (6, 40, 40))
        mask = torch.rand(1, 1, 6, 40, generator=g) < 0.6
        mask[..., 0] = True  # every row sees a key
        want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask,
                                                                scale=0.125).to(dtype)
        torch.testing.assert_close(_attend_cuda(q, k, v, mask, 0.125), want, rtol=0,
                                   atol=1e-6 if dtype == torch.float32 else 1e-2)


class Replay:
    """Stands in for a torch.cuda.CUDAGraph on the CPU: replaying recomputes the pass from the
    graph's inputs into the output tensor the capture returned, as a real replay does."""

    def __init__(self, fn, out):
        self.fn, self.out = fn, out

    def replay(self):
        self.out.copy_(self.fn())


def test_a_shape_is_captured_at_its_second_use_and_a_failed_capture_turns_graphs_off(code_ids, monkeypatch):
    lm = load("qwen2-lean")
    fixed, eager = pair(lm)
    pg = fixed.graphs
    pg.capture = True
    captured = []

    def capture(g, cache, keys):
        fn = lambda: pg._pass(g, cache, keys)  # noqa: E731
        g.out = fn()
        g.graph = Replay(fn, g.out)
        captured.append((g.idx.shape[1], keys))

    monkeypatch.setattr(pg, "_capture", capture)
    for r in (fixed, eager):
        r.extend(code_ids[:40])
    tree = ([5, 6, 7], [-1, 0, 0])
    for use in range(3):
        same(fixed, eager, *tree, range(3))
        for r in (fixed, eager):
            r.rollback(40)
        assert captured == ([] if use == 0 else [(4, graphs.KEY_STEP)])  # first use uncaptured, then once
    same(fixed, eager, [9], [-1], [0])
    assert len(captured) == 1 and len(pg.graphs) == 2  # a one-node shape used once: no capture

    def fail(g, cache, keys):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(pg, "_capture", fail)
    for r in (fixed, eager):
        r.rollback(40)
    for _ in range(2):  # the second use fails to capture: that pass and every later one run eagerly
        same(fixed, eager, [9], [-1], [0])
        for r in (fixed, eager):
            r.rollback(40)
    assert pg.failed.startswith("RuntimeError") and not pg.graphs
    same(fixed, eager, *tree, range(3))
    assert not pg.graphs


def test_graphs_of_a_dropped_or_grown_cache_are_let_go(code_ids, monkeypatch):
    """A graph holds its cache's buffers; once the engine lets the document go (or the cache grows),
    the next new shape drops those graphs and the buffers with them."""
    import gc
    import weakref

    lm = load("qwen2-lean")
    r = Runner(lm, 64, backend="lean", cuda_graphs=True)
    pg = r.graphs
    pg.capture = True

    def capture(g, cache, keys):  # a real graph holds the buffers (keep), not the cache object
        ref = weakref.ref(cache)
        fn = lambda: pg._pass(g, ref(), keys)  # noqa: E731
        g.out = fn()
        g.graph = Replay(fn, g.out)
        g.keep = (tuple(cache.k), tuple(cache.v))

    monkeypatch.setattr(pg, "_capture", capture)
    r.extend(code_ids[:20])
    doc = r.new_held(64)
    mine = r.hold(doc)
    r.extend(code_ids[100:130])
    for _ in range(2):  # a captured graph for the other document's cache
        r.forward([5], [-1], [0])
    buffer = weakref.ref(doc.cache.k[0])
    r.hold(mine)
    del doc
    gc.collect()
    assert buffer() is not None and len(pg.graphs) == 1  # the graph still holds it
    r.forward([6, 7], [-1, 0], [1])  # a new shape: the dead document's graph goes
    gc.collect()
    assert buffer() is None and [k[0] for k in pg.graphs] == [2]
    old = weakref.ref(r.cache.k[0])
    for _ in range(2):
        r.forward([6, 7], [-1, 0], [1])
    r.extend(code_ids[:60])  # 60 + 4 padding rows > 64 slots: the next pass grows the cache
    r.forward([8, 9, 10], [-1, 0, 1], [2])
    gc.collect()
    assert old() is None and all(k[2] == r.cache.k[0].data_ptr() for k in pg.graphs)


def test_the_native_cpu_layer_keeps_its_own_passes():
    """An int8 Qwen2 on completiond's kernel runs each layer as one C call: nothing to replay."""
    from completiond.models.kernels import cpu_kernel
    from completiond.models.quant import quantize

    if not cpu_kernel.enabled():
        pytest.skip("completiond's kernel does not run here")
    lm = tiny.loaded(tiny.qwen2_config(hidden=64), seed=1)
    quantize(lm.model, "int8")
    r = Runner(lm, backend="lean", cuda_graphs=True)
    assert r.base.native is not None and r.graphs is None
