"""What the event loop hands the engine thread for one engine job (`complete`, `rewrite`,
`next_edit`), and what comes back.

An `EngineJob` is made on the event loop in the order frames arrive (`handlers.complete`,
`handlers.rewrite`, `next_edit.prepare`: one class per method); `Daemon._run` then calls its methods
in this order:

    build(engine)          engine thread, in the job's turn: tokenize, return a `Built` (the
                           `Request` for `Engine.run`, and what the event loop keeps from it)
    learned(built)         event loop, before the answer: keep what the engine thread learned
    shown(text, final)     engine thread, per step: the text so far as the editor may see it
    answer(result, built)  event loop: the result map
    superseded()           event loop, instead of all these when cancelled before it ran

`build` reads only the job's own snapshot and the engine, and writes nothing of the session or the
daemon.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from . import protocol as P
from ..core.scheduler import ENGINE_THREAD

if TYPE_CHECKING:
    from ..core.engine_like import EngineLike
    from ..core.prompt import Heal
    from ..core.request import Request, Result


QUICK_PROMPT_TOKENS = 256  # the quick prompt's least size: the cursor's neighbourhood, no other files
QUICK_PROMPT_MAX_TOKENS = 1024  # its most
QUICK_PREFILL_MS = 1000.0  # it grows (doubling) while its whole prefill still fits this on this device (0: it does not)
QUICK_OUTLINE = False  # it starts with the imports and enclosing headers its window leaves out (prompt/outline.py)


def quick_prompt_tokens(prefill_ms_per_token: float, budget_ms: float | None = None) -> int:
    """The quick prompt's size where prefilling one token costs `prefill_ms_per_token` (measured):
    256 doubled while the whole prompt prefills within `budget_ms` (default QUICK_PREFILL_MS), at
    most 1024. Powers of two, so a measurement that drifts a little does not change the prompt (its
    cache stays)."""
    budget_ms = QUICK_PREFILL_MS if budget_ms is None else budget_ms
    n = QUICK_PROMPT_TOKENS
    while n * 2 <= QUICK_PROMPT_MAX_TOKENS and n * 2 * prefill_ms_per_token <= budget_ms:
        n *= 2
    return n


@dataclass
class Lane:
    """A prompt for the cursor and the cached sequence (slot) it is prefilled into. A completion has a
    full lane (the whole budget: repository context, long prefix and suffix) and, while the full one
    is cold, a quick lane: a few hundred tokens around the cursor in a slot of their own. A cold
    2.5k-token prompt takes ~9 s to prefill on 2 CPU cores, the quick one ~1 s; the warm-up fills the
    quick lane first, then the full one, and completions move to the full lane once it is warm."""
    ids: list[int]
    heal: Heal | None
    slot: Hashable
    capacity: int | None = None


@dataclass
class Anchor:
    """The last completion prompt built from scratch for a document: while the user types at its
    cursor (new lines included: Enter, or an accepted multi-line suggestion), later prompts extend
    its FIM middle instead of moving the split, so its suffix is never prefilled again."""
    text: str
    offset: int
    full: Lane
    quick: Lane | None
    fim: bool


@dataclass(frozen=True)
class Built:
    """What the engine thread made of a job."""
    request: Request
    lane: Lane | None = None  # complete: the prompt it chose (the quick or the full lane) ...
    full: Lane | None = None  # ... and the full one
    anchor: Anchor | None = None  # complete: a prompt built from scratch is the document's new anchor


@dataclass(frozen=True, kw_only=True)
class EngineJob:
    """One engine job, prepared on the event loop (see the module's docstring for the order of calls)."""
    uri: str  # with the session id, the job's key: its cached sequence, the latest per key wins
    mode: str
    partial: ClassVar[str]  # the notification that streams text while it runs
    low: ClassVar[bool] = False  # after every request, like a warm-up (next_edit)

    def build(self, engine: EngineLike) -> Built:
        """On the engine thread: the engine request (tokenizing stays off the event loop)."""
        raise NotImplementedError

    def learned(self, built: Built) -> None:
        """On the event loop once `build` returned: keep what it learned (nothing by default)."""

    def shown(self, text: str, final: bool) -> str | None:
        """The text so far as the editor may show it (final=False: streaming); None holds it back."""
        return text

    def answer(self, result: Result, built: Built) -> dict:
        """The result map of the finished job."""
        raise NotImplementedError

    def superseded(self) -> dict:
        """The answer when cancelled before it ran."""
        return P.Completion.superseded(self.mode).to_wire()


def not_engine_thread(what: str) -> None:
    """Session and document state belongs to the event loop: the engine thread returns what it
    learned (plan.Built) instead of writing it. Checked where such state is written (assert: -O drops it)."""
    assert threading.current_thread().name != ENGINE_THREAD, f"{what} written on the engine thread"


class LoopOwned(dict):
    """A dict of session state: a write from the engine thread fails (see not_engine_thread)."""

    def __setitem__(self, key, value) -> None:
        not_engine_thread("session state")
        super().__setitem__(key, value)

    def pop(self, *args):
        not_engine_thread("session state")
        return super().pop(*args)
