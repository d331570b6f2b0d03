"""The module tree of a converted Qwen2 model, without transformers (a start imports no modeling code).

The lean forward (core/forward/lean.py, and the native layer under it) reads only tensors of the model:
embedding, norms, the q/k/v/o and MLP layers, the rotary table and the output layer, by the same
names transformers gives them. `Qwen2Skeleton` has exactly those modules, parameters and buffers,
so runtime.open_model fills it from the mapped files as it fills transformers' Qwen2ForCausalLM,
with the same tensors bit for bit (tests/test_cache.py). Its config is `Config`: config.json's
fields with Qwen2Config's defaults and derived fields.

Importing transformers and its Qwen2 modeling costs ~3 CPU-s of a start; `--backend transformers`
(the eager reference forward) still gets transformers' model: `to_transformers()` builds it around
the same tensors (core/forward/runner.py calls it).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

# Qwen2Config's defaults (transformers 5) for fields config.json may leave out
QWEN2_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_act": "silu", "max_position_embeddings": 32768,
    "initializer_range": 0.02, "rms_norm_eps": 1e-6, "use_cache": True, "tie_word_embeddings": False,
    "rope_parameters": None, "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28,
    "layer_types": None, "attention_dropout": 0.0, "pad_token_id": None, "bos_token_id": None, "eos_token_id": None,
}


class Config(SimpleNamespace):
    """A Qwen2 config.json read as Qwen2Config reads it (defaults, sliding_window only with
    use_sliding_window, layer_types derived): the fields the loader and the lean forward read."""

    model_type = "qwen2"

    @classmethod
    def read(cls, folder: Path) -> Config | None:
        """The config of `folder` when the skeleton can hold its model (see `supports`), else None."""
        try:
            raw = json.loads((folder / "config.json").read_text())
        except (OSError, ValueError):
            return None
        if raw.get("model_type") != "qwen2":
            return None
        cfg = cls(**{**QWEN2_DEFAULTS, **raw})
        cfg.sliding_window = cfg.sliding_window if cfg.use_sliding_window else None
        if cfg.num_key_value_heads is None:
            cfg.num_key_value_heads = cfg.num_attention_heads
        if cfg.layer_types is None:
            cfg.layer_types = ["sliding_attention" if cfg.sliding_window is not None and i >= cfg.max_window_layers
                               else "full_attention" for i in range(cfg.num_hidden_layers)]
        return cfg if supports(cfg) else None

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(vars(self))


def supports(cfg: Config) -> bool:
    """What the skeleton and the lean forward cover: Qwen2 with SiLU, full attention everywhere and
    the default rotary embedding (anything else loads transformers' model)."""
    rope = cfg.rope_parameters
    return (cfg.hidden_act == "silu" and cfg.sliding_window is None
            and set(cfg.layer_types) == {"full_attention"} and len(cfg.layer_types) == cfg.num_hidden_layers
            and isinstance(rope, dict) and rope.get("rope_type", "default") == "default" and "rope_theta" in rope
            and not getattr(cfg, "head_dim", None))


class UninitLinear(nn.Linear):
    """nn.Linear without its random init (the file's tensors replace the placeholders; an init on
    the meta device would import torch._dynamo, ~2 s)."""

    def reset_parameters(self) -> None:
        pass


class UninitEmbedding(nn.Embedding):
    def reset_parameters(self) -> None:
        pass


class RMSNorm(nn.Module):
    """Qwen2RMSNorm's parameters (the lean forward applies it)."""

    def __init__(self, n: int, eps: float, **where: Any):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, **where))
        self.variance_epsilon = eps


class Rotary(nn.Module):
    """Qwen2RotaryEmbedding with the default rope: the same buffers and the same forward."""

    def __init__(self, cfg: Config, device: torch.device | str = "cpu"):
        super().__init__()
        dim = cfg.hidden_size // cfg.num_attention_heads
        base = cfg.rope_parameters["rope_theta"]
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        self.register_buffer("inv_freq", inv_freq.to(device), persistent=False)
        self.register_buffer("original_inv_freq", inv_freq.clone().to(device), persistent=False)
        self.attention_scaling = 1.0
        self.rope_type = "default"

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: Config, **where: Any):
        super().__init__()
        d = cfg.hidden_size // cfg.num_attention_heads
        h, kv = cfg.hidden_size, cfg.num_key_value_heads * d
        self.q_proj = UninitLinear(h, cfg.num_attention_heads * d, bias=True, **where)
        self.k_proj = UninitLinear(h, kv, bias=True, **where)
        self.v_proj = UninitLinear(h, kv, bias=True, **where)
        self.o_proj = UninitLinear(cfg.num_attention_heads * d, h, bias=False, **where)


class MLP(nn.Module):
    def __init__(self, cfg: Config, **where: Any):
        super().__init__()
        self.gate_proj = UninitLinear(cfg.hidden_size, cfg.intermediate_size, bias=False, **where)
        self.up_proj = UninitLinear(cfg.hidden_size, cfg.intermediate_size, bias=False, **where)
        self.down_proj = UninitLinear(cfg.intermediate_size, cfg.hidden_size, bias=False, **where)


class Layer(nn.Module):
    def __init__(self, cfg: Config, **where: Any):
        super().__init__()
        self.self_attn = Attention(cfg, **where)
        self.mlp = MLP(cfg, **where)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **where)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **where)


class Decoder(nn.Module):
    def __init__(self, cfg: Config, **where: Any):
        super().__init__()
        self.config = cfg
        self.embed_tokens = UninitEmbedding(cfg.vocab_size, cfg.hidden_size, cfg.pad_token_id, **where)
        self.layers = nn.ModuleList(Layer(cfg, **where) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **where)
        self.rotary_emb = Rotary(cfg, where.get("device", "cpu"))

    def forward(self, *args: Any, **kwargs: Any):
        """transformers' eager forward on these tensors (corpus building, evaluation: not the hot path)."""
        return self.__dict__["owner"].to_transformers().model(*args, **kwargs)


class Qwen2Skeleton(nn.Module):
    """Qwen2ForCausalLM's modules, parameters and buffers by the same names (see the module docstring).
    Built on the meta device (no allocation, no init): runtime.open_model gives every parameter and
    buffer the file's tensor; the rotary buffers are float32 there, as transformers keeps them."""

    base_model_prefix = "model"

    def __init__(self, cfg: Config, folder: Path | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "meta"):
        super().__init__()
        where = {"device": device, "dtype": dtype}
        self.config = cfg
        self.folder = folder  # for to_transformers: its config and generation config
        self.dtype = dtype
        self.model = Decoder(cfg, **where)
        self.model.__dict__["owner"] = self  # not a submodule
        self.lm_head = UninitLinear(cfg.hidden_size, cfg.vocab_size, bias=False, **where)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.generation_config = None

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def forward(self, *args: Any, **kwargs: Any):
        """transformers' eager forward on these tensors (tools that call the model: draft training,
        evaluation); the engine runs the lean forward."""
        return self.to_transformers()(*args, **kwargs)

    def generate(self, *args: Any, **kwargs: Any):
        return self.to_transformers().generate(*args, **kwargs)

    def to_transformers(self) -> nn.Module:
        """transformers' Qwen2ForCausalLM holding this model's tensors and modules (no copy), for the
        eager reference forward (`--backend transformers`). Built once."""
        if self.__dict__.get("_hf") is not None:
            return self.__dict__["_hf"]
        from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

        from .quant import QuantLinear

        config = AutoConfig.from_pretrained(str(self.folder), local_files_only=True)
        config.num_hidden_layers = self.config.num_hidden_layers  # a self:N draft's
        config.layer_types = list(self.config.layer_types)
        with torch.device("meta"):
            hf = AutoModelForCausalLM.from_config(config, dtype=self.dtype, attn_implementation="sdpa")
        ours = dict(self.named_modules(remove_duplicate=False))
        for path, mod in list(hf.named_modules(remove_duplicate=False)):
            if path not in ours:
                continue
            mine = ours[path]
            parent, _, child = path.rpartition(".")
            if isinstance(mine, QuantLinear):  # the same module object
                setattr(hf.get_submodule(parent) if parent else hf, child, mine)
                continue
            for name in list(mod._parameters):
                if name in mine._parameters:
                    mod._parameters[name] = mine._parameters[name]
            for name in list(mod._buffers):
                if name in mine._buffers:
                    mod._buffers[name] = mine._buffers[name]
        left = [n for n, t in list(hf.named_parameters()) + list(hf.named_buffers()) if t.is_meta]
        if left:
            raise RuntimeError(f"to_transformers: {', '.join(left[:3])} not filled")
        if self.folder is not None and (self.folder / "generation_config.json").exists():
            hf.generation_config = GenerationConfig.from_pretrained(str(self.folder), local_files_only=True)
        self.__dict__["_hf"] = hf.eval()  # not a submodule: named_modules stays the skeleton's
        return hf


def generation_config(folder: Path) -> SimpleNamespace | None:
    """generation_config.json's fields (eos_token_id is what the loader reads)."""
    try:
        return SimpleNamespace(**json.loads((folder / "generation_config.json").read_text()))
    except (OSError, ValueError):
        return None
