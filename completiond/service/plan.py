"""What the event loop hands the engine thread for one engine job (`complete`, `rewrite`,
`next_edit`): prepared in the order frames arrive, run later in the job's turn."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..core.engine import Request, Result


@dataclass
class Prepared:
    uri: str
    mode: str
    make: Callable[[], Request]  # called on the engine thread: tokenizing stays off the event loop
    partial: str  # the notification that streams text while it runs
    result: Callable[[Result], dict]
    lanes: dict = field(default_factory=dict)  # complete: the prompts make() chose between (Lane by name)
    low: bool = False  # after every request, like a warm-up (next_edit)
    superseded: Callable[[], dict] | None = None  # the answer when cancelled before it ran (else a Completion's)
    # complete: the text so far as the editor may show it (final=False: streaming), None to hold it back
    clean: Callable[[str, bool], str | None] = lambda text, final: text
