"""Peers on the same models, positions and machine: transformers `generate` (plain, prompt lookup,
assisted by our draft) and llama-cpp-python on the same GGUF (plain, prompt-lookup decoding).

Each peer starts from the same warm state as our modes (a cache holding the prompt up to its last
WARM_GAP tokens: transformers from a copied DynamicCache, llama.cpp from its own prompt cache) and
generates as many tokens as our `ar` produced at that position, so times compare like for like.
"""

from __future__ import annotations

import copy
import sys
import time

import torch
from transformers import DynamicCache

from ..core.engine import Engine
from ..models import LoadedModel
from .modes import WARM_GAP, Prepared
from .repo import edit_similarity, first_line


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


def _hf_assistant(engine: Engine):
    d = engine.draft.lm if engine.draft is not None else None
    if d is None:
        return None, None
    if d.to_target is None:
        return d.model, d.name
    return full_vocab_draft(d, engine.target.vocab_size), d.name + " (expanded to the full vocabulary)"


@torch.inference_mode()
def run_transformers(engine: Engine, prepared: list[Prepared], peers: list[str]) -> dict[str, list[dict]]:
    model = engine.target.model
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


def llama_cpp_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
        return True
    except ImportError:
        return False


def run_llama_cpp(engine: Engine, prepared: list[Prepared], threads: int) -> dict[str, list[dict]]:
    """llama.cpp on the same GGUF: plain decoding and LlamaPromptLookupDecoding, with its prompt cache."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    gguf = engine.target.meta.get("gguf")
    if not gguf:
        print("completiond bench: the target was not loaded from a GGUF file; skipping llama.cpp", file=sys.stderr)
        return {}
    out: dict[str, list[dict]] = {}
    tok = engine.target.tokenizer
    n_ctx = max(len(pp.prompt) + len(pp.runs["ar"].result.token_ids) for pp in prepared) + 64
    for name, draft in (("llama.cpp", None), ("llama.cpp-prompt-lookup", LlamaPromptLookupDecoding(num_pred_tokens=10))):
        # with a draft model llama-cpp-python keeps every position's logits: it needs logits_all=True
        llm = Llama(model_path=gguf, n_ctx=n_ctx, n_threads=threads, n_batch=512, verbose=False, draft_model=draft,
                    logits_all=draft is not None)
        rows = []
        for pp in prepared:
            n = len(pp.runs["ar"].result.token_ids)
            if n == 0:
                continue
            cut = max(1, len(pp.prompt) - WARM_GAP)
            llm.reset()
            llm.eval(pp.prompt[:cut])  # warm: its cache holds the same prefix as ours
            t0 = time.perf_counter()
            gen = []
            for t in llm.generate(pp.prompt, temp=0.0, top_k=1):  # reuses the cached prefix itself
                gen.append(int(t))
                if len(gen) >= n:
                    break
            ms = (time.perf_counter() - t0) * 1000
            text = tok.decode([t for t in gen if t not in engine.eos], skip_special_tokens=False)
            if pp.heal is not None:  # the same prompt, unconstrained: hide the healed text if it came back
                text = text[len(pp.heal.text):] if text.startswith(pp.heal.text) else text
            cut = pp.stops.cut(text)
            line = first_line(text if cut is None else text[:cut])
            rows.append({"position": prepared.index(pp), "ms_total": ms, "tokens": len(gen),
                         "exact": line == pp.reference, "similarity": edit_similarity(line, pp.reference),
                         "identical": gen == pp.runs["ar"].result.token_ids,
                         "text_identical": tok.decode(gen) == tok.decode(pp.runs["ar"].result.token_ids)})
        out[name] = rows
    return out
