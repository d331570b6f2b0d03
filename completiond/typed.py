"""Typed-through: what the target already verified, served again with no pass.

A greedy completion is the target's own greedy continuation of its prompt (the speculation is
lossless), so every token it verified — those shown, and those accepted past a stop rule or
max_tokens — is known to follow the prompt. When the user types the first k tokens of that
continuation, the next request's prompt is `prompt + verified[:k]` and the target's greedy
continuation of it is `verified[k:]`, already known: the engine serves it with zero passes and
speculates on from its end.

Only an exact token-id prefix counts: typed text that tokenizes differently from the suggestion
(a partial token, which prompt.py heals) is a different prompt, computed afresh.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Verified:
    prompt: list[int]
    tokens: list[int]  # the target's greedy continuation of `prompt` (the first under `heal`)
    heal: frozenset[int] | None  # the tokens the first one was constrained to (token healing), if any


class TypedThrough:
    """The last few greedy continuations (one per document the user moves between), newest first."""

    def __init__(self, size: int = 8):
        self.size = size
        self.entries: list[Verified] = []
        self.served = 0  # requests answered from here (status, tests)

    def record(self, prompt: Sequence[int], tokens: Sequence[int], heal: Sequence[int] | None) -> None:
        if not tokens:
            return
        entry = Verified(list(prompt), list(tokens), frozenset(heal) if heal is not None else None)
        self.entries = [entry] + [e for e in self.entries if e.prompt != entry.prompt][:self.size - 1]

    def lookup(self, prompt: Sequence[int], heal: Sequence[int] | None) -> list[int]:
        """The known greedy continuation of `prompt` (empty when none is known).

        heal: the new request's constraint on its first token. Its constrained argmax equals the
        unconstrained one whenever that one is allowed (an argmax over a subset that holds the
        overall argmax), so a remembered token that is allowed may be served."""
        for n, e in enumerate(self.entries):
            p = len(e.prompt)
            k = len(prompt) - p
            if not 0 <= k < len(e.tokens) or prompt[:p] != e.prompt or prompt[p:] != e.tokens[:k]:
                continue
            rest = e.tokens[k:]
            if k == 0 and e.heal is not None:  # the first token was chosen under the old constraint
                if heal is None or frozenset(heal) != e.heal:
                    continue
            elif heal is not None and rest[0] not in set(heal):
                continue
            self.entries.insert(0, self.entries.pop(n))
            self.served += 1
            return list(rest)
        return []

    def clear(self) -> None:
        self.entries = []
