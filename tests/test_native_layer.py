"""The native Qwen2 layer (models/kernels/qwen2_layer.c): the same model as the torch ops it replaces, and a
tree node bit-identical to the same token in a one-token pass (what greedy identity rests on)."""

import pytest
import torch

import tiny
from completiond.models.kernels import cpu_kernel
from completiond.models import quant
from completiond.models.quant import quantize
from completiond.core.forward.runner import Runner
from completiond.models.device import cpu_flags

needs_kernel = pytest.mark.skipif(not cpu_kernel.wanted(), reason="no x86 CPU with AVX2 + FMA here")
PROMPT = list(range(5, 70))


@pytest.fixture(params=cpu_kernel.ACTIVATIONS)
def acts(request, monkeypatch) -> str:
    """Every int8 matmul with float32 activations, then rounded to int16 (a16_mm.c), then to int8
    (a8_mm.c), each on the widest sums this CPU has, as where measured fastest."""
    monkeypatch.setattr(cpu_kernel, "activations", lambda: request.param)
    return request.param


@pytest.fixture(params=cpu_kernel.ATTENTION)
def attn(request, monkeypatch) -> str:
    """A bf16 cache's attention scores as float32 dot products, then as bf16 ones (vdpbf16ps: where
    the CPU has AVX512-BF16, as cpu_kernel.attention picks them there)."""
    if request.param == "bf16" and not cpu_kernel.AVX512_BF16 <= cpu_flags():
        pytest.skip("no AVX512-BF16 here")
    monkeypatch.setattr(cpu_kernel, "attention", lambda: request.param)
    return request.param


def runner(dtype: torch.dtype, hidden: int = 128, seed: int = 2, scheme: str = "int8") -> Runner:
    lm = tiny.loaded(tiny.qwen2_config(layers=2, hidden=hidden), seed=seed, scale=4.0)
    if dtype != torch.float32:
        lm.model.to(dtype)
        lm.dtype = dtype
    quantize(lm.model, scheme)
    r = Runner(lm, backend="lean")
    assert r.base.native is not None, f"{scheme} Qwen2 on completiond's kernel should run the native layer"
    r.extend(PROMPT)
    return r


def one_token_passes(r: Runner, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and final hidden states of ids decoded one pass per token (committed as they go)."""
    logits, hidden = [], []
    for t in ids:
        done = r.run_pass([t], [-1], [0])
        logits.append(done.logits)
        hidden.append(done.hidden)
        r.keep([0])
    r.rollback(len(PROMPT))
    return torch.cat(logits), torch.cat(hidden)


@needs_kernel
@pytest.mark.parametrize("dtype,hidden", [(torch.float32, 128), (torch.bfloat16, 128), (torch.bfloat16, 256),
                                          (torch.bfloat16, 512)])
def test_tree_nodes_equal_one_token_passes_bit_for_bit(dtype, hidden, acts, attn):
    """Heads of 32, 64 and 128: bf16 scores with keys across lanes (up to 64) and read in place (128);
    value sums of 2 or 4 queries a tile where the 512-bit code runs."""
    r = runner(dtype, hidden=hidden)
    # a tree: root 7, children 8 and 20, 9 below 8, 21 below 20, 10 below 9
    ids, parents = [7, 8, 20, 9, 21, 10], [-1, 0, 0, 1, 2, 3]
    done = r.run_pass(ids, parents, range(len(ids)))
    tree, tree_hidden = done.logits, done.hidden
    r.rollback(len(PROMPT))
    for path in ([0, 1, 3, 5], [0, 2, 4]):
        logits, hidden = one_token_passes(r, [ids[i] for i in path])
        assert torch.equal(tree[path], logits), path
        assert torch.equal(tree_hidden[path], hidden), path


def bf16_attention_logits(hidden: int, switch: str, values: tuple[int, int], default: int) -> dict[int, torch.Tensor]:
    """Logits of a 4-node tree after 262 keys with bf16 attention (AVX512-BF16 CPUs), with the kernel's
    `switch` (a completiond_* function) set to each of `values` in turn, then back to `default`."""
    if not cpu_kernel.AVX512_BF16 <= cpu_flags():
        pytest.skip("no AVX512-BF16 here")
    set_to = getattr(cpu_kernel.library(), switch)
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu_kernel, "attention", lambda: "bf16")
        r = runner(torch.bfloat16, hidden=hidden)
        r.extend(PROMPT + list(range(3, 200)))
        n = r.length
        try:
            for v in values:
                assert set_to(v) == v
                out[v] = r.forward([7, 8, 20, 9], [-1, 0, 0, 1], range(4))
                r.rollback(n)
        finally:
            set_to(default)
    return out


@needs_kernel
@pytest.mark.parametrize("hidden", [128, 256])  # heads of 32 and 64
def test_scores_with_keys_across_lanes_are_the_in_place_scores_summed_otherwise(hidden):
    """bf16 scores: laying a block of keys across lanes (heads of up to 64 dims, the transposition in
    registers) sums the same exact bf16 products as reading them in place, in another order: logits
    over several key blocks differ by a bf16 step of the activations at most (~0.3 % of their scale
    here), where a wrong lane or dimension in the transposition moves them by 3-8 % and rounding the
    queries to bf16 does by ~1.5 %."""
    out = bf16_attention_logits(hidden, "completiond_score_lanes", (64, 0), 64)
    assert (out[64] - out[0]).abs().max() <= 0.01 * out[0].abs().max()


@needs_kernel
@pytest.mark.parametrize("hidden", [128, 256, 512])  # heads of 32, 64, 128
def test_value_pairs_are_the_float32_value_sums_with_bf16_weights(hidden):
    """Value sums over pairs of keys (bf16 weights, vdpbf16ps) against one key at a time in float32:
    the weights' rounding moves logits by about a bf16 step of the activations (~0.3 % of their scale
    here); pairing a weight with the wrong value row moves them by several percent."""
    out = bf16_attention_logits(hidden, "completiond_value_pairs", (1, 0), 1)
    assert (out[1] - out[0]).abs().max() <= 0.01 * out[0].abs().max()


@needs_kernel
def test_appended_pass_and_committed_nodes_match(acts, attn):
    """A draft growing its tree pass by pass (append=True), then keep: the next pass after the
    kept nodes equals plain decoding."""
    r = runner(torch.bfloat16)
    first = r.forward([7, 8], [-1, 0], [0, 1])
    second = r.forward([9, 30], [1, 0], [0, 1], append=True)  # 9 below 8, 30 below 7
    r.keep([0, 1, 2])  # 7, 8, 9
    after = r.forward([10], [-1], [0])
    r.rollback(len(PROMPT))
    plain, _ = one_token_passes(r, [7, 8, 9, 10])
    assert torch.equal(first, plain[:2]) and torch.equal(second[:1], plain[2:3]) and torch.equal(after, plain[3:])


@needs_kernel
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 0.05)])
def test_same_model_as_the_torch_ops(dtype, tol, acts, attn):
    """Float32 throughout vs the torch path (bf16 rounds activations between ops there); int16
    activations stay within the same tolerance (each within 2^-16 of its block's largest), int8 ones
    within 0.05 of the logits' scale (2^-8 of a block's largest)."""
    tol = max(tol, 0.05) if acts == "int8" else tol
    r = runner(dtype)
    ids, parents = [7, 8, 9, 10, 11, 3, 4], [-1, 0, 1, 2, 3, 0, 5]
    native = r.forward(ids, parents, range(len(ids)))
    r.rollback(len(PROMPT))
    with pytest.MonkeyPatch.context() as mp:  # other activations: a different model, within tolerance
        mp.setattr(cpu_kernel, "activations", lambda: "int16" if acts != "int16" else "float32")
        assert not torch.equal(r.forward(ids, parents, range(len(ids))), native)
    r.rollback(len(PROMPT))
    if dtype == torch.bfloat16 and attn == "bf16":
        with pytest.MonkeyPatch.context() as mp:  # float32 scores: a different model (the bf16 path runs)
            mp.setattr(cpu_kernel, "attention", lambda: "float32")
            other = r.forward(ids, parents, range(len(ids)))
            assert not torch.equal(other, native) and (other - native).abs().max() <= tol * native.abs().max()
        r.rollback(len(PROMPT))
    saved, r.base.native = r.base.native, None
    torch_ops = r.forward(ids, parents, range(len(ids)))
    r.base.native = saved
    scale = torch_ops.abs().max()
    assert (native - torch_ops).abs().max() <= tol * scale
    assert torch.equal(native.argmax(-1), torch_ops.argmax(-1))


@needs_kernel
def test_thread_count_does_not_change_results(acts, attn):
    r = runner(torch.bfloat16)
    ids, parents = list(range(20, 29)), [-1, 0, 1, 2, 3, 4, 0, 6, 7]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = r.forward(ids, parents, range(len(ids)))
        r.rollback(len(PROMPT))
        torch.set_num_threads(max(3, before))
        assert torch.equal(r.forward(ids, parents, range(len(ids))), one)
    finally:
        torch.set_num_threads(before)


@needs_kernel
def test_long_context_and_head_size_without_a_64_multiple(acts, attn):
    """Head size 16 (the value sums' short tail), keys past several blocks of 64, a grown cache."""
    r = runner(torch.bfloat16, hidden=64, seed=5)  # 4 heads of 16
    long = list(range(3, 300))
    r.extend(PROMPT + long)
    r.rollback(len(PROMPT) + len(long))
    tree = r.forward([7, 8, 9], [-1, 0, 0], [0, 1, 2])
    r.rollback(len(PROMPT) + len(long))
    a = r.forward([7], [-1], [0])
    r.keep([0])
    b = r.forward([8], [-1], [0])
    r.rollback(len(PROMPT) + len(long))
    c = r.forward([7, 9], [-1, 0], [0, 1])
    assert torch.equal(tree[0], a[0]) and torch.equal(tree[1], b[0]) and torch.equal(tree[2], c[1])


@needs_kernel
@pytest.mark.parametrize("hidden", [128, 256, 512])  # heads of 32, 64, 128
def test_value_pairs_are_made_of_visible_keys_in_any_tree(hidden):
    """bf16 attention sums a query's values over pairs of consecutive visible keys, so a tree node,
    whose visible keys are its one-token pass's at other slots, sums the same pairs. A tree of the
    engine's most nodes (64: the root, a leaf, a chain of 62 below the root whose nodes each sit one
    slot further than in their one-token passes) after 246 committed keys (the chain crosses a block
    of 64 and its nodes see an odd or even count of keys), then the same after 247: every chain node
    equals its one-token pass."""
    if not cpu_kernel.AVX512_BF16 <= cpu_flags():
        pytest.skip("no AVX512-BF16 here")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu_kernel, "attention", lambda: "bf16")
        r = runner(torch.bfloat16, hidden=hidden)
        ids = [7, 99] + list(range(100, 162))
        parents = [-1, 0, 0] + list(range(2, 63))
        assert len(ids) == len(parents) == 64
        path = [0] + list(range(2, 64))
        for committed in (246, 247):
            r.extend(PROMPT + list(range(3, 3 + committed - len(PROMPT))))
            tree = r.forward(ids, parents, range(len(ids)))
            r.rollback(committed)
            logits = []
            for i in path:
                logits.append(r.forward([ids[i]], [-1], [0]))
                r.keep([0])
            r.rollback(committed)
            assert torch.equal(tree[path], torch.cat(logits)), committed


def test_not_used_without_the_kernel(monkeypatch):
    monkeypatch.setattr(cpu_kernel, "enabled", lambda: False)
    lm = tiny.loaded(tiny.qwen2_config(layers=1), seed=1)
    quantize(lm.model, "int8")
    assert Runner(lm, backend="lean").base.native is None


def test_not_used_for_torch_int4_or_unquantized_models(monkeypatch):
    lm = tiny.loaded(tiny.qwen2_config(layers=1), seed=1)
    assert Runner(lm, backend="lean").base.native is None
    monkeypatch.setattr(quant, "w4_native", lambda: False)  # int4 MLPs on torch's kernel
    quantize(lm.model, "int4")
    assert {m.scheme for m in lm.model.modules() if isinstance(m, quant.QuantLinear)} == {"int8", "int4"}
    assert Runner(lm, backend="lean").base.native is None


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_mlps_run_native_bit_identical_in_trees_and_close_to_the_torch_ops(dtype, acts, attn):
    """quantize(..., "int4") where the w4 kernel runs: MLPs "w4" (attention int8) in the native layer.
    Tree nodes equal one-token passes bit for bit; the torch ops on the same weights (w4_mm per
    matmul) give the same model within int8 activations' tolerance, argmax equal."""
    r = runner(dtype, scheme="int4")
    assert all(n.mlp_w4 for n in r.base.native)
    ids, parents = [7, 8, 20, 9, 21, 10], [-1, 0, 0, 1, 2, 3]
    tree = r.forward(ids, parents, range(len(ids)))
    r.rollback(len(PROMPT))
    for path in ([0, 1, 3, 5], [0, 2, 4]):
        logits, _ = one_token_passes(r, [ids[i] for i in path])
        assert torch.equal(tree[path], logits), path
    saved, r.base.native = r.base.native, None
    torch_ops = r.forward(ids, parents, range(len(ids)))
    r.base.native = saved
    assert (tree - torch_ops).abs().max() <= 0.05 * torch_ops.abs().max()
    assert torch.equal(tree.argmax(-1), torch_ops.argmax(-1))


@needs_kernel
# heads of 24 (16 + a tail of 8: one query at a time), 16, 32, 64 and 128 (several queries a tile)
@pytest.mark.parametrize("hidden", [96, 64, 128, 256, 512])
def test_512_bit_code_gives_the_256_bit_bits(hidden, attn):
    """cpu_kernel.zmm() (AVX512-VNNI CPUs): int4 matmuls of cpu_kernel.zmm_rows() or more rows (here
    from every row count) and the value sums in 512-bit vectors. A tree pass over a context of several key blocks has the same bits with them off, and
    its nodes those of one-token passes."""
    if not cpu_kernel.AVX512_VNNI <= cpu_flags():
        pytest.skip("no AVX512-VNNI here")
    lib = cpu_kernel.library()
    r = runner(torch.bfloat16, hidden=hidden, scheme="int4")
    r.extend(PROMPT + list(range(3, 200)))
    n = r.length
    ids, parents = [7, 8, 20, 9, 21, 10], [-1, 0, 0, 1, 2, 3]
    out = {}
    try:
        lib.completiond_w4_zmm_rows(1)
        for on in (1, 0):
            assert lib.completiond_zmm(on) == on
            out[on] = r.forward(ids, parents, range(len(ids)))
            r.rollback(n)
    finally:
        lib.completiond_zmm(int(cpu_kernel.zmm()))
        lib.completiond_w4_zmm_rows(cpu_kernel.zmm_rows())
    assert torch.equal(out[1], out[0])
    for t, i in ((7, 0), (8, 1)):
        assert torch.equal(r.forward([t], [-1], [0])[0], out[1][i])
        r.keep([0])
