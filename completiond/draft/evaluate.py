"""`completiond train-draft eval`: how good the draft is for its target, on held-out code.

- cost: one-token forward pass of draft and target at the same context length (median of many);
- agreement: the draft's argmax equals the target's over every position of held-out files, i.e.
  the probability that the draft's first proposed token is accepted in greedy speculation;
- per draft length k: `draft` mode with a chain of exactly k draft tokens per pass (each with its
  runner-up as a one-token branch; every proposal verified):
  mean accepted tokens per verify pass, acceptance by depth and tokens/s against `ar`.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
from tqdm import tqdm

from ..bench.modes import warm
from ..core.engine import Engine, Request
from ..models.loaded import LoadedModel
from ..core.forward.runner import Runner


@torch.inference_mode()
def pass_cost(lm: LoadedModel, context: list[int], reps: int = 30, lean: bool = False) -> float:
    """Median ms of a one-token pass after `context` (ids in lm's own vocabulary); lean: as drafts run."""
    r = Runner(lm, lean=lean)
    r.extend(context)
    times = []
    for i in range(reps + 5):
        r.rollback(len(context))
        t0 = time.perf_counter()
        r.forward([context[i % len(context)]], [-1], [0])
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times[5:])


@torch.inference_mode()
def agreement(target: LoadedModel, draft: LoadedModel, texts: list[str], max_tokens: int = 20000) -> float:
    """P(draft argmax == target argmax) over positions of held-out text (teacher forcing)."""
    tok = target.tokenizer
    agree = total = 0
    for text in texts:
        ids = [tok.bos_token_id] + tok.encode(text, add_special_tokens=False)[:1023]
        if len(ids) < 16:
            continue
        x = torch.tensor([ids], device=target.device)
        t = target.model(x).logits[0].argmax(-1)
        dx = draft.from_target[x] if draft.from_target is not None else x
        dl = draft.model(dx).logits[0].float()
        if draft.to_target is not None:
            dl[:, int(draft.meta["unk"])] = float("-inf")
            d = draft.to_target[dl.argmax(-1)]
        else:
            d = dl.argmax(-1)
        agree += int((d == t).sum())
        total += len(ids)
        if total >= max_tokens:
            break
    return agree / max(1, total)


def by_draft_length(target: LoadedModel, draft: LoadedModel, prompts: list, lengths: list[int],
                    max_tokens: int) -> dict:
    """draft mode with exactly k draft tokens per pass vs ar, on the same prompts, each run from a
    warm cache (the prompt but its last few tokens, as in an editor session: see bench.modes.warm)."""
    out = {}
    ar_engine = Engine(target, None)
    ar_ms = ar_tokens = 0.0
    ar_ids = []
    for p in tqdm(prompts, desc="ar"):
        warm(ar_engine, p.ids)
        r = ar_engine.complete(Request(prompt=p.ids, mode="ar", max_tokens=max_tokens, stops=p.stops, heal=p.heal))
        ar_ms += r.ms_total
        ar_tokens += len(r.token_ids)
        ar_ids.append(r.token_ids)
    for k in lengths:
        # a chain of exactly k tokens (plus a runner-up at each step)
        engine = Engine(target, draft, max_candidate_len=k, always_speculate=True, draft_branch=1)
        ms = tokens = passes = accepted = 0.0
        same = 0
        depth = [0] * k
        for p, ref in tqdm(list(zip(prompts, ar_ids)), desc=f"draft k={k}"):
            warm(engine, p.ids)
            r = engine.complete(Request(prompt=p.ids, mode="draft", max_tokens=max_tokens, stops=p.stops, heal=p.heal))
            ms += r.ms_total
            tokens += len(r.token_ids)
            passes += r.target_passes
            accepted += r.mean_accepted * r.target_passes
            same += r.token_ids == ref
            for d, n in enumerate(r.accepted_by_depth[:k]):
                depth[d] += n
        out[k] = {"mean_accepted": round(accepted / passes, 3) if passes else 0.0,
                  "acceptance_by_depth": [round(n / passes, 4) for n in depth] if passes else [],
                  "tokens_per_s": round(tokens / (ms / 1000), 2), "speedup_vs_ar": round(ar_ms / ms, 3),
                  "identical_rate": round(same / len(prompts), 4)}
    out["ar_tokens_per_s"] = round(ar_tokens / (ar_ms / 1000), 2)
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2))
    ks = [k for k in result["by_draft_length"] if isinstance(k, int) or str(k).isdigit()]
    for k in ks:
        row = result["by_draft_length"][k]
        d = row["acceptance_by_depth"]
        ax[0].plot(range(1, len(d) + 1), d, marker="o", label=f"k={k}")
    ax[0].set_xlabel("position of the draft token (depth)")
    ax[0].set_ylabel("P(accepted) per verify pass")
    ax[0].set_title(f"first-token agreement (teacher-forced): {result['agreement']:.2f}")
    ax[0].legend()
    ax[1].bar([str(k) for k in ks], [result["by_draft_length"][k]["speedup_vs_ar"] for k in ks], color="#4477aa")
    ax[1].axhline(1.0, color="k", lw=0.8)
    ax[1].set_xlabel("draft tokens per pass (k)")
    ax[1].set_ylabel("tokens/s vs ar")
    ax[1].set_title(f"draft pass {result['draft_pass_ms']:.1f} ms vs target {result['target_pass_ms']:.1f} ms")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
