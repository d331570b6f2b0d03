"""Run completiond's modes on benchmark positions, side by side on one engine.

Each position starts from the same warm state, as in an editor session: the KV caches already hold
the prompt up to its last WARM_GAP tokens (earlier keystrokes), so each run prefills those few
tokens and then decodes. Modes run in turn at every position; `ar` first, and every other mode's
output is compared token by token with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from ..core.engine import Engine, Request, Result
from ..core.prompt.context import related_files
from ..core.prompt import build_prompt
from ..limits import COMPLETION_PROMPT_TOKENS
from .repo import Cursor, read_text_file, score, source_files

WARM_GAP = 8


@dataclass
class Run:
    position: int
    mode: str
    result: Result
    exact: bool  # the completed line equals the real one
    similarity: float
    exact_middle: bool = False  # the whole completion equals the removed text (no extra lines)
    identical: bool = True
    divergence: dict | None = None


@dataclass
class BenchPrompt:
    prompt: list[int]
    doc_text: str
    stops: object
    reference: str
    file: Path
    runs: dict = field(default_factory=dict)
    heal: object = None  # prompt.Heal of a mid-word cursor
    context_files: list[str] = field(default_factory=list)  # paths of the other files in the prompt


def prepare(engine: Engine, root: Path, positions: list[Cursor], multiline: bool, max_prompt: int,
            context: bool = False) -> list[BenchPrompt]:
    """The prompt the daemon would build at each position: FIM and, with `context` (serve
    --repo-context), the workspace files the document imports in Qwen's repository format
    (core.prompt.context.related_files; a bench has no other open buffers)."""
    tok = engine.target.tokenizer
    workspace = [(f.relative_to(root).as_posix(), f) for f in source_files(root)] if context else []
    out = []
    for p in positions:
        text = read_text_file(p.file) or ""
        doc, offset = p.document(text)
        rel = p.file.relative_to(root).as_posix()
        files = related_files(rel, doc, [], workspace) if context else None
        pr = build_prompt(tok, doc, offset, multiline=multiline, max_tokens=max_prompt, path=rel, repo=root.name,
                          context=files)
        out.append(BenchPrompt(pr.ids, doc, pr.stops, p.reference, p.file, heal=pr.heal,
                            context_files=[f.path for f in files or []]))
    return out


def index_repo(engine: Engine, root: Path) -> dict[Path, list[int]]:
    tok = engine.target.tokenizer
    return {f: tok.encode(read_text_file(f) or "", add_special_tokens=False) for f in source_files(root)}


def warm(engine: Engine, prompt: list[int]) -> int:
    """Caches hold prompt[:cut]; return cut."""
    cut = max(1, len(prompt) - WARM_GAP)
    engine.warm(prompt[:cut])
    return cut


def open_position(engine: Engine, files: dict[Path, list[int]], pp: BenchPrompt, current: Path | None) -> Path:
    """Prompt lookup sees what an editor at `pp` would: the document as the open buffer, every other
    file of the repository as the workspace (rebuilt only when the file changes from `current`).
    Returns pp's file, the next call's `current`."""
    if pp.file != current:
        for f, ids in files.items():
            if f == pp.file:
                engine.index.remove_file(str(f))
            else:
                engine.index.set_file(str(f), ids)
        engine.index.rebuild()
    engine.index.set_open("bench://current", engine.target.tokenizer.encode(pp.doc_text, add_special_tokens=False))
    return pp.file


def run_modes(engine: Engine, root: Path, positions: list[Cursor], modes: list[str], max_tokens: int,
              multiline: bool = True, max_prompt: int = COMPLETION_PROMPT_TOKENS, progress: bool = True, context: bool = False,
              files: dict[Path, list[int]] | None = None, bar: tqdm | None = None) -> list[BenchPrompt]:
    """Every mode at every position; returns the prepared positions with their runs. files: the
    repository's token ids (index_repo's, when called block by block); bar: a progress bar to advance
    (else its own)."""
    files = index_repo(engine, root) if files is None else files
    prepared = prepare(engine, root, positions, multiline, max_prompt, context)
    current = None
    order = sorted(range(len(prepared)), key=lambda i: str(prepared[i].file))
    modes = ["ar"] + [m for m in modes if m != "ar"]
    own = bar is None
    bar = tqdm(total=len(order) * len(modes), desc="positions x modes", disable=not progress) if own else bar
    for i in order:
        pp = prepared[i]
        current = open_position(engine, files, pp, current)
        for mode in modes:
            cut = warm(engine, pp.prompt)
            res = engine.complete(Request(prompt=pp.prompt, mode=mode, max_tokens=max_tokens, stops=pp.stops,
                                          heal=pp.heal))
            run = Run(i, mode, res, **score(res.text, pp.reference))
            if mode != "ar":
                ar = pp.runs["ar"].result
                run.identical = res.token_ids == ar.token_ids
                if not run.identical:
                    run.divergence = divergence(engine, pp.prompt, cut, ar.token_ids, res.token_ids)
            pp.runs[mode] = run
            bar.update(1)
    if own:
        bar.close()
    return prepared


@torch.inference_mode()
def divergence(engine: Engine, prompt: list[int], cut: int, ar: list[int], other: list[int]) -> dict:
    """Where two greedy outputs part, and the target's logit gap there (plain one-sequence forward)."""
    i = next((k for k, (a, b) in enumerate(zip(ar, other)) if a != b), min(len(ar), len(other)))
    if i >= len(ar) or i >= len(other):
        return {"index": i, "reason": "one output stopped earlier (stop rule at a different token count)"}
    engine.runner.rollback(cut)
    logits = engine.runner.extend(prompt + ar[:i])
    top2 = logits.topk(2)
    tok = engine.target.tokenizer
    return {"index": i, "ar_token": tok.decode([ar[i]]), "other_token": tok.decode([other[i]]),
            "logit_gap": round(float(logits[ar[i]] - logits[other[i]]), 5),
            "top2_gap": round(float(top2.values[0] - top2.values[1]), 5)}
