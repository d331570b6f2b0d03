"""One request's state between target passes (`Engine.run` makes one per request; alternatives.py
decodes beside it)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .prompt.typed import Detokenizer, Step
from .request import Alternative, Request, Result


@dataclass
class Decoding:
    """One request's state between target passes."""
    req: Request
    out: Detokenizer
    on_step: Callable[[Step], None] | None
    t0: float = field(default_factory=time.perf_counter)
    token: int = -1  # the last verified token: the root of the next tree
    feature: torch.Tensor | None = None  # [H] the target's hidden state that gave `token` (heads.py)
    verified: list[int] = field(default_factory=list)  # every token the target verified, in order
    passes: int = 0
    accepted: int = 0
    by_depth: list[int] = field(default_factory=list)  # accepted tokens at tree depth 1, 2, ...
    ms_first: float = 0.0
    reused: int = 0  # prompt tokens the cache already held
    alternatives: list[Alternative] = field(default_factory=list)
    cancelled: bool = False
    first_logits: torch.Tensor | None = None  # [vocab] after the prompt (heal applied): alternatives' first tokens

    def __post_init__(self) -> None:
        seed = self.req.seed
        self.gen = torch.Generator(device="cpu").manual_seed(seed) if seed is not None else None

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1000

    def emit(self, new: list[int], first: bool = False) -> None:
        """Verified tokens: remembered, detokenized (stops applied), streamed."""
        self.verified += new
        self.token = new[-1]
        step = self.out.push(new)
        if first:
            self.ms_first = self.elapsed_ms()
        if self.on_step and (step.text or step.token_ids):
            self.on_step(step)

    def result(self, served: int) -> Result:
        out, passes = self.out, self.passes
        return Result(text=out.text, token_ids=list(out.ids), tokens=[out.decode([t]) for t in out.ids],
                      mode=self.req.mode, target_passes=passes, mean_accepted=self.accepted / passes if passes else 0.0,
                      ms_first_token=self.ms_first, ms_total=self.elapsed_ms(), stopped_by=out.stopped_by,
                      cancelled=self.cancelled, prompt_tokens=len(self.req.prompt), reused_tokens=self.reused,
                      accepted_by_depth=self.by_depth, served_tokens=served, alternatives=self.alternatives)
