"""What the event loop hands the engine thread for one engine job (`complete`, `rewrite`,
`next_edit`), and what comes back.

A `Prepared` is made on the event loop in the order frames arrive. On the engine thread, in the
job's turn, `make()` tokenizes and returns a `Built`: the engine request and what the event loop
keeps from it (a completion's lanes and new anchor). `make` reads its own snapshot and the engine,
and writes nothing of the session or the daemon; the event loop applies `learned(built)`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.scheduler import ENGINE_THREAD

if TYPE_CHECKING:
    from ..core.engine import Request, Result
    from .handlers import Anchor, Lane


@dataclass(frozen=True)
class Built:
    """What the engine thread made of a plan."""
    request: Request
    lane: Lane | None = None  # complete: the prompt it chose (the quick or the full lane) ...
    full: Lane | None = None  # ... and the full one
    anchor: Anchor | None = None  # complete: a prompt built from scratch is the document's new anchor


@dataclass(frozen=True, kw_only=True)
class Prepared:
    uri: str
    mode: str
    make: Callable[[], Built]  # called on the engine thread: tokenizing stays off the event loop
    partial: str  # the notification that streams text while it runs
    result: Callable[[Result, Built], dict]
    learned: Callable[[Built], None] | None = None  # called on the event loop once make() returned
    low: bool = False  # after every request, like a warm-up (next_edit)
    superseded: Callable[[], dict] | None = None  # the answer when cancelled before it ran (else a Completion's)
    # complete: the text so far as the editor may show it (final=False: streaming), None to hold it back
    clean: Callable[[str, bool], str | None] = lambda text, final: text
    plan: Any = None  # complete: its CompletionPlan (the value make() builds from)


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
