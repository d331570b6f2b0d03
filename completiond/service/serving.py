"""What the methods (handlers.py, next_edit.py) and the warm-ups (warmup.py) use of the daemon.

`daemon.Daemon` dispatches to those modules, so they name its type through these Protocols and
import nothing of daemon.py: the import graph keeps no circle, type-only ones included.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from . import protocol as P
    from ..core.engine_like import EngineLike
    from ..core.scheduler import Scheduler
    from .session import Session
    from .workspace import WorkspaceWatcher


class Warms(Protocol):
    """The daemon's warm-ups (warmup.Warmer) as the methods see them."""

    def touched(self, s: Session, uri: str, cursor: P.Position | None = None, after_s: float = ...) -> None: ...

    def asked(self, s: Session, uri: str, params: P.Params) -> None: ...

    def status(self, s: Session) -> dict[str, dict]: ...

    def closed(self, s: Session, uri: str) -> None: ...


class NextEditsAhead(Protocol):
    """The next edits computed in the pauses (next_edit.Ahead) as the methods see them."""

    def touched(self, s: Session, uri: str, cursor: P.Position | None, after_s: float) -> None: ...

    def asked(self, s: Session, uri: str, plan: tuple) -> None: ...

    def closed(self, s: Session, uri: str) -> None: ...


class Serving(Protocol):
    """The daemon (daemon.Daemon) as its methods and warm-ups see it."""
    engine: EngineLike | None  # None until the models are loaded (a method runs after that)
    scheduler: Scheduler | None
    sessions: dict[int, Session]
    watcher: WorkspaceWatcher
    warmer: Warms
    next_edits: NextEditsAhead
    info: dict
    token: str | None
    default_mode: str
    repo_context: bool
    quick_prompt_ms: float
    served: int
    started: float
    stopping: asyncio.Event

    def configured(self, path: Path) -> bool: ...

    def model_info(self) -> dict: ...
