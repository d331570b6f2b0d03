"""What a pass needs from the job it runs for: the job's cancel, its preempt policy, the heads' feature.

One small frozen value handed down as an argument (scheduler -> engine -> runner -> decoder layers,
engine -> proposers), never set on the runner or the heads for the length of a job: a pass sees the
context of the job it runs for, and a job between turns leaves nothing behind. Torch-free: the
scheduler imports it before torch is loaded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class Cancelled(Exception):
    """The request was cancelled (between decoder layers, prefill chunks or passes)."""


class Preempted(Exception):
    """Another job should have the model now (core/scheduler.py): the prefill chunk in flight stops
    between two layers and runs again on the job's next turn."""


@dataclass(frozen=True)
class PassContext:
    # Set: the job was cancelled; `check` raises at the next point where a pass may stop.
    cancel: threading.Event | None = None
    # Asked between the layers of a prefill chunk that yields to a scheduler (Runner.extend_chunks,
    # sync_chunks): True = stop the chunk (Preempted) and give the model to another job.
    preempt: Callable[[], bool] | None = None
    # [H] the target's hidden state the proposal's root came from (speculation/heads.py), per proposal.
    feature: torch.Tensor | None = None

    def check(self) -> None:
        """The one cancel check: raises Cancelled once the job is cancelled."""
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled()


NO_CONTEXT = PassContext()  # outside a job: nothing cancels or preempts it, no feature
