"""A tiny Qwen2 GGUF written in-process (gguf-py's writer): what the named models are, at test size.

Weights are random (tests/tiny.py), stored as Q8_0 (the 2-D ones, so the conversion really
dequantizes) and F32 (norms, biases); the tokenizer is tiny.qwen_tokenizer's BPE with Qwen's
special tokens marked as control tokens, as llama.cpp writes them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import tiny


def write_qwen2_gguf(path: Path, seed: int = 0, layers: int = 2, hidden: int = 64, scale: float = 4.0) -> Path:
    import gguf

    tok = tiny.qwen_tokenizer()
    cfg = tiny.qwen2_config(vocab=len(tok), layers=layers, hidden=hidden)
    model = tiny.model(cfg, seed=seed, scale=scale)
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name("tiny-qwen2")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]) if getattr(cfg, "rope_parameters", None)
                         else 10000.0)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    spec = json.loads(tok.backend_tokenizer.to_str())
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    assert [i for _, i in vocab] == list(range(len(vocab)))
    specials = set(tiny.QWEN_SPECIALS) | {"<pad>"}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([gguf.TokenType.CONTROL if t in specials else gguf.TokenType.NORMAL for t, _ in vocab])
    merges = spec["model"]["merges"]
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_eos_token_id(tok.convert_tokens_to_ids("<|endoftext|>"))
    w.add_pad_token_id(tok.convert_tokens_to_ids("<|endoftext|>"))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, cfg.num_hidden_layers)
    for key, t in model.state_dict().items():
        base, suffix = key.rsplit(".", 1)
        arr = t.detach().float().numpy()
        name = f"{names.get_name(base)}.{suffix}"
        if arr.ndim == 2:
            q = gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
