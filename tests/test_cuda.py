"""The CUDA path (issue 14 point 5): the same engine on a GPU, fp32 for identity. Skipped without a
GPU; `benchmarks/gpu.sh` runs these (and the real-model CUDA test) when a device is lent."""

import dataclasses

import pytest
import torch

import tiny
from completiond.core.forward.runner import Runner
from completiond.models.loader import self_draft
from test_lossless import engines_agree

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = torch.device("cuda")


def on_cuda(m):
    m.model.to(CUDA)
    return dataclasses.replace(m, device=CUDA)


@pytest.mark.parametrize("cfg", [tiny.gemma_config(window=16, layers=4), tiny.qwen2_config()])
def test_greedy_identical_across_modes_on_cuda(cfg, code_ids):
    target = on_cuda(tiny.loaded(cfg, seed=1, scale=4.0))
    engines = engines_agree(target, self_draft(target, 1), code_ids, n=12, seed=4)
    if cfg.model_type == "qwen2":  # its passes replayed CUDA graphs (graphs.py); Gemma's sliding window stays eager
        assert all(e.runner.graphs.failed is None and e.runner.graphs.captured for e in engines.values())


def test_lean_matches_transformers_on_cuda(code_ids):
    target = on_cuda(tiny.loaded(tiny.gemma_config(window=8, layers=3), seed=2))
    ids = code_ids[:40]
    lean, ref = Runner(target, backend="lean"), Runner(target, backend="transformers")
    nodes, parents = [101, 102, 103, 104], [-1, 0, 0, 1]
    for r in (lean, ref):
        r.extend(ids)
    torch.testing.assert_close(lean.forward(nodes, parents, range(4)), ref.forward(nodes, parents, range(4)),
                               rtol=0, atol=1e-4)


def test_graph_replays_match_eager_passes_on_cuda(code_ids):
    """Decode/verify passes replayed from captured CUDA graphs (graphs.py) give the eager passes'
    logits in fp32: trees with padding rows, appended passes, a keep that moves slots."""
    from completiond.core.forward import graphs

    target = on_cuda(tiny.loaded(tiny.qwen2_config(layers=3), seed=3, scale=4.0))
    fixed, eager = Runner(target, backend="lean"), Runner(target, backend="lean", cuda_graphs=False)
    assert fixed.graphs is not None and fixed.graphs.capture and eager.graphs is None
    for r in (fixed, eager):
        r.extend(code_ids[:300])
    steps = [(([5, 6, 7, 8, 9], [-1, 0, 0, 1, 3]), {}), (([11, 12], [-1, 0]), {}),
             (([13, 14, 15], [1, 0, 2]), {"append": True}), (([16], [-1]), {})]
    for _ in range(2):  # the second round replays the graphs the first captured
        for (nodes, parents), kw in steps:
            at = range(len(nodes))
            a, b = fixed.forward(nodes, parents, at, **kw), eager.forward(nodes, parents, at, **kw)
            torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
        for r in (fixed, eager):
            r.rollback(300)
    for r in (fixed, eager):
        r.forward([21, 22, 23], [-1, 0, 1], [2])
        r.keep([0, 1])
    torch.testing.assert_close(fixed.forward([24], [-1], [0]), eager.forward([24], [-1], [0]), rtol=0, atol=1e-4)
    assert fixed.graphs.failed is None and fixed.graphs.captured >= 4  # each shape at its second use
    assert fixed.graphs.captured == sum(g.graph is not None for g in fixed.graphs.graphs.values())


async def test_daemon_on_cuda_two_clients_modes_agree(tmp_path):
    """A real `completiond serve --device cuda` on a tiny Qwen2 (its passes replayed from CUDA graphs
    captured in the daemon's worker): two clients at once, `combined` gives `ar`'s text."""
    import asyncio

    from completiond.service.client import Client
    from daemon_util import start_daemon, stop_daemon

    model = tiny.save(tmp_path / "qwen", tiny.qwen2_config(layers=3), seed=1, scale=4.0)
    sock = tmp_path / "d.sock"
    proc = start_daemon(sock, model, "--device", "cuda")
    src = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"

    async def client(k: int) -> list[tuple[str, str]]:
        c = await Client.connect(sock)
        info = await c.request("initialize", {"client": f"cuda-{k}", "protocol": 1, "workspace_roots": []})
        assert info["device"].startswith("cuda")
        uri = f"file:///w/m{k}.py"
        await c.request("document/open", {"uri": uri, "text": src, "version": 1, "language_id": "python"})
        out = []
        for line, col in ((8, 14), (5, 4), (1, 11)):
            texts = [(await c.request("complete", {"uri": uri, "position": {"line": line, "character": col},
                                                   "max_tokens": 16, "mode": mode}))["text"]
                     for mode in ("ar", "combined")]
            out.append(tuple(texts))
        graphs = (await c.request("status", {}))["cuda_graphs"]
        assert graphs["failed"] is None and graphs["captured"] >= 1, graphs
        await c.close()
        return out

    try:
        results = await asyncio.wait_for(asyncio.gather(client(0), client(1)), 300)
    finally:
        assert stop_daemon(proc) == 0
    for pairs in results:
        assert all(ar == combined for ar, combined in pairs), pairs
    assert results[0] == results[1]
