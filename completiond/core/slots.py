"""Cached sequences by document (Request.slot): each runner holds one sequence at a time, and the
engine keeps the most recently used MAX_SLOTS, so switching between documents or clients does not
prefill again. A slot is one `Held` (KV cache + ids) per runner: the target's, and the draft's."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Hashable

from .forward.runner import Held, Runner

MAX_SLOTS = 6  # 0.5B Qwen, 4k tokens: ~50 MB each in bf16 (a quick prompt's: ~6 MB, see service/plan.Lane)


class Slots:
    def __init__(self, runners: list[Runner]):
        self.runners = runners
        # least recently used first; the runners hold `key`'s, which starts as what they hold now
        self.held: OrderedDict[Hashable, list[Held]] = OrderedDict({None: [Held(r.cache, r.tokens) for r in runners]})
        self.key: Hashable = None

    def __len__(self) -> int:
        return len(self.held)

    def keys(self) -> list[Hashable]:
        return list(self.held)

    def tokens(self, key: Hashable) -> list[int]:
        """The ids the target's cache of `key` holds (a snapshot copy; empty when there is none)."""
        held = self.held.get(key)
        return list(held[0].tokens) if held is not None else []

    def hold(self, key: Hashable, pinned: Collection[Hashable] = (), capacity: int | None = None) -> None:
        """Make the runners work on `key`'s sequences (new ones if it has none, their caches starting
        at `capacity` tokens). Room is made by dropping the least recently used slots, never those of
        `pinned` keys (jobs between turns)."""
        held = self.held.get(key)
        if held is None:
            spare = [k for k in self.held if k not in pinned]
            for k in spare[:max(0, len(self.held) + 1 - MAX_SLOTS)]:
                del self.held[k]
            held = self.held[key] = [r.new_held(capacity) for r in self.runners]
        self.held.move_to_end(key)
        if key != self.key:
            for runner, h in zip(self.runners, held):
                runner.hold(h)
            self.key = key
