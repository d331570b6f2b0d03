"""What the daemon needs of an engine: the local `Engine` (core/engine.py) and the remote target's
`RemoteEngine` (core/remote.py) both give it. The service types its engine with this Protocol and
reads nothing else of it."""

from __future__ import annotations

from collections.abc import Callable, Generator, Hashable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .scheduler import Turns, Work

if TYPE_CHECKING:
    from .forward.context import PassContext
    from .prompt import Heal
    from .prompt.typed import Step
    from .request import Request, Result
    from .speculation.index import TokenIndex


@runtime_checkable
class PassCosts(Protocol):
    """The pass costs by tree size (`speculation.budget.TreeBudget`; none for a remote target)."""

    def costs(self) -> dict[int, float]: ...

    def cost(self, n: int) -> float: ...

    def table_status(self) -> dict: ...


@runtime_checkable
class EngineLike(Turns, Protocol):
    target: Any  # name, tokenizer, meta, device: models.loaded.LoadedModel, or remote.RemoteTarget
    index: TokenIndex  # prompt lookup's index of open documents and workspace files
    draft: Any  # the draft model, None without one
    runner: Any  # the target's runner: `backend`, and `graphs` where CUDA graphs replay passes
    budget: PassCosts
    stats: dict[str, float]  # requests, passes, accepted tokens, cancelled and stale work

    def run(self, req: Request, on_step: Callable[[Step], None] | None = None,
            ctx: PassContext | None = None) -> Generator[Work, None, Result]: ...

    def warming(self, prompt: list[int], ctx: PassContext,
                draft_ctx: PassContext | None = None) -> Generator[None, None, int]: ...

    def cached_prefix_len(self, prompt: list[int], slot: Hashable = None) -> int: ...

    def prefill_ms_per_token(self) -> float: ...

    def typed_prompt(self, prompt: list[int], typed: str) -> tuple[list[int], Heal | None] | None: ...

    def lookup(self, context: list[int], max_len: int = 16, n: int = 6) -> list[list[int]]: ...

    def calibrate_cached(self) -> str: ...

    def save_calibration(self) -> None: ...
