"""Loading without the cyclic garbage collector (torch-free: the CLI and the daemon use it first)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """Collections paused while a load allocates millions of long-lived objects (torch's import,
    the tokenizer's vocabulary tables): each full collection would scan them all again, ~0.4 of
    the ~3 CPU-s of a 0.5B's start. Afterwards they are frozen (gc.freeze: later collections skip
    them; a load's cycles hold no tensors, and the few small ones it leaves stay)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was:
            gc.enable()
