"""Peers on the same models, positions and machine: transformers `generate` (plain, prompt lookup,
assisted by our draft) and llama.cpp on the same GGUF (plain, prompt-lookup decoding) through
node-llama-cpp's prebuilt binaries (llama_cpp/peer.mjs; llama-cpp-python needs a ~45 min source build
on 2 cores, and the prebuilt Python wheels need a newer glibc than Debian 12's).

Each peer starts from the same warm state as our modes (a cache holding the prompt up to its last
WARM_GAP tokens: transformers from a copied DynamicCache, llama.cpp from its own prompt cache) and
generates as many tokens as our `ar` produced at that position, so times compare like for like.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from ..core.engine import Engine
from ..models.loaded import LoadedModel
from ..paths import cache_root
from .modes import WARM_GAP, BenchPrompt
from .repo import score


def full_vocab_draft(draft: LoadedModel, vocab: int) -> torch.nn.Module:
    """Our pruned-vocabulary draft as a model over the target's whole vocabulary (what HF assisted
    generation requires): ids outside the draft's vocabulary read its unk row and score -1e4."""
    import torch.nn as nn

    m = copy.deepcopy(draft.model)
    emb = m.get_input_embeddings().weight.data  # [draft vocab, H]
    rows = emb[draft.from_target.cpu()].clone()  # [target vocab, H]: unknown ids read the unk row
    m.get_input_embeddings().weight = nn.Parameter(rows, requires_grad=False)  # keeps Gemma's embed scale
    m.get_input_embeddings().num_embeddings = vocab
    head = nn.Linear(emb.shape[1], vocab, bias=True, dtype=emb.dtype)
    head.weight = nn.Parameter(rows.clone(), requires_grad=False)
    bias = torch.full((vocab,), -1e4, dtype=emb.dtype)
    bias[draft.to_target.cpu()] = 0  # only ids the draft can express can win
    head.bias = nn.Parameter(bias, requires_grad=False)
    m.lm_head = head
    m.config.tie_word_embeddings = False
    m.config.vocab_size = vocab
    return m


def _hf(model: torch.nn.Module) -> torch.nn.Module:
    """transformers' model for HF generate: a converted Qwen2 loads as models/skeleton.py's tree."""
    return model.to_transformers() if hasattr(model, "to_transformers") else model


def _hf_assistant(engine: Engine):
    d = engine.draft.lm if engine.draft is not None else None
    if d is None:
        return None, None
    if d.to_target is None:
        return _hf(d.model), d.name
    return full_vocab_draft(d, engine.target.vocab_size), d.name + " (expanded to the full vocabulary)"


@torch.inference_mode()
def run_transformers(engine: Engine, prepared: list[BenchPrompt], peers: list[str]) -> dict[str, list[dict]]:
    if not any(p.startswith("hf-") for p in peers):  # (no transformers prefill of every prompt for nothing)
        return {}
    model = _hf(engine.target.model)
    assistant, assistant_name = _hf_assistant(engine) if "hf-assisted" in peers else (None, None)
    out: dict[str, list[dict]] = {p: [] for p in peers if p.startswith("hf-")}
    if "hf-assisted" in out and assistant is None:
        del out["hf-assisted"]
    for pp in prepared:
        n = len(pp.runs["ar"].result.token_ids)
        if n == 0:
            continue
        cut = max(1, len(pp.prompt) - WARM_GAP)
        warm = DynamicCache(config=model.config)
        model(input_ids=torch.tensor([pp.prompt[:cut]]), cache=warm, logits_to_keep=1)
        for name in out:
            kw = {}
            if name == "hf-prompt-lookup":
                kw["prompt_lookup_num_tokens"] = 10
            elif name == "hf-assisted":
                kw["assistant_model"] = assistant
            cache = copy.deepcopy(warm)
            t0 = time.perf_counter()
            ids = model.generate(torch.tensor([pp.prompt]), cache=cache, max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, pad_token_id=0, eos_token_id=None, **kw)
            ms = (time.perf_counter() - t0) * 1000
            gen = ids[0, len(pp.prompt):].tolist()
            out[name].append({"position": prepared.index(pp), "ms_total": ms, "tokens": len(gen),
                              "identical": gen[:n] == pp.runs["ar"].result.token_ids})
    if assistant_name:
        for r in out.get("hf-assisted", []):
            r["assistant"] = assistant_name
    return out


LLAMA_CPP_DIR = Path(__file__).with_name("llama_cpp")  # package.json, package-lock.json, peer.mjs


def llama_cpp_available() -> str | None:
    """Why the llama.cpp peer cannot run here, or None when it can (it needs Node and npm)."""
    missing = [t for t in ("node", "npm") if shutil.which(t) is None]
    return f"{' and '.join(missing)} not found on PATH" if missing else None


def install_llama_cpp_peer() -> Path:
    """node-llama-cpp's prebuilt llama.cpp, installed once into the cache: exact versions from the lock
    (`npm ci` refuses it: some of node-llama-cpp's optional platform builds do not exist at 3.22.1)."""
    home = cache_root() / "llama-cpp-peer"
    home.mkdir(parents=True, exist_ok=True)
    stale = False
    for name in ("package.json", "package-lock.json", "peer.mjs"):
        src = (LLAMA_CPP_DIR / name).read_bytes()
        stale |= name != "peer.mjs" and (not (home / name).exists() or (home / name).read_bytes() != src)
        (home / name).write_bytes(src)
    if stale or not (home / "node_modules" / "node-llama-cpp").is_dir():
        print("completiond bench: installing the llama.cpp peer (node-llama-cpp 3.22.1, prebuilt) ...", file=sys.stderr)
        # --omit=optional: its GPU builds are optional dependencies (hundreds of MB); the CPU one is ours
        subprocess.run(["npm", "install", "--no-save", "--omit=optional", "--ignore-scripts", "--no-audit", "--no-fund"],
                       cwd=home, check=True, stdout=subprocess.DEVNULL)
    return home


class LlamaCppPeer:
    """llama.cpp in a Node process (peer.mjs): same GGUF, same token ids, same thread count as ours."""

    def __init__(self, gguf: str, threads: int, n_ctx: int):
        home = install_llama_cpp_peer()
        self.proc = subprocess.Popen(["node", str(home / "peer.mjs"), gguf, str(threads), str(n_ctx)], cwd=home,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info = self.ask(op="info")

    def ask(self, **req) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the llama.cpp peer exited (rc {self.proc.wait()})")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"llama.cpp peer: {reply['error']}")
        return reply

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)

    def __enter__(self) -> "LlamaCppPeer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LlamaCppRun:
    """llama.cpp beside one target's modes, a block of positions at a time (bench.cli.bench_targets:
    each block right after ours, so both see the same minutes of this machine), on the same GGUF and
    prompts (token ids): plain greedy decoding and its prompt-lookup predictor, from the same warm
    cache as ours, as many tokens as our `ar` produced; then cold prefill of the same prompts, ours
    and its, side by side. The peer process stays up between blocks."""

    def __init__(self, engine: Engine, threads: int, n_ctx: int):
        self.engine = engine
        self.peer = LlamaCppPeer(engine.target.meta["gguf"], threads, n_ctx)
        self.rows: dict[str, list[dict]] = {"llama.cpp": [], "llama.cpp-prompt-lookup": []}

    def block(self, prepared: list[BenchPrompt], start: int) -> None:
        """Both peers at these positions (indices start, start + 1, ... of the whole run)."""
        tok, eos = self.engine.target.tokenizer, self.engine.eos
        for i, pp in enumerate(prepared):
            ar = pp.runs["ar"].result.token_ids
            if not ar:
                continue
            cut = max(1, len(pp.prompt) - WARM_GAP)
            for name, rows in self.rows.items():
                r = self.peer.ask(op="complete", warm=pp.prompt[:cut], rest=pp.prompt[cut:], n=len(ar),
                                  lookup=name.endswith("lookup"))
                gen = r["tokens"]
                text = tok.decode([t for t in gen if t not in eos], skip_special_tokens=False)
                if pp.heal is not None:  # the same prompt, unconstrained: hide the healed text if it came back
                    text = text[len(pp.heal.text):] if text.startswith(pp.heal.text) else text
                stop = pp.stops.cut(text)
                rows.append({"position": start + i, "ms_total": r["ms"], "ms_first_token": r["ms_first"],
                             "tokens": len(gen), **score(text if stop is None else text[:stop], pp.reference),
                             "identical": gen == ar, "text_identical": tok.decode(gen) == tok.decode(ar)})

    def finish(self, prepared: list[BenchPrompt]) -> tuple[dict[str, list[dict]], dict]:
        """(peer rows, a 'prefill' summary), and the peer closed."""
        try:
            prefill = compare_prefill(self.engine, self.peer, [pp.prompt for pp in prepared[:PREFILL_PROMPTS]])
            prefill["llama_cpp"] = self.peer.info
        finally:
            self.peer.close()
        return self.rows, prefill


def llama_cpp_run(engine: Engine, threads: int, n_ctx: int) -> LlamaCppRun | None:
    """A LlamaCppRun for this target, or None (why printed) where llama.cpp cannot run it."""
    if (why := llama_cpp_available()) is not None:
        print(f"completiond bench: {why}; skipping llama.cpp (its peer runs on Node)", file=sys.stderr)
        return None
    if not engine.target.meta.get("gguf"):
        print("completiond bench: the target was not loaded from a GGUF file; skipping llama.cpp", file=sys.stderr)
        return None
    return LlamaCppRun(engine, threads, n_ctx)


PREFILL_PROMPTS = 8


def compare_prefill(engine: Engine, peer: LlamaCppPeer, prompts: list[list[int]]) -> dict:
    """Cold prompt processing (empty cache, logits of the last token), ours then llama.cpp's, prompt by prompt."""
    ours, theirs, tokens = [], [], 0
    for prompt in prompts:
        engine.runner.reset()
        t0 = time.perf_counter()
        engine.runner.extend(prompt)
        ours.append((time.perf_counter() - t0) * 1000)
        theirs.append(peer.ask(op="prefill", prompt=prompt)["ms"])
        tokens += len(prompt)
    engine.runner.reset()
    return {"prompts": len(prompts), "tokens": tokens,
            "ours_tokens_per_s": round(tokens / (sum(ours) / 1000), 1),
            "llama_cpp_tokens_per_s": round(tokens / (sum(theirs) / 1000), 1),
            "ratio_vs_llama_cpp": round(sum(theirs) / sum(ours), 3)}
