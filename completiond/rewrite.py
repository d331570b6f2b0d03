"""Rewrite a selection: a prompt that shows the original code, so that the rewrite mostly copies it.

The original selection is in the prompt, so prompt lookup proposes long runs of it: a speculative
edit where the original text is a near-perfect draft. Works with base (non-chat) models: the rewrite
is asked for as the next fenced block of a small markdown document, and ends at the closing fence.
"""

from __future__ import annotations

from .stops import StopRules

FENCE = "```"


def rewrite_prompt(tokenizer, text: str, start: int, end: int, instruction: str, language: str = "",
                   max_context_chars: int = 6000) -> tuple[list[int], StopRules]:
    """Prompt ids and stop rules for rewriting text[start:end] according to the instruction."""
    selection = text[start:end]
    before = text[max(0, start - max_context_chars // 2):start]
    lang = language or ""
    doc = (f"Context (code before the selection):\n{FENCE}{lang}\n{before}\n{FENCE}\n\n"
           f"Original selection:\n{FENCE}{lang}\n{selection}\n{FENCE}\n\n"
           f"Instruction: {instruction.strip()}\n\n"
           f"Rewritten selection (the whole selection, changed as instructed):\n{FENCE}{lang}\n")
    bos = [tokenizer.bos_token_id] if getattr(tokenizer, "bos_token_id", None) is not None else []
    ids = bos + tokenizer.encode(doc, add_special_tokens=False)
    return ids, StopRules(line_rules=False, stop_strings=("\n" + FENCE, FENCE))


def finish(generated: str, selection: str) -> str:
    """Text to put in place of the selection: keep the selection's trailing newline if it had one."""
    out = generated
    if selection.endswith("\n") and not out.endswith("\n"):
        out += "\n"
    return out
