"""A lean forward for the decoders we ship (Gemma 3 text, Qwen2): the same arithmetic as
transformers' `Gemma3TextModel` / `Qwen2Model`, in the same order, on the same weights, with fewer
Python steps (no hooks, kwargs plumbing or output records; rotary tables cached).

A small model's pass is mostly per-module overhead in transformers' eager forward; a large one's is
the matmuls, which this forward fuses: q/k/v (with their biases, Qwen2) and gate/up are one matmul
each. Every matmul goes through a `Linear`: a dense one, or a `quant.QuantLinear` when the model was
quantized (completiond.models.quant), fused the same way. tests/test_runner.py holds its logits to
transformers' within 1e-5 in fp32 on trees, appended passes and past the sliding window.

An int8 Qwen2 on completiond's kernel runs each layer of a decode/verify pass as one C call instead
(`qwen2_layer.c` via cpu_kernel: its matmuls on cpu_kernel.kind(), bit-identical between tree and one-token passes;
tests/test_native_layer.py); prefill chunks keep the torch ops and their dense matmuls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from ...models.kernels import cpu_kernel
from ...models.quant import QuantLinear, bulk_dtype, dequantized_mm, is_bulk

LEAN_MODEL_TYPES = {"gemma3_text", "qwen2"}


def supports_lean(model: nn.Module) -> bool:
    cfg = model.config
    kind = getattr(cfg, "model_type", None)
    if kind == "gemma3_text":
        return (getattr(cfg, "hidden_activation", None) == "gelu_pytorch_tanh"
                and not getattr(cfg, "attention_bias", False)
                and not getattr(cfg, "attn_logit_softcapping", None)
                and not getattr(cfg, "use_bidirectional_attention", False))
    if kind == "qwen2":
        return (getattr(cfg, "hidden_act", None) == "silu" and getattr(cfg, "sliding_window", None) is None
                and set(getattr(cfg, "layer_types", None) or ["full_attention"]) == {"full_attention"})
    return False


def lean_decoder(base: nn.Module) -> LeanGemma3 | LeanQwen2:
    """The lean forward for this decoder (`model.<base_model_prefix>`); see supports_lean."""
    kind = base.config.model_type
    if kind == "gemma3_text":
        return LeanGemma3(base)
    if kind == "qwen2":
        return LeanQwen2(base)
    raise ValueError(f"no lean forward for model type {kind!r}")


class Linear(Protocol):
    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


class Dense:
    """x W^T + b with W [N, K] (several layers' weights concatenated along N)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.weight, self.bias = weight, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        dense = bulk_dtype(x)
        if dense is None or dense == x.dtype:
            return F.linear(x, self.weight, self.bias)
        # prefill on a CPU with slow bf16 matmuls: multiplied in float32 (quant.bulk)
        y = dequantized_mm(x.reshape(-1, x.shape[-1]), self.weight, None, dense).reshape(*x.shape[:-1], -1)
        return y if self.bias is None else y + self.bias


def fused(*layers: nn.Module) -> Linear:
    """One matmul for layers that read the same input, outputs concatenated in order."""
    if all(isinstance(m, QuantLinear) for m in layers):
        return layers[0] if len(layers) == 1 else QuantLinear.cat(list(layers))
    if not all(isinstance(m, nn.Linear) for m in layers):
        raise ValueError(f"cannot fuse layers of types {[type(m).__name__ for m in layers]}")
    w = torch.cat([m.weight for m in layers]) if len(layers) > 1 else layers[0].weight
    biases = [m.bias for m in layers]
    if all(b is None for b in biases):
        return Dense(w)
    b = torch.cat([m.bias if m.bias is not None else w.new_zeros(m.out_features) for m in layers])
    return Dense(w, b)


class GemmaLayer(NamedTuple):
    in_norm: torch.Tensor  # float32 gains (1 + w) [H]
    qkv: Linear  # [H] -> [(heads + 2 kv_heads) d]
    q_norm: torch.Tensor  # [d]
    k_norm: torch.Tensor
    o: Linear
    post_attn_norm: torch.Tensor
    pre_ff_norm: torch.Tensor
    gate_up: Linear  # [H] -> [2 I]
    down: Linear
    post_ff_norm: torch.Tensor


class Qwen2Layer(NamedTuple):
    in_norm: torch.Tensor  # the RMSNorm weight [H] (model dtype, applied after the cast)
    qkv: Linear  # with the q/k/v biases
    o: Linear
    post_attn_norm: torch.Tensor
    gate_up: Linear
    down: Linear


class LeanOutput:
    def __init__(self, last_hidden_state: torch.Tensor):
        self.last_hidden_state = last_hidden_state


class _Lean:
    """Shared parts: rotary tables, attention over the tree cache. Callable like the decoder
    (`base(input_ids=, position_ids=, attention_mask=, cache=)`); returns the final-normed hidden
    states [1, n, hidden] as `.last_hidden_state`. `between_layers`, when given, runs before every
    layer (it raises to stop the pass: how a cancel or a new request stops it within one layer).

    Attention runs in float32 when the model runs in bf16/fp16: torch's bf16 SDPA on CPU gives a
    query a different result over L keys than over L + 1 keys with the extra one masked (up to ~4e-3),
    so a tree node and the same token in a one-token pass would differ by more than rounding and
    could flip a near-tied argmax. In float32 they agree to ~1e-6 before the cast back; the cost is
    nil up to 8 nodes and ~12 % of attention at 64 (0.5B shapes, 1.5k keys)."""

    def __init__(self, base: nn.Module):
        cfg = base.config
        self.base = base
        self.eps = cfg.rms_norm_eps
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.inter = cfg.intermediate_size
        self.embed = base.embed_tokens.weight
        self.types = list(getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers)
        self._rope: dict[tuple[str, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def _rotary_table(self, layer_type: str, positions: torch.Tensor, like: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.base.rotary_emb(like, positions[None])

    def rope(self, layer_type: str, pos: torch.Tensor, dtype: torch.dtype | None = None, top: int | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [1, 1, n, head_dim] at these positions in `dtype` (default the model's), from a
        table that grows as positions do. top: a bound on the positions, given by a pass that a CUDA
        graph captures (reading pos.max() would wait for the device, which a capture forbids)."""
        dtype = dtype or self.embed.dtype
        cos, sin = self._rope.get((layer_type, dtype), (None, None))
        top = int(pos.max()) + 1 if top is None else top
        if cos is None or top > cos.shape[0]:
            size = max(4096, 2 * top)
            like = self.embed.new_zeros(1, dtype=dtype)
            cos, sin = self._rotary_table(layer_type, torch.arange(size, device=pos.device), like)
            cos, sin = cos[0], sin[0]  # [size, head_dim]
            self._rope[(layer_type, dtype)] = (cos, sin)
        return cos[pos][None, None], sin[pos][None, None]

    def _split(self, qkv: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[1, n, (h + 2 kv) d] -> q [1, h, n, d], k, v [1, kv, n, d]."""
        nq, nkv, d = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.head_dim
        q = qkv[..., :nq].view(1, n, self.heads, d).transpose(1, 2)
        k = qkv[..., nq:nq + nkv].view(1, n, self.kv_heads, d).transpose(1, 2)
        v = qkv[..., nq + nkv:].view(1, n, self.kv_heads, d).transpose(1, 2)
        return q, k, v

    def _fold(self, mask):
        """Attention masks [1, 1, n, keys] -> [1, 1, g n, keys] (g query heads per kv head; a dict by
        layer type stays a dict): the rows of `_attend`'s folded queries, built once per pass."""
        g = self.heads // self.kv_heads
        if isinstance(mask, dict):
            return {t: self._fold(m) for t, m in mask.items()}
        if g == 1:
            return mask
        _, _, n, keys = mask.shape
        return mask.expand(1, g, n, keys).reshape(1, 1, g * n, keys)

    def _attend(self, i: int, q, k, v, cos, sin, folded_mask, cache, scale: float) -> torch.Tensor:
        """Rotate, store this pass's K/V, attend; returns [1, n, heads * d].

        The g query heads that share a kv head are folded into the query rows of one head
        ([1, kv, g n, d]): plain attention, no K/V repeat, and no slow single-query path (SDPA with
        enable_gqa takes ~10x longer at n = 1 on CPU, 14 heads over 1.5k keys)."""
        half, n = self.head_dim // 2, q.shape[2]
        q = q * cos + torch.cat((-q[..., half:], q[..., :half]), -1) * sin
        k = k * cos + torch.cat((-k[..., half:], k[..., :half]), -1) * sin
        k, v = cache.update(k, v, i)  # [1, kv, keys, d]: the keys this layer sees
        mask = folded_mask[self.types[i]] if isinstance(folded_mask, dict) else folded_mask
        q = q.reshape(1, self.kv_heads, -1, self.head_dim)  # head j = kv (j // g), row (j % g) n + t
        if q.is_cuda:  # see _attend_cuda
            a = _attend_cuda(q, k, v, mask, scale)
        elif q.dtype == torch.float32:
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        else:  # see the class docstring: float32 keeps a node's output independent of the pass's shape
            a = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask,
                                               scale=scale).to(q.dtype)
        return a.reshape(1, self.heads, n, self.head_dim).transpose(1, 2).reshape(1, n, self.heads * self.head_dim)


def _attend_cuda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
                 ) -> torch.Tensor:
    """Attention in float32 as two matmuls and a softmax: q [1, kv, g n, d], k, v [1, kv, keys, d],
    mask [1, 1, g n, keys] bool. On an H200 torch's float32 SDPA (a cutlass kernel tiled by 64
    queries) runs one block per kv head for a decode pass's few query rows: 179 us a layer over
    1.8k keys, 61 % of a 1.5B pass (benchmarks/results/gpu/profile-sdpa-attention.json); cuBLAS spreads these
    matmuls over the GPU."""
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale  # [1, kv, g n, keys]
    p = torch.where(mask, s, float("-inf")).softmax(-1)
    return torch.matmul(p, v.float()).to(q.dtype)


class LeanGemma3(_Lean):
    def __init__(self, base: nn.Module):
        super().__init__(base)
        cfg = base.config
        self.scaling = cfg.query_pre_attn_scalar ** -0.5
        self.embed_scale = base.embed_tokens.embed_scale.to(self.embed.dtype)
        self.layers = [GemmaLayer(
            in_norm=_gemma_gain(layer.input_layernorm),
            qkv=fused(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj),
            q_norm=_gemma_gain(layer.self_attn.q_norm), k_norm=_gemma_gain(layer.self_attn.k_norm),
            o=fused(layer.self_attn.o_proj),
            post_attn_norm=_gemma_gain(layer.post_attention_layernorm),
            pre_ff_norm=_gemma_gain(layer.pre_feedforward_layernorm),
            gate_up=fused(layer.mlp.gate_proj, layer.mlp.up_proj), down=fused(layer.mlp.down_proj),
            post_ff_norm=_gemma_gain(layer.post_feedforward_layernorm)) for layer in base.layers]
        self.norm = _gemma_gain(base.norm)

    def _rotary_table(self, layer_type, positions, like):
        return self.base.rotary_emb(like, positions[None], layer_type)

    def _norm(self, x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
        """Gemma's RMSNorm: scaled by the float32 gain before the cast back."""
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * gain).type_as(x)

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask, cache,
                 between_layers: Callable[[], None] | None = None, rope_top: int | None = None, **_) -> LeanOutput:
        n = input_ids.shape[1]
        h = F.embedding(input_ids, self.embed) * self.embed_scale  # [1, n, H]
        ropes = {t: self.rope(t, position_ids[0], top=rope_top) for t in set(self.types)}
        attention_mask = self._fold(attention_mask)
        for i, L in enumerate(self.layers):
            if between_layers is not None:  # a cancel lands between layers (the runner keeps the cache consistent)
                between_layers()
            q, k, v = self._split(L.qkv(self._norm(h, L.in_norm)), n)
            q, k = self._norm(q, L.q_norm), self._norm(k, L.k_norm)
            a = self._attend(i, q, k, v, *ropes[self.types[i]], attention_mask, cache, self.scaling)
            h = h + self._norm(L.o(a), L.post_attn_norm)
            gu = L.gate_up(self._norm(h, L.pre_ff_norm))  # [1, n, 2 I]
            m = L.down(F.gelu(gu[..., :self.inter], approximate="tanh") * gu[..., self.inter:])
            h = h + self._norm(m, L.post_ff_norm)
        return LeanOutput(self._norm(h, self.norm))


class LeanQwen2(_Lean):
    def __init__(self, base: nn.Module):
        super().__init__(base)
        self.scaling = self.head_dim ** -0.5
        self.layers = [Qwen2Layer(
            in_norm=layer.input_layernorm.weight,
            qkv=fused(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj),
            o=fused(layer.self_attn.o_proj), post_attn_norm=layer.post_attention_layernorm.weight,
            gate_up=fused(layer.mlp.gate_proj, layer.mlp.up_proj), down=fused(layer.mlp.down_proj))
            for layer in base.layers]
        self.norm = base.norm.weight
        self.native = _native_layers(self)  # None: the torch ops below run every pass
        self._work = torch.empty(0)  # the native layer's scratch (float32)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Qwen2's RMSNorm: normalised in float32, cast back, then scaled by the plain weight."""
        xf = x.float()
        return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask, cache,
                 between_layers: Callable[[], None] | None = None, rope_top: int | None = None, **_) -> LeanOutput:
        n = input_ids.shape[1]
        if self.native is not None and n and not is_bulk(n):  # prefill chunks stay dense (quant.bulk)
            return self._native_pass(input_ids, position_ids, attention_mask, cache, between_layers)
        h = F.embedding(input_ids, self.embed)  # [1, n, H]
        cos, sin = self.rope("full_attention", position_ids[0], top=rope_top)
        attention_mask = self._fold(attention_mask)
        for i, L in enumerate(self.layers):
            if between_layers is not None:  # a cancel lands between layers (the runner keeps the cache consistent)
                between_layers()
            q, k, v = self._split(L.qkv(self._norm(h, L.in_norm)), n)
            h = h + L.o(self._attend(i, q, k, v, cos, sin, attention_mask, cache, self.scaling))
            gu = L.gate_up(self._norm(h, L.post_attn_norm))  # [1, n, 2 I]
            h = h + L.down(F.silu(gu[..., :self.inter]) * gu[..., self.inter:])
        return LeanOutput(self._norm(h, self.norm))

    def _native_pass(self, input_ids, position_ids, attention_mask, cache, between_layers) -> LeanOutput:
        """Every layer in one C call (cpu_kernel's completiond_qwen2_layer): the residual stream in
        float32 throughout, K/V stored in the cache's dtype as the torch path stores them."""
        n, H, d = input_ids.shape[1], self.embed.shape[1], self.head_dim
        h = F.embedding(input_ids[0], self.embed).float().contiguous()  # [n, H]
        cos, sin = (t[0, 0] for t in self.rope("full_attention", position_ids[0], torch.float32))  # [n, d]
        mask = attention_mask[0, 0].contiguous().view(torch.uint8)  # [n, keys]: slot t visible to row r
        begin = cache.length + cache.pending
        if mask.shape != (n, begin + n):
            raise ValueError(f"native layer: mask {tuple(mask.shape)} for {n} rows after {begin} slots")
        lib, threads = cpu_kernel.library(), torch.get_num_threads()
        kind = cpu_kernel.KINDS[cpu_kernel.kind()]  # one kind for every layer of the pass
        w4 = cpu_kernel.KINDS[cpu_kernel.w4_kind() or "w4"]  # int4 MLPs (the same bits on every w4 kind)
        # the cache: float32 (0), or bf16 with float32 (1) or bf16 (2: cpu_kernel.attention) dot products
        bf16_cache = 2 if cpu_kernel.attention() == "bf16" and d % 16 == 0 else 1
        need = lib.completiond_qwen2_work(n, H, self.inter, self.heads, self.kv_heads, d, begin + n, threads)
        if self._work.numel() < need:  # one scratch buffer, grown as contexts grow
            self._work = torch.empty(max(need, 2 * self._work.numel()))
        for i, weights in enumerate(self.native):
            if between_layers is not None:
                between_layers()
            k, v = cache.buffers(i, self.kv_heads, d, self.norm.dtype)
            lib.completiond_qwen2_layer(
                h.data_ptr(), n, H, *weights.args, cos.data_ptr(), sin.data_ptr(), k.data_ptr(), v.data_ptr(),
                bf16_cache if k.dtype == torch.bfloat16 else 0, k.shape[2], begin, begin + n, mask.data_ptr(),
                self.heads, self.kv_heads, d, self.scaling, self._work.data_ptr(), kind,
                w4 if weights.mlp_w4 else kind, threads)
        normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return LeanOutput((self.norm * normed.to(self.norm.dtype))[None])


class NativeWeights(NamedTuple):
    """One Qwen2 layer as completiond_qwen2_layer takes it: `args` are the pointers and sizes after
    (h, n, H); `keep` holds the tensors they point into (float32 norms, scales and bias); `mlp_w4`:
    gate / up / down hold int4 weights (QuantLinear scheme "w4")."""
    args: tuple
    keep: tuple
    mlp_w4: bool = False


def _native_layers(lean: LeanQwen2) -> list[NativeWeights] | None:
    """The native layer's weights, where it can run: CPU, int8 weights on completiond's kernel for
    every attention matmul of every layer and int8 or int4 ("w4", both alike) for its MLP, head size
    a multiple of 8 up to 256 (its attention's registers)."""
    first = lean.layers[0].qkv if lean.layers else None
    if (not isinstance(first, QuantLinear) or first.packed.device.type != "cpu" or lean.head_dim % 8
            or lean.head_dim > 256 or not cpu_kernel.enabled()):
        return None
    out = []
    for L in lean.layers:
        mats = (L.qkv, L.o, L.gate_up, L.down)
        if not all(isinstance(m, QuantLinear) for m in mats) or any(m.bias is not None for m in mats[1:]):
            return None
        if L.qkv.scheme != "int8" or L.o.scheme != "int8" or L.down.scheme != L.gate_up.scheme or (
                L.down.scheme not in ("int8", "w4") or L.down.scheme == "w4" and cpu_kernel.w4_kind() is None):
            return None
        bias = L.qkv.bias if L.qkv.bias is not None else torch.zeros(L.qkv.out_features)
        keep = tuple(t.float().contiguous() for t in (L.in_norm, L.post_attn_norm, bias)) + tuple(
            t for m in mats  # w4: bf16 scales and zeros as the kernel reads them; int8: float32 scales
            for t in (m.packed.contiguous(), (m.scales if m.scheme == "w4" else m._scales(torch.float32)).contiguous()))
        in_norm, post_norm, b, wqkv, sqkv, wo, so, wgu, sgu, wd, sd = (t.data_ptr() for t in keep)
        out.append(NativeWeights((in_norm, post_norm, lean.eps, wqkv, sqkv, b, wo, so, wgu, sgu, lean.inter, wd, sd),
                                 keep, L.down.scheme == "w4"))
    return out


def _gemma_gain(norm: nn.Module) -> torch.Tensor:
    """Gemma's RMSNorm scales by (1 + weight), in float32."""
    return 1.0 + norm.weight.float()
