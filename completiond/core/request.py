"""What a completion asks for (`Request`) and what it answers (`Result`): the engine's API types."""

from __future__ import annotations

import threading
from collections.abc import Hashable
from dataclasses import dataclass, field

from .prompt import Heal
from .prompt.stops import StopRules
from .speculation.verify import Sampling


@dataclass
class Request:
    prompt: list[int]
    mode: str = "combined"
    max_tokens: int = 64
    sampling: Sampling = field(default_factory=Sampling)
    seed: int | None = None
    stops: StopRules = field(default_factory=StopRules)
    deadline_ms: float | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    reuse_prefix: bool = True  # False: prefill the whole prompt (benchmarks measure what reuse saves)
    heal: Heal | None = None  # token healing: constrains the first token, hides the text it repeats
    # greedy: serve a continuation the target already verified (typed.py). Off by default: a benchmark
    # that repeats a prompt in every mode must compute it each time; the daemon turns it on.
    typed_through: bool = False
    slot: Hashable = None  # whose cached sequence to continue (the daemon: one per client document)
    # suggestions in all (1..3): n - 1 alternatives beside the greedy one, decoded in the same passes
    # (alternatives.py); greedy continuations of the first token's runners-up
    n: int = 1
    # tokens per proposed candidate (None: the engine's max_candidate_len). A next edit copies its region
    # back in runs up to the next change, which one pass can verify far past a completion's 16 tokens
    max_draft_len: int | None = None


@dataclass
class Alternative:
    """A suggestion beside the main one: the target's greedy continuation after another first token."""
    text: str
    token_ids: list[int]
    stopped_by: str  # as Result's, or "alternatives_budget" when cut where the main one ended


@dataclass
class Result:
    text: str
    token_ids: list[int]
    tokens: list[str]
    mode: str
    target_passes: int
    mean_accepted: float
    ms_first_token: float
    ms_total: float
    stopped_by: str
    cancelled: bool = False
    prompt_tokens: int = 0
    reused_tokens: int = 0
    accepted_by_depth: list[int] = field(default_factory=list)
    served_tokens: int = 0  # tokens served from an earlier completion's verified tokens: no pass for them
    alternatives: list[Alternative] = field(default_factory=list)  # Request.n > 1: distinct texts, not `text`
