"""The llama.cpp benchmark peer (node-llama-cpp, installed by npm into the cache) runs the same GGUF on
the same token ids as our target: its greedy continuation of a clear-cut prompt starts as ours does."""

import pytest
import torch

from completiond.bench.peers import LlamaCppPeer, llama_cpp_available
from completiond.core.engine import Engine, Request
from completiond.models.loader import load

pytestmark = pytest.mark.real_model

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci("


@pytest.mark.skipif(llama_cpp_available() is not None, reason=str(llama_cpp_available()))
def test_llama_cpp_peer_runs_the_same_model():
    target = load("default", "target", "cpu", "auto", "auto")
    ids = target.tokenizer.encode(PROMPT, add_special_tokens=False)
    with torch.inference_mode():
        ours = Engine(target).complete(Request(prompt=ids, mode="ar", max_tokens=4)).token_ids
    with LlamaCppPeer(target.meta["gguf"], 2, 256) as peer:
        assert "AVX" in peer.info["system"] or "NEON" in peer.info["system"]
        got = peer.ask(op="complete", warm=ids[:-2], rest=ids[-2:], n=4, lookup=False)
        assert len(got["tokens"]) == 4 and 0 < got["ms_first"] <= got["ms"]
        assert got["tokens"][0] == ours[0]
        assert target.tokenizer.decode(got["tokens"][:2]).strip().startswith("n")  # " n - 2)"
        looked = peer.ask(op="complete", warm=ids[:-2], rest=ids[-2:], n=4, lookup=True)
        assert looked["tokens"][0] == got["tokens"][0]
        assert peer.ask(op="prefill", prompt=ids)["ms"] > 0
        assert len(peer.ask(op="pass", context=ids, k=4, reps=2)["ms"]) == 2
