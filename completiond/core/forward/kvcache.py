"""A static KV cache whose rollback is "move the length back".

Every layer has K/V buffers of shape [1, kv_heads, capacity, head_dim]. Slots [0, length) hold the
committed sequence, slot i = position i. A forward pass writes its n new tokens (a chain, a token
tree, or both) at slots [length, length + n) without committing them (an appended pass writes after
the uncommitted nodes of earlier passes, `pending`, and may attend to them); afterwards `keep` moves the
accepted nodes down to [length, length + a) and advances `length`. Everything else is forgotten by
not advancing. Sliding-window layers keep every position too (no ring buffer), so rollback never has
to restore evicted entries; the runner hands them only the last `window` keys and masks by position.
"""

from __future__ import annotations

from functools import cache

import torch


class TreeKVCache:
    """The lean forward's cache. transformers' eager forward needs a `Cache` subclass: `for_transformers()`."""

    def __init__(self, capacity: int = 4096):
        self.capacity = capacity
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.length = 0  # committed tokens
        # The pass in flight (set by begin_pass): uncommitted slots after `length` it follows and may
        # attend to, and the first slot each layer sees (sliding layers skip old keys).
        self.pending = 0
        self.key_start: list[int] = []

    def begin_pass(self, pending: int, key_start: list[int]) -> None:
        """Everything a pass's K/V writes and reads depend on, set in one call before its layers run."""
        self.pending, self.key_start = pending, key_start

    def __len__(self) -> int:
        return len(self.k)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def reserve(self, n: int) -> None:
        """Make room for n uncommitted slots after `length` (buffers double when full)."""
        need = self.length + self.pending + n
        if need <= self.capacity:
            return
        new_cap = max(need, 2 * self.capacity)
        for i in range(len(self.k)):
            self.k[i] = _grow(self.k[i], new_cap)
            self.v[i] = _grow(self.v[i], new_cap)
        self.capacity = new_cap

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        # key_states: [1, kv_heads, n, head_dim] for the n nodes of this pass.
        if layer_idx == len(self.k):
            self.buffers(layer_idx, key_states.shape[1], key_states.shape[3], key_states.dtype, key_states.device)
        n = key_states.shape[2]
        begin = self.length + self.pending
        end = begin + n
        self.k[layer_idx][:, :, begin:end] = key_states
        self.v[layer_idx][:, :, begin:end] = value_states
        start = self.key_start[layer_idx] if layer_idx < len(self.key_start) else 0
        return self.k[layer_idx][:, :, start:end], self.v[layer_idx][:, :, start:end]

    def buffers(self, layer_idx: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """Layer layer_idx's K and V buffers [1, kv_heads, capacity, head_dim], made on first use
        (layers in order). The native Qwen2 layer (lean.py) writes and reads them directly."""
        if layer_idx == len(self.k):
            shape = (1, kv_heads, self.capacity, head_dim)
            self.k.append(torch.zeros(shape, dtype=dtype, device=device))
            self.v.append(torch.zeros(shape, dtype=dtype, device=device))
        return self.k[layer_idx], self.v[layer_idx]

    def keep(self, nodes: list[int]) -> None:
        """Commit the nodes of the last pass at these indices (ascending: a root-to-leaf path or chain)."""
        self.move(nodes)
        self.length += len(nodes)

    def move(self, nodes: list[int]) -> None:
        """Move the uncommitted slots at these indices (ascending) down to the first uncommitted slots,
        in order, without committing them (alternatives.py keeps several branches uncommitted)."""
        a = len(nodes)
        if a and nodes != list(range(a)):
            src = torch.tensor(nodes, device=self.k[0].device) + self.length
            for buf in (*self.k, *self.v):
                buf[:, :, self.length:self.length + a] = buf[:, :, src]

    def truncate(self, length: int) -> None:
        """Forget everything from slot `length` on (O(1): later passes overwrite it)."""
        self.length = min(self.length, length)


def _grow(buf: torch.Tensor, capacity: int) -> torch.Tensor:
    new = buf.new_zeros((*buf.shape[:2], capacity, buf.shape[3]))
    new[:, :, :buf.shape[2]] = buf
    return new


@cache
def for_transformers() -> type[TreeKVCache]:
    """TreeKVCache as a transformers `Cache` (what its eager forward takes), made on first use: a
    lean start does not import transformers (1.5 s)."""
    from transformers.cache_utils import Cache

    class HFTreeKVCache(TreeKVCache, Cache):
        def __init__(self, capacity: int = 4096):
            Cache.__init__(self, layers=[])
            TreeKVCache.__init__(self, capacity)

    return HFTreeKVCache
