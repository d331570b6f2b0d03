"""Rewrite a selection: a prompt that shows the original code, so that the rewrite mostly copies it.

The original selection is in the prompt, so prompt lookup proposes long runs of it: a speculative
edit where the original text is a near-perfect draft. Instruct models (a tokenizer with a chat
template, e.g. Qwen2.5-Coder-Instruct) get a system + user turn and an assistant turn that already
opens the fenced block; base models get the same request as a small markdown document. Either way
the rewrite ends at the closing fence.
"""

from __future__ import annotations

from . import bos_ids
from ...limits import MAX_PROMPT_TOKENS
from .stops import StopRules

FENCE = "```"
SYSTEM = ("You rewrite code. Apply the instruction to the selection and reply with the whole rewritten "
          "selection in one fenced code block, nothing else. Keep everything the instruction does not change.")
PROBE_CHARS = 8 * 1024  # tokenized first (~5 ms): most selections that are too large already are
CHECK_CHARS = 128 * 1024  # the most of a selection tokenized to size it (~90 ms); a longer one is refused unread


class TooLarge(ValueError):
    """A rewrite that cannot fit its prompt budget (the message says the limit and the size)."""


def _lines(selection: str) -> int:
    return selection.count("\n") + (1 if selection and not selection.endswith("\n") else 0)


def check_selection(tokenizer, selection: str, budget: int = MAX_PROMPT_TOKENS) -> int:
    """The selection's token count; TooLarge when it alone exceeds the rewrite prompt budget.

    A 2,000-line selection (70k characters) took minutes of prefill and 2 GB before; this refuses it
    by tokenizing at most its first 128k characters (8k first), so it is cheap enough to run as the request arrives."""
    for limit in (PROBE_CHARS, CHECK_CHARS):  # the event loop tokenizes no more than it must
        head = selection[:limit]
        n = len(tokenizer.encode(head, add_special_tokens=False)) if head else 0
        if n > budget or len(selection) <= limit:
            break
    if n <= budget and len(selection) <= limit:
        return n
    lines = _lines(selection)
    size = (f"{n:,} tokens" if len(selection) <= limit else
            f"{len(selection):,} characters, {n:,} tokens in its first {limit:,}")
    fit = _lines(head) * budget // max(n, 1)
    hint = f" (about {fit:,} lines like these)" if fit >= 1 and lines > 1 else ""
    raise TooLarge(f"selection too large to rewrite: {lines:,} line{'s' * (lines != 1)}, {size}; a rewrite prompt "
                   f"holds at most {budget:,} tokens with its instruction and context{hint}")


def rewrite_prompt(tokenizer, text: str, start: int, end: int, instruction: str, language: str = "",
                   max_context_chars: int = 6000, max_tokens: int = MAX_PROMPT_TOKENS) -> tuple[list[int], StopRules]:
    """Prompt ids and stop rules for rewriting text[start:end] according to the instruction.

    The prompt holds at most `max_tokens`: the code before the selection is windowed to what fits
    (TooLarge if the selection and instruction alone do not)."""
    selection = text[start:end]
    lang = language or ""

    def build(before: str) -> list[int]:
        context = f"{FENCE}{lang}\n{before}\n{FENCE}\n\n" if before.strip() else ""
        if getattr(tokenizer, "chat_template", None):
            user = (f"Code before the selection:\n{context}" if context else "") + \
                f"Selection:\n{FENCE}{lang}\n{selection}\n{FENCE}\n\nInstruction: {instruction.strip()}"
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
            doc = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            return tokenizer.encode(doc + f"{FENCE}{lang}\n", add_special_tokens=False)
        doc = (f"Context (code before the selection):\n{context or FENCE + lang + chr(10) + FENCE + chr(10) * 2}"
               f"Original selection:\n{FENCE}{lang}\n{selection}\n{FENCE}\n\n"
               f"Instruction: {instruction.strip()}\n\n"
               f"Rewritten selection (the whole selection, changed as instructed):\n{FENCE}{lang}\n")
        return bos_ids(tokenizer) + tokenizer.encode(doc, add_special_tokens=False)

    chars = max_context_chars // 2
    while True:
        before = text[max(0, start - chars):start]
        if start > chars and "\n" in before:  # a cut context starts at a line
            before = before[before.index("\n") + 1:]
        ids = build(before)
        if len(ids) <= max_tokens or not before.strip():
            break
        chars = int(chars * 0.6) if chars > 64 else 0  # dense code: a smaller window
    if len(ids) > max_tokens:
        raise TooLarge(f"rewrite prompt too large: {len(ids):,} tokens for a {_lines(selection):,}-line selection "
                       f"and its instruction; a rewrite prompt holds at most {max_tokens:,} tokens")
    return ids, StopRules(line_rules=False, stop_strings=("\n" + FENCE, FENCE))


def finish(generated: str, selection: str) -> str:
    """Text to put in place of the selection: keep the selection's trailing newline if it had one."""
    out = generated
    if selection.endswith("\n") and not out.endswith("\n"):
        out += "\n"
    return out
