"""Rewrite a selection: a prompt that shows the original code, so that the rewrite mostly copies it.

The original selection is in the prompt, so prompt lookup proposes long runs of it: a speculative
edit where the original text is a near-perfect draft. Instruct models (a tokenizer with a chat
template, e.g. Qwen2.5-Coder-Instruct) get a system + user turn and an assistant turn that already
opens the fenced block; base models get the same request as a small markdown document. Either way
the rewrite ends at the closing fence.
"""

from __future__ import annotations

from .prompt import bos_ids
from .stops import StopRules

FENCE = "```"
SYSTEM = ("You rewrite code. Apply the instruction to the selection and reply with the whole rewritten "
          "selection in one fenced code block, nothing else. Keep everything the instruction does not change.")


def rewrite_prompt(tokenizer, text: str, start: int, end: int, instruction: str, language: str = "",
                   max_context_chars: int = 6000) -> tuple[list[int], StopRules]:
    """Prompt ids and stop rules for rewriting text[start:end] according to the instruction."""
    selection = text[start:end]
    before = text[max(0, start - max_context_chars // 2):start]
    lang = language or ""
    context = f"{FENCE}{lang}\n{before}\n{FENCE}\n\n" if before.strip() else ""
    if getattr(tokenizer, "chat_template", None):
        user = (f"Code before the selection:\n{context}" if context else "") + \
            f"Selection:\n{FENCE}{lang}\n{selection}\n{FENCE}\n\nInstruction: {instruction.strip()}"
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
        doc = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer.encode(doc + f"{FENCE}{lang}\n", add_special_tokens=False)
    else:
        doc = (f"Context (code before the selection):\n{context or FENCE + lang + chr(10) + FENCE + chr(10) * 2}"
               f"Original selection:\n{FENCE}{lang}\n{selection}\n{FENCE}\n\n"
               f"Instruction: {instruction.strip()}\n\n"
               f"Rewritten selection (the whole selection, changed as instructed):\n{FENCE}{lang}\n")
        ids = bos_ids(tokenizer) + tokenizer.encode(doc, add_special_tokens=False)
    return ids, StopRules(line_rules=False, stop_strings=("\n" + FENCE, FENCE))


def finish(generated: str, selection: str) -> str:
    """Text to put in place of the selection: keep the selection's trailing newline if it had one."""
    out = generated
    if selection.endswith("\n") and not out.endswith("\n"):
        out += "\n"
    return out
