"""A lean forward for Gemma 3 text decoders: the draft model's pass with fewer Python steps.

The shipped draft (4 layers, hidden 320) does almost no arithmetic per token, so its pass time is
mostly the per-module overhead of transformers' eager forward (hooks, kwargs, output records, rotary
tables recomputed each pass). This forward does the same arithmetic as `Gemma3TextModel` in the same
order, on the same weights (q/k/v and gate/up projections concatenated once into one matmul each);
tests/test_runner.py holds its logits to transformers' within 1e-5 in fp32.

It is used for the draft only: the draft merely proposes, and the target, run through transformers,
verifies every token, so output stays exactly the target's whichever forward the draft uses.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

LEAN_MODEL_TYPES = {"gemma3_text"}


def supports_lean(model: torch.nn.Module) -> bool:
    cfg = model.config
    return (getattr(cfg, "model_type", None) in LEAN_MODEL_TYPES
            and getattr(cfg, "hidden_activation", None) == "gelu_pytorch_tanh"
            and not getattr(cfg, "attention_bias", False)
            and not getattr(cfg, "attn_logit_softcapping", None)
            and not getattr(cfg, "use_bidirectional_attention", False))


class LeanGemma3:
    """Callable like the decoder (`base(input_ids=, position_ids=, attention_mask=, cache=)`);
    returns the final-normed hidden states [1, n, hidden]."""

    def __init__(self, base: torch.nn.Module):
        cfg = base.config
        self.base = base
        self.eps = cfg.rms_norm_eps
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.scaling = cfg.query_pre_attn_scalar ** -0.5
        self.inter = cfg.intermediate_size
        self.embed = base.embed_tokens.weight
        self.embed_scale = base.embed_tokens.embed_scale.to(self.embed.dtype)
        self.types = list(cfg.layer_types)
        self.layers = []
        for layer in base.layers:
            att, mlp = layer.self_attn, layer.mlp
            self.layers.append((
                _gain(layer.input_layernorm),
                torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight]),  # [(h + 2 kv) d, H]
                _gain(att.q_norm), _gain(att.k_norm), att.o_proj.weight,
                _gain(layer.post_attention_layernorm), _gain(layer.pre_feedforward_layernorm),
                torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),  # [2 I, H]
                mlp.down_proj.weight, _gain(layer.post_feedforward_layernorm)))
        self.norm = _gain(base.norm)
        self._rope: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def rope(self, layer_type: str, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [1, 1, n, head_dim] at these positions, from a table that grows as positions do."""
        cos, sin = self._rope.get(layer_type, (None, None))
        top = int(pos.max()) + 1
        if cos is None or top > cos.shape[0]:
            size = max(4096, 2 * top)
            probe = self.embed.new_zeros(1)
            cos, sin = self.base.rotary_emb(probe, torch.arange(size, device=pos.device)[None], layer_type)
            cos, sin = cos[0], sin[0]  # [size, head_dim] in the model's dtype
            self._rope[layer_type] = (cos, sin)
        return cos[pos][None, None], sin[pos][None, None]

    def _norm(self, x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * gain).type_as(x)

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask, cache,
                 **_) -> "LeanOutput":
        n = input_ids.shape[1]
        h = F.embedding(input_ids, self.embed) * self.embed_scale  # [1, n, H]
        ropes = {t: self.rope(t, position_ids[0]) for t in set(self.types)}
        nq, nkv, d, half = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.head_dim, self.head_dim // 2
        for i, (g_in, qkv_w, g_q, g_k, o_w, g_pa, g_pf, gu_w, down_w, g_post) in enumerate(self.layers):
            qkv = F.linear(self._norm(h, g_in), qkv_w)  # [1, n, (h + 2 kv) d]
            q = self._norm(qkv[..., :nq].view(1, n, self.heads, d).transpose(1, 2), g_q)  # [1, h, n, d]
            k = self._norm(qkv[..., nq:nq + nkv].view(1, n, self.kv_heads, d).transpose(1, 2), g_k)
            v = qkv[..., nq + nkv:].view(1, n, self.kv_heads, d).transpose(1, 2)
            cos, sin = ropes[self.types[i]]
            q = q * cos + torch.cat((-q[..., half:], q[..., :half]), -1) * sin
            k = k * cos + torch.cat((-k[..., half:], k[..., :half]), -1) * sin
            k, v = cache.update(k, v, i)  # [1, kv, keys, d]: the keys this layer sees
            mask = attention_mask[self.types[i]] if isinstance(attention_mask, dict) else attention_mask
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling,
                                               enable_gqa=self.kv_heads != self.heads)
            a = F.linear(a.transpose(1, 2).reshape(1, n, nq), o_w)
            h = h + self._norm(a, g_pa)
            gu = F.linear(self._norm(h, g_pf), gu_w)  # [1, n, 2 I]
            m = F.linear(F.gelu(gu[..., :self.inter], approximate="tanh") * gu[..., self.inter:], down_w)
            h = h + self._norm(m, g_post)
        return LeanOutput(self._norm(h, self.norm))


class LeanOutput:
    def __init__(self, last_hidden_state: torch.Tensor):
        self.last_hidden_state = last_hidden_state


def _gain(norm: torch.nn.Module) -> torch.Tensor:
    """Gemma's RMSNorm scales by (1 + weight), in float32."""
    return 1.0 + norm.weight.float()
