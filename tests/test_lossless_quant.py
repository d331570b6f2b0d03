"""Lossless is relative to the model that runs: with int8/int4 weights (and the lean forward), every
mode is token-identical to plain decoding of that same quantized model (fp32 activations)."""

import random

import pytest
import torch

import tiny
from completiond.models.device import cpu_flags
from completiond.models.kernels import cpu_kernel
from completiond.core.engine import Engine, Request
from completiond.models.loader import self_draft
from completiond.models.quant import quantize, scheme_of


@pytest.mark.parametrize("scheme,acts,attention", [("int8", "float32", None), ("int8", "int16", None),
                                                    ("int8", "int8", None), ("int4", "float32", None),
                                                    ("int8", "int8", "bf16"), ("int4", "int8", "bf16")])
def test_quantized_lean_target_identical_across_modes(scheme, acts, attention, code_ids, monkeypatch):
    """acts: the native Qwen2 layer's activations (cpu_kernel.activations; where completiond's
    kernel runs, elsewhere the int8 cases run the same path). attention "bf16": the model in bf16
    (its KV cache bf16) with bf16 attention scores (cpu_kernel.attention), where the CPU has them."""
    monkeypatch.setattr(cpu_kernel, "activations", lambda: acts)
    if attention is not None:
        if not cpu_kernel.AVX512_BF16 <= cpu_flags() or not cpu_kernel.enabled():
            pytest.skip("no AVX512-BF16 (or no completiond kernel) here")
        monkeypatch.setattr(cpu_kernel, "attention", lambda: attention)
    tok_ids = tiny.qwen_tokenizer().encode((tiny.STDLIB / "textwrap.py").read_text(), add_special_tokens=False)
    target = tiny.loaded(tiny.qwen2_config(layers=2, hidden=128), seed=2, scale=4.0)
    if attention is not None:
        target.model.to(torch.bfloat16)
        target.dtype = torch.bfloat16
    quantize(target.model, scheme)
    assert scheme_of(target.model) == scheme
    draft = self_draft(target, 1)
    engine = Engine(target, draft, max_nodes=16, always_speculate=True, backend="lean")
    assert engine.runner.backend == "lean"
    if scheme == "int8" or attention:  # the native layer (which reads both switches every pass) runs where it can
        assert (getattr(engine.runner.base, "native", None) is not None) == cpu_kernel.enabled()
    engine.index.set_file("textwrap.py", tok_ids)
    rng = random.Random(3)
    for i in range(12):
        end = rng.randrange(20, len(tok_ids))
        prompt = tok_ids[end - rng.choice([10, 60]):end]
        # every mode from the same warm cache, as in the bench: the prompt's last 1-9 tokens to run
        engine.warm(prompt[:-1 - i % 9])
        ar = engine.complete(Request(prompt=prompt, mode="ar", max_tokens=16))
        for mode in ("pld", "draft", "combined"):
            engine.warm(prompt[:-1 - i % 9])
            res = engine.complete(Request(prompt=prompt, mode=mode, max_tokens=16))
            assert res.token_ids == ar.token_ids, f"{scheme} {acts} {attention} {mode} prompt {i}"
