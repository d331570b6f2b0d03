"""The completion's text (Output: ids -> text under the stop rules) and typed-through: what the
target already verified, served again with no pass.

A greedy completion is the target's own greedy continuation of its prompt (the speculation is
lossless), so every token it verified — those shown, and those accepted past a stop rule or
max_tokens — is known to follow the prompt. When the user types the first k tokens of that
continuation, the next request's prompt is `prompt + verified[:k]` and the target's greedy
continuation of it is `verified[k:]`, already known: the engine serves it with zero passes and
speculates on from its end.

Only an exact token-id prefix is served. A FIM prompt puts the cursor's text before the suffix, so
a prompt rebuilt from the edited document is not `prompt + typed ids`; `typed_prompt` builds the
prompt that is (the typed text as the start of the middle, a typed partial token as a heal).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from . import Heal
from .stops import StopRules


@dataclass
class Step:
    """What one target pass added: new token ids and the text they add to the completion."""
    token_ids: list[int]
    text: str


class Detokenizer:
    """Generated ids -> completion text, applying the stop rules token by token."""

    def __init__(self, tokenizer, prompt: list[int], stops: StopRules, eos: set[int], max_tokens: int,
                 hidden: str = ""):
        self.tok = tokenizer
        self.hidden = hidden  # leading text the editor already shows (a healed token's text)
        self.tail = prompt[-4:]  # decoded with the completion so leading spaces survive detokenization
        self.tail_text = self.decode(self.tail)
        self.stops, self.eos, self.max_tokens = stops, eos, max_tokens
        self.ids: list[int] = []
        self.text = ""
        self.emitted = 0
        self.stopped_by = ""

    def decode(self, ids: list[int]) -> str:
        if self.tok is None:
            return "".join(f"<{i}>" for i in ids)
        return self.tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def push(self, ids: list[int]) -> Step:
        """Add accepted tokens in order until a stop rule fires; return the text not yet emitted."""
        added: list[int] = []
        for t in ids:
            if t in self.eos:
                self.stopped_by = "eos"
                break
            self.ids.append(t)
            added.append(t)
            full = self.decode(self.tail + self.ids)
            text = full[len(self.tail_text):] if full.startswith(self.tail_text) else self.decode(self.ids)
            text = text[len(self.hidden):] if text.startswith(self.hidden) else ""
            cut = self.stops.cut(text)
            if cut is not None:
                self.text, self.stopped_by = text[:cut], "stop_rule"
                break
            self.text = text
            if len(self.ids) >= self.max_tokens:
                self.stopped_by = "max_tokens"
                break
        # hold back an incomplete UTF-8 sequence (shown as U+FFFD) until its bytes arrive
        stable = self.text if self.stopped_by else self.text.rstrip("\ufffd")
        delta = stable[self.emitted:] if len(stable) > self.emitted else ""
        self.emitted = max(self.emitted, len(stable))
        return Step(added, delta)

    @property
    def done(self) -> bool:
        return bool(self.stopped_by)


@dataclass
class Verified:
    prompt: list[int]
    tokens: list[int]  # the target's greedy continuation of `prompt` (the first under `heal`)
    heal: frozenset[int] | None  # the tokens the first one was constrained to (token healing), if any
    heal_text: str = ""  # the text that constraint hid (the editor already showed it)


class TypedThrough:
    """The last few greedy continuations (one per document the user moves between), newest first."""

    def __init__(self, size: int = 8):
        self.size = size
        self.entries: list[Verified] = []
        self.served = 0  # requests answered from here (status, tests)

    def record(self, prompt: Sequence[int], tokens: Sequence[int], heal: Heal | None) -> None:
        if not tokens:
            return
        entry = Verified(list(prompt), list(tokens), heal.allowed_set() if heal else None,
                         heal.text if heal else "")
        self.entries = [entry] + [e for e in self.entries if e.prompt != entry.prompt][:self.size - 1]

    def lookup(self, prompt: Sequence[int], heal: Heal | None) -> tuple[Verified, int] | None:
        """The entry that knows the greedy continuation of `prompt`, and how many of its tokens the
        prompt already holds (the continuation is `entry.tokens[k:]`).

        heal: the new request's constraint on its first token. An argmax over a set of tokens that
        holds the argmax over a larger set is that same token, so a remembered token may be served
        when it is allowed and, where the old first token was itself constrained (k = 0), when the
        new constraint narrows the old one."""
        allowed = heal.allowed_set() if heal is not None else None
        for n, e in enumerate(list(self.entries)):
            p = len(e.prompt)
            k = len(prompt) - p
            if not 0 <= k < len(e.tokens) or prompt[:p] != e.prompt or prompt[p:] != e.tokens[:k]:
                continue
            if k == 0 and e.heal is not None and (allowed is None or not allowed <= e.heal):
                continue
            if allowed is not None and e.tokens[k] not in allowed:
                continue
            self.entries.insert(0, self.entries.pop(n))
            self.served += 1
            return e, k
        return None

    def extend(self, entry: Verified, k: int, tokens: Sequence[int]) -> None:
        """A request served from `entry` at k then verified `tokens` (starting with the served ones):
        all of them follow entry.prompt + entry.tokens[:k], so the entry grows."""
        if k + len(tokens) > len(entry.tokens):
            entry.tokens = entry.tokens[:k] + list(tokens)

    def find(self, prompt: Sequence[int]) -> Verified | None:
        return next((e for e in list(self.entries) if e.prompt == list(prompt)), None)

    def clear(self) -> None:
        self.entries = []


def typed_prompt(tokenizer, entry: Verified, typed: str) -> tuple[list[int], Heal | None] | None:
    """The prompt (and heal) whose greedy continuation is `entry`'s after `typed`, the text the user
    typed at the cursor since `entry`'s request; None when `typed` is not a prefix of that text.

    Whole typed tokens extend the prompt; a partial one becomes a heal that allows only the
    remembered token (the greedy choice over any set that holds it), so the request is served from
    the entry, and a fresh engine given the same request computes the same tokens."""
    if not typed:
        return None  # nothing typed: the request's own prompt is the old one, served as it is
    shown = entry.heal_text + typed  # the generated text starts with what the old heal hid
    k, done = 0, ""
    while k < len(entry.tokens):
        nxt = tokenizer.decode(entry.tokens[:k + 1], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if "\ufffd" in nxt[len(done):] or not shown.startswith(nxt):
            break
        k, done = k + 1, nxt
    rest = shown[len(done):]
    if not rest:
        return entry.prompt + entry.tokens[:k], None
    if k == len(entry.tokens):
        return None
    token_text = tokenizer.decode(entry.tokens[:k + 1], skip_special_tokens=False,
                                  clean_up_tokenization_spaces=False)[len(done):]
    if not token_text.startswith(rest):
        return None  # the user typed something else
    if token_text[len(rest):][:1].isspace():  # the heal would force whitespace the user did not type: a
        # second line break after Enter ("\n\n": a blank ghost line), deeper indentation than they typed.
        # A prompt rebuilt there (the completion path) heals no blank line head: the model chooses anew
        return None
    return entry.prompt + entry.tokens[:k], Heal(text=rest, allowed=[entry.tokens[k]])
