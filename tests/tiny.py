"""Tiny random-initialised models and a small BPE tokenizer, built in-process for fast tests."""

from __future__ import annotations

import functools
import sysconfig
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, PreTrainedTokenizerFast, Qwen2Config

from completiond.models.loaded import LoadedModel

STDLIB = Path(sysconfig.get_paths()["stdlib"])
CORPUS_FILES = ["json/decoder.py", "json/encoder.py", "textwrap.py", "string.py", "bisect.py", "heapq.py"]


@functools.lru_cache(maxsize=4)
def tokenizer(vocab: int = 512) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on a few stdlib files: real code tokenization with a small vocabulary."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<pad>", "<eos>", "<bos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([(STDLIB / f).read_text() for f in CORPUS_FILES], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")
    fast._tokenizer.post_processor = None
    return fast


# Qwen2.5-Coder's special tokens, appended after the BPE vocabulary (ids vocab .. vocab + 7).
QWEN_SPECIALS = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                 "<|repo_name|>", "<|file_sep|>", "<|im_start|>", "<|im_end|>"]


@functools.lru_cache(maxsize=4)
def qwen_tokenizer(vocab: int = 512) -> PreTrainedTokenizerFast:
    """The tiny BPE with Qwen2.5-Coder's FIM, repo and chat tokens added as special tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([(STDLIB / f).read_text() for f in CORPUS_FILES], trainer)
    tok.add_special_tokens(QWEN_SPECIALS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast._tokenizer.post_processor = None
    return fast


def qwen2_config(vocab: int = 512 + len(QWEN_SPECIALS), layers: int = 2, hidden: int = 64, tied: bool = False):
    """A tiny Qwen2 (attention bias on q/k/v, no sliding window) whose vocabulary holds the specials."""
    eos = vocab - len(QWEN_SPECIALS)
    return Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                       bos_token_id=None, eos_token_id=eos, pad_token_id=eos, tie_word_embeddings=tied,
                       use_sliding_window=False)


def gemma_config(vocab: int = 512, layers: int = 4, window: int = 16, hidden: int = 64, seed_layers=None):
    types = ["sliding_attention", "sliding_attention", "full_attention"] * layers
    return Gemma3TextConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=window,
        layer_types=types[:layers], max_position_embeddings=4096, query_pre_attn_scalar=32,
        bos_token_id=2, eos_token_id=1, pad_token_id=0, tie_word_embeddings=True)


def llama_config(vocab: int = 512, layers: int = 2, hidden: int = 64):
    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                       num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                       max_position_embeddings=4096, bos_token_id=2, eos_token_id=1, pad_token_id=0)


def model(config, seed: int = 0, dtype=torch.float32, scale: float = 1.0) -> torch.nn.Module:
    """Random weights; `scale` multiplies the output embedding to make distributions peakier."""
    torch.manual_seed(seed)
    m = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype).eval()
    if scale != 1.0:
        with torch.no_grad():
            m.get_output_embeddings().weight.mul_(scale)
    return m


def loaded(config=None, seed: int = 0, name: str = "tiny", with_tokenizer: bool = True, scale: float = 1.0,
           dtype=torch.float32) -> LoadedModel:
    config = config or gemma_config()
    tok = None
    if with_tokenizer:
        qwen = getattr(config, "model_type", "") == "qwen2"
        tok = qwen_tokenizer(config.vocab_size - len(QWEN_SPECIALS)) if qwen else tokenizer(config.vocab_size)
    return LoadedModel(name=name, model=model(config, seed, dtype, scale), tokenizer=tok,
                       device=torch.device("cpu"), dtype=dtype)


def save(path: Path, config=None, seed: int = 0, scale: float = 1.0) -> Path:
    """Write a tiny model + tokenizer directory that `completiond --target DIR` loads."""
    lm = loaded(config, seed, scale=scale)
    lm.model.save_pretrained(str(path))
    lm.tokenizer.save_pretrained(str(path))
    return path
