"""completiond-lsp settings: initializationOptions and settings.completiond, typed and checked.

A bad value is skipped (the setting keeps its value) and described, so that the editor can show
one clear message instead of a request failing later; unknown keys are ignored (clients send their
own options alongside).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from completiond.service import protocol as P

MAX_DEBOUNCE_MS = 5000


def _integer(lo: int, hi: int) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        # JSON from some clients carries whole numbers as floats (64.0)
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ValueError(f"an integer {lo}..{hi}")
        return v
    return check


def _boolean(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError("true or false")
    return v


def _mode(v: Any) -> str:
    if v not in P.MODES:
        raise ValueError(" / ".join(P.MODES))
    return v


def _text_or_null(v: Any) -> str | None:
    if v is not None and not isinstance(v, str):
        raise ValueError("a string or null")
    return v


@dataclass
class Settings:
    """camelCase as on the wire; defaults as README documents them."""
    mode: str = "combined"
    maxTokens: int = P.DEFAULT_MAX_TOKENS
    multiline: bool = True  # the daemon's default too (protocol.Complete)
    debounceMs: int = 75  # requests typed over within it are dropped unsent
    # suggestions per request: 1 + up to 2 alternatives decoded in the same passes (several
    # InlineCompletionItems, for editors that cycle through them); 1 for editors that show one
    suggestions: int = 1
    socket: str | None = None  # None or "": the default socket
    autostart: bool = True
    streaming: bool = False
    target: str | None = None  # target/draft/dtype/device: for a daemon this server autostarts
    draft: str | None = None
    dtype: str | None = None
    device: str | None = None

    def update(self, values: Any) -> list[str]:
        """Apply the known keys of `values`; returns one line per value that was refused."""
        if not isinstance(values, dict):
            return [] if values is None else [f"settings must be an object, got {type(values).__name__}"]
        problems = []
        for f in fields(self):
            if f.name not in values:
                continue
            value = values[f.name]
            if value is None and f.name not in NULLABLE:
                continue  # null: keep the current value
            try:
                setattr(self, f.name, CHECKS[f.name](value))
            except ValueError as e:
                problems.append(f"setting {f.name} must be {e}, got {value!r:.60}; "
                                f"keeping {getattr(self, f.name)!r}")
        return problems


CHECKS: dict[str, Callable[[Any], Any]] = {
    "mode": _mode, "maxTokens": _integer(1, P.MAX_TOKENS), "multiline": _boolean,
    "debounceMs": _integer(0, MAX_DEBOUNCE_MS), "socket": _text_or_null, "autostart": _boolean,
    "streaming": _boolean, "target": _text_or_null, "draft": _text_or_null, "dtype": _text_or_null,
    "device": _text_or_null, "suggestions": _integer(1, P.MAX_SUGGESTIONS),
}
NULLABLE = {"socket", "target", "draft", "dtype", "device"}
