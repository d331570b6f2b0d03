"""Weight-only int8/int4 on torch's CPU kernels, and the exact cheap output layer."""

import copy

import pytest
import torch
from torch import nn

import tiny
from completiond.models import quant
from completiond.models.kernels import cpu_kernel
from completiond.models.quant import QuantLinear, exact_head_logits, head_bound, quantize
from completiond.core.forward.runner import Runner, drain
from test_runner import load

SCHEMES = ["int8", "int4"]


def linear(n: int, k: int, bias: bool = False, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    m = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        m.weight.normal_(0, 0.05)
    return m


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("n", [64, 200, 521])  # 200, 521: int4 pads rows to a multiple of 16
def test_quant_linear_runs_its_dequantized_weight(scheme, n):
    """fp32 activations: the kernel's output equals x @ W^T with the dequantized weight (1e-5), for
    2-D, 3-D and empty inputs, with a bias; the dequantized weight is near the original one. Where
    this CPU rounds int8 layers' activations (cpu_kernel.activations), within their rounding."""
    lin = linear(n, 128, bias=True)
    q = QuantLinear.from_linear(lin, scheme)
    deq = q.dequantize()
    assert deq.shape == (n, 128)
    step = 0.05 * 4 / (127 if scheme == "int8" else 7.5)  # about the quantization step at 4 sigma
    assert (deq - lin.weight).abs().max() < step
    x = torch.randn(2, 5, 128)
    torch.testing.assert_close(q(x, activations="float32"), x @ deq.T + lin.bias, rtol=0, atol=1e-5)
    # int8 activations: each within half a step (block max / 127) of x, times |w| summed
    atol = 0.5 * x.abs().max() / 127 * deq.abs().sum(1).max() if cpu_kernel.activations() == "int8" else 5e-4
    torch.testing.assert_close(q(x), x @ deq.T + lin.bias, rtol=0, atol=float(atol))
    assert q(torch.randn(0, 128)).shape == (0, n)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_quant_linear_bf16_within_rounding(scheme):
    """bf16 activations (the fast path): within bf16 output rounding of the dequantized matmul."""
    lin = linear(256, 128).to(torch.bfloat16)
    q = QuantLinear.from_linear(lin, scheme)
    x = torch.randn(7, 128).bfloat16()
    ref = x.float() @ q.dequantize().T
    assert ((q(x).float() - ref).abs() <= ref.abs() * 2 ** -8 + 1e-3).all()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_fused_layers_equal_the_parts(scheme):
    """q/k/v-style fusion: one packed matmul (or the parts in turn, where the int4 layout forbids it)."""
    block = quant.int4_row_block()  # the packer's row block: 64 with AVX512, 32 with AVX2 (torch 2.13)
    assert block in (32, 64)
    x = torch.randn(3, 64)
    for sizes in ([2 * block, block, block], [block, block // 2, block // 2]):  # half-block int4 parts cannot be concatenated
        parts = [QuantLinear.from_linear(linear(n, 64, bias=True, seed=i), scheme) for i, n in enumerate(sizes)]
        alone = [p(x) for p in parts]
        fused = QuantLinear.cat(parts)
        torch.testing.assert_close(fused(x), torch.cat(alone, -1), rtol=0, atol=1e-6)
        if isinstance(fused, QuantLinear):  # the parts now read the fused weights: one copy in memory
            ptr = fused.packed.untyped_storage().data_ptr()
            assert all(p.packed.untyped_storage().data_ptr() == ptr for p in parts)
            for p, want in zip(parts, alone):
                torch.testing.assert_close(p(x), want, rtol=0, atol=0)


@pytest.mark.parametrize("native", [False, True])
def test_int4_keeps_attention_int8_and_its_output_layer_w4_on_completiond_kernel(native, monkeypatch):
    """The int4 scheme is int4 in the MLP ("w4" where completiond's int4 kernel runs, torch's int4
    elsewhere) and in the output layer where completiond's kernel runs it (w4, else int8);
    attention stays int8; a fused q/k/v of mixed schemes runs as parts."""
    if native and not quant.w4_native():
        pytest.skip("no completiond int4 kernel here")
    monkeypatch.setattr(quant, "w4_native", lambda: native)
    lm = tiny.loaded(tiny.qwen2_config())
    quantize(lm.model, "int4")
    kinds = {name.rsplit(".", 1)[-1]: m.scheme for name, m in lm.model.named_modules() if isinstance(m, QuantLinear)}
    mlp = "w4" if native else "int4"
    assert kinds == {"q_proj": "int8", "k_proj": "int8", "v_proj": "int8", "o_proj": "int8",
                     "gate_proj": mlp, "up_proj": mlp, "down_proj": mlp, "lm_head": "w4" if native else "int8"}
    assert quant.scheme_of(lm.model) == "int4"
    x = torch.randn(3, 64)
    parts = [QuantLinear.from_linear(linear(64, 64, seed=i), s) for i, s in enumerate(["int8", "int4"])]
    torch.testing.assert_close(QuantLinear.cat(parts)(x), torch.cat([p(x) for p in parts], -1), rtol=0, atol=1e-6)


def test_bad_scheme_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown quantization scheme 'int3'"):
        quantize(tiny.loaded(tiny.qwen2_config()).model, "int3")
    with pytest.raises(ValueError, match="int4 needs a group"):
        QuantLinear.from_linear(linear(64, 96), "int4", group=64)


def tolerance(scheme: str, ref: torch.Tensor) -> float:
    """1e-4, or for int4 on completiond's kernel ("w4": activations rounded to int8 per block of 128,
    2^-8 of a block's largest, so a 1e-6 difference upstream can move a rounding by a whole step)
    5 % of the logits' scale (the native layer's int8 tolerance, tests/test_native_layer.py)."""
    return 5e-2 * float(ref.abs().max()) if scheme == "int4" and quant.w4_native() else 1e-4


def dequantized_reference(model: nn.Module) -> nn.Module:
    """A copy of a quantized model whose QuantLinears are nn.Linears holding the dequantized weights."""
    ref = copy.deepcopy(model)
    for module in list(ref.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, QuantLinear):
                lin = nn.Linear(child.in_features, child.out_features, bias=child.bias is not None)
                with torch.no_grad():
                    lin.weight.copy_(child.dequantize())
                    if child.bias is not None:
                        lin.bias.copy_(child.bias)
                setattr(module, name, lin)
    return ref


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("cfg", ["qwen2", "qwen2-tied", "gemma-window8"])
def test_quantized_model_matches_dequantized_reference(cfg, scheme, code_ids):
    """Every decoder linear and the output layer quantized: logits within 1e-4 of the same model
    with the dequantized weights in nn.Linear (fp32), and not equal to the unquantized model's."""
    lm = load(cfg)
    ids = torch.tensor([code_ids[:24]])
    with torch.no_grad():
        before = lm.model(ids).logits
        quantize(lm.model, scheme)
        assert quant.scheme_of(lm.model) == scheme
        assert not any(type(m) is nn.Linear for m in lm.model.modules())
        got = lm.model(ids).logits
        ref = dequantized_reference(lm.model)(ids).logits
    torch.testing.assert_close(got, ref, rtol=0, atol=tolerance(scheme, ref))
    assert (got - before).abs().max() > 1e-3


def path_of(nodes, parents, i):
    path = []
    while i >= 0:
        path.append(nodes[i])
        i = parents[i]
    return path[::-1]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("cfg", ["qwen2", "qwen2-tied-lean", "gemma-window8-lean"])
def test_quantized_tree_pass_equals_each_path(cfg, scheme, code_ids):
    """The quantized model's tree pass (either backend, fp32 activations) gives each node the logits of
    a plain forward of the same quantized model over its path (1e-4) and the same argmax."""
    lm = load(cfg)
    quantize(lm.model, scheme)
    ctx = code_ids[:40]
    r = Runner(lm, backend="lean" if cfg.endswith("-lean") else "transformers")
    r.extend(ctx)
    nodes, parents = [ctx[39]] + [101, 102, 103, 104, 105], [-1, 0, 0, 1, 3, 2]
    r.rollback(39)
    logits = r.forward(nodes, parents, range(len(nodes)))
    for i in range(len(nodes)):
        with torch.no_grad():
            alone = lm.model(torch.tensor([ctx[:39] + path_of(nodes, parents, i)])).logits[0, -1]
        torch.testing.assert_close(logits[i], alone, rtol=0, atol=tolerance(scheme, alone))
        assert logits[i].argmax() == alone.argmax()


# bf16 passes are not bit-stable across pass shapes (a one-token pass and a tree pass over the same path
# differ by up to ~0.1 in a tiny int4 model's logits through transformers: bf16 attention over a different
# number of keys rounds differently; the lean forward attends in float32 and still differs by ~0.016 with
# int4), so in bf16 only nodes whose argmax is clear of that noise must agree.
BF16_NOISE = 0.25


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("backend", ["transformers", "lean"])
def test_quantized_tree_argmax_equals_one_token_passes(backend, scheme, dtype, code_ids):
    """Each tree node's argmax equals the argmax after one-token passes along its path, same runner
    (refined top rows in bf16): every node in fp32 activations, nodes clear of bf16 noise in bf16."""
    lm = tiny.loaded(tiny.qwen2_config(hidden=128), dtype=dtype, scale=4.0)
    quantize(lm.model, scheme)
    ctx = code_ids[:30]
    nodes = [101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112]
    parents = [-1, 0, 0, 1, 3, 2, 5, 6, 4, 8, -1, 10]
    r = Runner(lm, backend=backend)
    r.extend(ctx)
    tree = r.forward(nodes, parents, range(len(nodes)))
    checked = 0
    for i in range(len(nodes)):
        path = path_of(nodes, parents, i)
        r.rollback(len(ctx))
        for t in path[:-1]:
            r.forward([t], [-1], [])
            r.keep([0])
        one = r.forward([path[-1]], [-1], [0])[0]
        top = one.topk(2).values
        if dtype == torch.float32 or top[0] - top[1] > BF16_NOISE:
            assert one.argmax() == tree[i].argmax(), f"node {i}"
            checked += 1
    assert checked >= 4  # the test has teeth in bf16 too


def head_pair(scheme: str, dtype=torch.float32, vocab: int = 512, hidden: int = 64, seed: int = 0):
    torch.manual_seed(seed)
    lin = nn.Linear(hidden, vocab, bias=False).to(dtype)
    with torch.no_grad():
        lin.weight.normal_(0, 1.0)
    q = QuantLinear.from_linear(lin, scheme, norms=True)
    q.full_weight = lin.weight.detach()
    return lin, q


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_head_bound_holds(scheme, dtype):
    """|full-precision logit (float32) - low-bit logit as the kernel computes it| <= the bound, every row."""
    lin, q = head_pair(scheme, dtype)
    h = (torch.randn(16, 64) * 3).to(dtype)
    low = q(h).float()
    exact = h.float() @ lin.weight.float().T
    assert ((exact - low).abs() <= head_bound(q, h, low)).all()


@pytest.mark.parametrize("max_share", [0.25, 0.0])  # 0.0: the fallback through the dense head in bf16/fp32
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_exact_head_argmax_with_forced_near_ties(scheme, dtype, max_share):
    """Rows b and a whose full-precision logits differ by less than the quantization bound: the cheap
    head's argmax is the full head's either way round, while the low-bit head alone gets some wrong."""
    low_wrong = 0
    for trial in range(24):
        lin, _ = head_pair(scheme, dtype, seed=trial)
        h = torch.randn(1, 64).to(dtype)
        hf = h.float()[0]
        a, b = 7, 300
        gap = (1 if trial % 2 else -1) * 1e-2 * (trial // 2 + 1)  # full logit of b minus a's
        with torch.no_grad():
            w = lin.weight.float()
            w[a] += hf * (100.0 - w[a] @ hf) / (hf @ hf)  # row a's logit is 100: far above the rest
            w[b] = torch.randn(64) * 1.0
            w[b] += hf * (100.0 + gap - w[b] @ hf) / (hf @ hf)
            lin.weight.copy_(w.to(dtype))
        q = QuantLinear.from_linear(lin, scheme, norms=True)
        q.full_weight = lin.weight.detach()
        full = hf @ lin.weight.detach().float().T
        assert abs(full[b] - full[a]) < head_bound(q, h, q(h).float())[0, [a, b]].min()  # a real near-tie
        got = exact_head_logits(q, h, max_share)
        assert got.argmax() == full.argmax() == (b if full[b] > full[a] else a)
        finite = got[0].isfinite()
        assert finite.sum() < 32  # only the rows that could win were recomputed
        torch.testing.assert_close(got[0, finite], full[finite], rtol=0, atol=1e-4)
        low_wrong += int(q(h).float().argmax() != full.argmax())
    assert low_wrong > 0  # the near-ties are ones the low-bit head alone gets wrong


@pytest.mark.parametrize("scheme", SCHEMES)
def test_runner_cheap_head_is_the_full_heads_argmax(scheme, code_ids):
    """Runner(cheap_head=True) on a quantized model: every node's argmax and finite logits equal the
    same quantized decoder with the full-precision output layer (fp32), on a tree."""
    lm = load("qwen2-lean")
    quantize(lm.model, scheme, full_head=True)
    full = copy.deepcopy(lm)
    head = full.model.get_output_embeddings()
    dense = nn.Linear(head.in_features, head.out_features, bias=False)
    dense.weight = nn.Parameter(head.full_weight.clone())
    full.model.set_output_embeddings(dense)
    ctx, nodes, parents = code_ids[:30], [101, 102, 103, 104, 105], [-1, 0, 0, 1, 3]
    got, want = [], []
    for model, kw in ((lm, {"cheap_head": True}), (full, {})):
        r = Runner(model, backend="lean", **kw)
        r.extend(ctx, chunk=7)  # chunks before the last ask for no logits
        (got if kw else want).append(r.forward(nodes, parents, range(len(nodes))))
    got, want = got[0], want[0]
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    finite = got.isfinite()
    assert finite.sum(-1).max() < got.shape[1]  # it did skip rows
    torch.testing.assert_close(got[finite], want[finite], rtol=0, atol=1e-5)


def test_int8_prefill_in_bulk_equals_the_kernel_path():
    """Prefill chunks run int8 layers on dequantized weights (cheaper for many rows); the logits
    equal the per-row kernel's within float32 rounding."""
    from completiond.models.quant import bulk

    lm = tiny.loaded(tiny.qwen2_config(hidden=128), seed=4)
    quantize(lm.model, "int8")
    ids = tiny.qwen_tokenizer().encode((tiny.STDLIB / "textwrap.py").read_text()[:3000], add_special_tokens=False)[:200]
    x = torch.tensor([ids])
    with torch.inference_mode():
        plain = lm.model(x).logits[0]
        with bulk():
            fast = lm.model(x).logits[0]
    torch.testing.assert_close(fast, plain, rtol=0, atol=1e-4)


@pytest.mark.parametrize("scheme", ["int8", "none"])
def test_bf16_prefill_multiplies_in_float32_where_bf16_matmuls_are_slow(monkeypatch, scheme):
    """On CPUs without bf16 units (`LoadedModel.bulk_dtype` float32, device.pick_bulk_dtype), prefill
    chunks widen weights and activations to float32 for their many-row matmuls (5x faster on an AVX2
    EPYC): every such matmul runs in float32, the logits match the bf16 matmuls' within bf16
    rounding, and decode-sized passes keep their usual path."""
    import torch.nn.functional as F

    lm = tiny.loaded(tiny.qwen2_config(hidden=128), seed=4, dtype=torch.bfloat16)
    if scheme != "none":
        quantize(lm.model, scheme)
    ids = tiny.qwen_tokenizer().encode((tiny.STDLIB / "textwrap.py").read_text()[:3000], add_special_tokens=False)[:200]
    seen: list[tuple[int, torch.dtype]] = []
    linear = F.linear

    def spy(x, w, b=None):
        seen.append((x.numel() // x.shape[-1], x.dtype))
        return linear(x, w, b)

    monkeypatch.setattr(F, "linear", spy)
    out = {}
    for dt in (None, torch.float32):
        lm.bulk_dtype, seen[:] = dt, []
        r = Runner(lm, backend="lean", refine=False)
        out[dt] = r.extend(ids, chunk=64)
        many = {d for rows, d in seen if rows > quant.BULK_ROWS}
        assert many == ({torch.float32} if dt else {torch.bfloat16})
        seen[:] = []
        r.forward([5, 6], [-1, 0], [0, 1])  # a 2-node pass: not prefill, no widening
        assert all(d == torch.bfloat16 for _, d in seen)
    torch.testing.assert_close(out[torch.float32], out[None], rtol=0.05, atol=0.05)
    assert out[torch.float32].argmax() == out[None].argmax()


@pytest.mark.parametrize("kind", ["untied", "untied int8", "tied int8", "tied"])
def test_embedding_served_from_a_file_mapping(tmp_path, code_ids, kind):
    """The input embedding is mapped from a file written once into the model's cache folder when no
    pass reads it whole (an output layer of its own, or a quantized one that only gathers its rows):
    the same bf16 values, so the same logits bit for bit; its rows are not copied into memory. A tied,
    unquantized output layer reads it every pass: it stays in memory."""
    from completiond.models.loader import map_embedding

    def model():
        lm = tiny.loaded(tiny.qwen2_config(hidden=128, tied=kind.startswith("tied")), seed=3, dtype=torch.bfloat16)
        if kind.endswith("int8"):
            quantize(lm.model, "int8")
        return lm

    plain, mapped = model(), model()
    assert map_embedding(mapped.model, tmp_path) == (kind != "tied")
    w = mapped.model.get_input_embeddings().weight
    files = list(tmp_path.glob("embed_tokens.*.bin"))
    if kind == "tied":
        assert not files
        return
    assert len(files) == 1 and files[0].stat().st_size == w.numel() * 2
    assert torch.equal(w, plain.model.get_input_embeddings().weight)
    assert not w.untyped_storage().resizable()  # a file mapping, not an allocation
    head = mapped.model.get_output_embeddings()
    if getattr(head, "full_weight", None) is not None:  # tied + quantized: the refinement reads the mapping
        assert head.full_weight.data_ptr() == w.data_ptr()
    outs = []
    for lm in (plain, mapped):
        r = Runner(lm, backend="lean")
        outs.append(torch.stack([r.extend(code_ids[:40]), r.extend(code_ids[:41])]))
    assert torch.equal(outs[0], outs[1])
    assert map_embedding(model().model, tmp_path) and list(tmp_path.glob("embed_tokens.*.bin")) == files  # reused


def assert_refined_with(lm, rows: torch.Tensor, code_ids: list[int]) -> None:
    """The runner's refined top logits are the float32 dot products of the final hidden state with
    these output rows [V, H]."""
    r = Runner(lm, backend="lean", refine=True)
    _, last = drain(r.extend_chunks(code_ids[:20]))  # [H] after the last token
    h = last[None]
    logits = r._logits(h)
    best = logits[0].topk(r.refine).indices
    torch.testing.assert_close(logits[0, best], h.float()[0] @ rows[best].T, rtol=0, atol=1e-5)


def test_untied_head_keeps_an_int8_residual_instead_of_a_full_precision_copy(code_ids):
    """An untied output layer (the Qwen2.5-Coder GGUFs) keeps its int8 error in int8 (half the bf16
    copy's bytes): the rows the bf16 refinement rescores with are the full-precision ones within
    2^-15 of each row's largest weight, and the refined logits those rows' float32 dot products.
    A tied one keeps the embedding (no copy)."""
    from completiond.models.quant import full_weight, head_rows

    lm = tiny.loaded(tiny.qwen2_config(hidden=128), dtype=torch.bfloat16, scale=4.0)
    full = lm.model.get_output_embeddings().weight.detach().float().clone()
    quantize(lm.model, "int8")
    head = lm.model.get_output_embeddings()
    assert head.full_weight is None and head.residual[0].dtype == torch.int8
    rows = head_rows(head, torch.arange(head.out_features))
    err = (rows - full).abs().amax(1) / full.abs().amax(1)
    assert err.max() < 2 ** -15
    deq = head.packed.float() * head.scales.float()[:, None]
    assert ((deq - full).abs().amax(1) / full.abs().amax(1)).max() > 2 ** -10  # int8 alone is far coarser
    torch.testing.assert_close(full_weight(head).float(), rows, rtol=2 ** -8, atol=0)  # for training heads
    assert_refined_with(lm, rows, code_ids)
    with pytest.raises(ValueError, match="full_head=True"):
        Runner(lm, cheap_head=True)

    tied = tiny.loaded(tiny.qwen2_config(hidden=128, tied=True), dtype=torch.bfloat16, scale=4.0)
    quantize(tied.model, "int8")
    kept = tied.model.get_output_embeddings().full_weight
    assert kept.data_ptr() == tied.model.get_input_embeddings().weight.data_ptr()  # the same storage


def test_an_int4_targets_w4_output_layer_refines_with_rows_near_the_full_ones(code_ids):
    """Under int4 on completiond's kernel the output layer is w4 (37 % fewer bytes a one-token pass
    reads) with its w4 error kept in int8: the rows the refinement rescores with are within 2^-11 of
    each row's largest weight of the full-precision ones (w4 alone: ~2^-5), gathered from whole
    vectors of 8 channels for any index shape, and the refined logits are their float32 dot products."""
    from completiond.models.quant import full_weight, head_rows

    if not quant.w4_native():
        pytest.skip("no completiond int4 kernel here")
    lm = tiny.loaded(tiny.qwen2_config(hidden=128), dtype=torch.bfloat16, scale=4.0)
    full = lm.model.get_output_embeddings().weight.detach().float().clone()
    quantize(lm.model, "int4")
    head = lm.model.get_output_embeddings()
    assert head.scheme == "w4" and head.full_weight is None and head.residual[0].dtype == torch.int8
    every = torch.arange(head.out_features)
    low = head_rows(head, every, low_bits=True)
    assert torch.equal(low, head.dequantize())  # what the kernel multiplies by
    rows = head_rows(head, every)
    scale = full.abs().amax(1)
    assert ((rows - full).abs().amax(1) / scale).max() < 2 ** -11
    assert ((low - full).abs().amax(1) / scale).max() > 2 ** -7  # w4 alone is far coarser
    some = torch.tensor([[5, 3, 200], [17, 16, head.out_features - 1]])
    # [2, 3, H]: any shape, repeats, one vector twice, both vectors of a pair, the last vector
    assert torch.equal(head_rows(head, some), rows[some])
    torch.testing.assert_close(full_weight(head).float(), rows, rtol=2 ** -8, atol=0)
    assert_refined_with(lm, rows, code_ids)


def test_a_quantized_target_gets_an_int8_draft(tiny_dir, tmp_path):
    """The draft runs on the same int8 path as a quantized target (it only ranks guesses: the output
    stays the target's); a full-precision target keeps a full-precision draft."""
    from completiond.models.loader import load, load_draft

    draft_dir = tiny.save(tmp_path / "draft", tiny.gemma_config(window=16, layers=1), seed=7, scale=4.0)
    for scheme, want in (("int8", "int8"), ("int4", "int8"), ("none", "none")):
        target = load(str(tiny_dir), "target", "cpu", "bfloat16", scheme)
        draft = load_draft(str(draft_dir), target)
        assert draft.meta["quant"] == want
        layers = [m for m in draft.model.modules() if isinstance(m, QuantLinear)]
        assert bool(layers) == (want != "none")
