"""The CUDA path (issue 14 point 5): the same engine on a GPU, fp32 for identity. Skipped without a
GPU; `benchmarks/gpu.sh` runs these (and the real-model CUDA test) when a device is lent."""

import dataclasses

import pytest
import torch

import tiny
from completiond.core.engine import MODES, Engine, Request
from completiond.core.forward.runner import Runner
from completiond.models import self_draft
from test_lossless import prompts

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = torch.device("cuda")


def on_cuda(m):
    m.model.to(CUDA)
    return dataclasses.replace(m, device=CUDA)


@pytest.mark.parametrize("cfg", [tiny.gemma_config(window=16, layers=4), tiny.qwen2_config()])
def test_greedy_identical_across_modes_on_cuda(cfg, code_ids):
    target = on_cuda(tiny.loaded(cfg, seed=1, scale=4.0))
    draft = self_draft(target, 1)
    engines = {m: Engine(target, draft, max_nodes=32, always_speculate=True) for m in MODES}
    for e in engines.values():
        e.index.set_file("textwrap.py", code_ids)
    for i, prompt in enumerate(prompts(code_ids, n=12, seed=4)):
        prompt = [t % (target.vocab_size - 16) for t in prompt]
        ar = engines["ar"].complete(Request(prompt=prompt, mode="ar", max_tokens=16))
        for m in ("pld", "draft", "combined"):
            assert engines[m].complete(Request(prompt=prompt, mode=m, max_tokens=16)).token_ids == ar.token_ids, (m, i)


def test_lean_matches_transformers_on_cuda(code_ids):
    target = on_cuda(tiny.loaded(tiny.gemma_config(window=8, layers=3), seed=2))
    ids = code_ids[:40]
    lean, ref = Runner(target, backend="lean"), Runner(target, backend="transformers")
    nodes, parents = [101, 102, 103, 104], [-1, 0, 0, 1]
    for r in (lean, ref):
        r.extend(ids)
    torch.testing.assert_close(lean.forward(nodes, parents, range(4)), ref.forward(nodes, parents, range(4)),
                               rtol=0, atol=1e-4)
