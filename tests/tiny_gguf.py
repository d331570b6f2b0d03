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


def write_qwen2_gguf(path: Path, seed: int = 0, layers: int = 2, hidden: int = 64, scale: float = 4.0,
                     tied: bool = False) -> Path:
    """tied: no output.weight in the file (llama.cpp's way of saying the output layer is the embedding)."""
    import gguf

    tok = tiny.qwen_tokenizer()
    cfg = tiny.qwen2_config(vocab=len(tok), layers=layers, hidden=hidden, tied=tied)
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
        if tied and key == "lm_head.weight":
            continue
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


def dequantize_with_transformers(gguf_path: Path, out: Path) -> None:
    """The GGUF as a float32 checkpoint, de-quantized by transformers' GGUF loader (the whole model in
    memory): the conversion completiond ran before its streaming converter, kept as the reference."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils.quantization_config import GgufConfig

    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True))
    # The dense copy is an ordinary model; drop the GGUF marker so it can be saved and reloaded plainly.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))


def convert_with_transformers(gguf_path: Path, folder: Path, dtype, scheme: str) -> dict[str, str]:
    """The runtime form as the transformers path made it: the float32 checkpoint loaded in `dtype`,
    quantized (`quant.quantize`) and saved (`runtime.save`), with the checkpoint's other files."""
    import os
    import shutil

    from transformers import AutoModelForCausalLM

    from completiond.models import integrity, runtime
    from completiond.models.quant import quantize

    dense = folder / "float32"
    dequantize_with_transformers(gguf_path, dense)
    model = AutoModelForCausalLM.from_pretrained(str(dense), dtype=dtype, attn_implementation="sdpa",
                                                 local_files_only=True).eval()
    if scheme != "none":
        quantize(model, scheme)
    digests = runtime.save(model, folder, dtype, scheme, progress=False)
    del model
    for f in dense.iterdir():
        if f.is_file() and not f.name.endswith((".safetensors", ".safetensors.index.json")):
            os.replace(f, folder / f.name)
            digests[f.name] = integrity.sha256_file(folder / f.name)
    shutil.rmtree(dense)
    return digests
