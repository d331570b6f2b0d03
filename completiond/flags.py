"""What every command line shares: one-line usage errors (exit 2), the model flags and their checks.

Torch-free, and imported by cli.py, daemon_cli.py, bench/cli.py and draft/cli.py (none imports another).
"""

from __future__ import annotations

import argparse
from pathlib import Path

EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit 2."""


def check_plot(path: str | None, extra: str) -> None:
    """--plot needs matplotlib, which the runtime install leaves out: say so before any work."""
    import importlib.util

    if path and importlib.util.find_spec("matplotlib") is None:
        raise UsageError(f"--plot needs matplotlib: pip install -e '.[{extra}]' (or pip install matplotlib)")


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse's own status for usage errors)
        raise UsageError(message)


MODEL_HELP = ("a named model (qwen2.5-coder-1.5b, qwen2.5-coder-0.5b, gemma3-270m), an HF id, a local "
              "directory, a .gguf file, or 'default' (by device: see README); NAME@FORM picks its weights "
              "form (int8, int4, none), e.g. qwen2.5-coder-1.5b@int4")


def model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="default", help=MODEL_HELP)
    p.add_argument("--draft", default="default",
                   help="as --target, or 'default' (one that fits the target), 'self:N' (first N target layers), "
                        "'eagle' / 'medusa' (heads on the target's hidden states, shipped for "
                        "qwen2.5-coder-0.5b), 'eagle:PATH' / 'medusa:PATH' (from `train-draft heads`), 'none'")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"],
                   help="weights/activations (auto: bf16 on CUDA and on CPUs where it measures faster, else fp32)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto: CUDA when present")
    p.add_argument("--quant", default="auto", choices=["auto", "none", "int8", "int4"],
                   help="weight-only quantization of the target (auto: int8 on CPU with bf16, none on CUDA); "
                        "the same as the target's @FORM")
    p.add_argument("--backend", default="auto", choices=["auto", "lean", "transformers"],
                   help="target forward: lean (ours, Gemma 3 / Qwen2) or transformers (the reference)")


def check_model_flags(a: argparse.Namespace) -> None:
    """Flag errors that need no model, caught before any model loads."""
    draft = getattr(a, "draft", None) or ""
    if draft.startswith("self:") and not draft[5:].isdigit():
        raise UsageError(f"--draft {draft}: N in self:N must be a whole number of layers")
    if getattr(a, "mode", None) == "draft" and draft == "none":
        raise UsageError("--mode draft needs a draft model; --draft none leaves none")
    workspace = getattr(a, "workspace", None)
    for w in workspace if isinstance(workspace, list) else [workspace] if workspace else []:
        if not Path(w).is_dir():
            raise UsageError(f"--workspace {w}: not a directory")
