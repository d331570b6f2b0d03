"""Decode and verify passes at fixed shapes, replayed from CUDA graphs.

On a GPU a small model's pass is mostly the time Python takes to launch its ~50 kernels per layer
(a 1.5B pass reads its 3 GB of bf16 weights in under a millisecond on an H200). A CUDA graph
launches a whole captured pass at once. A graph fixes every shape and address, so a pass of n
nodes runs here as one of SIZES rows over a bucket of KEY_STEP key slots:

- rows n..N-1 are padding: each attends to its own slot only (a finite row: a row that sees no key
  would be NaN, and a masked NaN value still poisons the sums) and is dropped; their K/V land in
  slots after the pass's, which no node sees and a later pass overwrites;
- keys are the slots [0, B), B the pass's last slot rounded up to KEY_STEP: the mask hides the
  slots after the pass (zeros or stale finite K/V);
- K/V are stored at the slots a tensor holds (`SlotCache`), not at a Python offset.

One graph per (rows, keys, cache buffers): a new document's cache, a grown cache or the next bucket
of keys captures again.
- A capture costs ~50 ms beyond its pass on an H200 (docs/gpu.md), about four eager passes, so a
  shape is captured at its second use. Its first use runs the same fixed-shape pass uncaptured (the
  same kernels, so the same bits as the replays); a shape used once (a document visited once, a
  tree size the budget tried once) never pays a capture.
- A graph holds the buffers and rotary tables it was captured with (their memory cannot be reused
  under it). It is dropped with them once its cache is gone (a document the engine let go) or has
  grown, checked whenever a new shape comes: a GPU holds no dead document's cache for long.
- Every decode/verify pass of a runner goes through here when graphs are on, so a tree node and the
  same token in a one-token pass take the same path (their bits can still differ by the matmuls'
  row count, as in eager passes on a GPU).
- Longer passes (prefill chunks over SIZES[-1] rows) and sliding-window models stay eager.

`capture=False` runs the same fixed-shape pass eagerly: the CPU tests check padding, buckets and
slots that way (tests/test_graphs.py); the CUDA tests replay real graphs (tests/test_cuda.py).
"""

from __future__ import annotations

import logging
import os
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import torch

from .kvcache import TreeKVCache

log = logging.getLogger(__name__)

SIZES = (1, 2, 4, 8, 16, 32, 64)
KEY_STEP = 512  # masked keys cost ~nothing on a GPU; fewer buckets, fewer captures
LIMIT = 64  # graphs kept per runner (least recently used dropped)


def wanted(device: torch.device) -> bool:
    """A runner's default: on a CUDA device, unless COMPLETIOND_CUDA_GRAPHS=0 (eager passes)."""
    return device.type == "cuda" and os.environ.get("COMPLETIOND_CUDA_GRAPHS", "1") != "0"


class SlotCache:
    """A TreeKVCache as a fixed-shape pass sees it: this pass's K/V stored at `slots` [N], every layer
    reading keys [0, keys). Nothing in it depends on a Python int that changes between passes."""

    def __init__(self, cache: TreeKVCache, slots: torch.Tensor, keys: int):
        self.cache, self.slots, self.keys = cache, slots, keys

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        kb, vb = self.cache.k[layer_idx], self.cache.v[layer_idx]  # [1, kv, capacity, d]
        kb.index_copy_(2, self.slots, k)
        vb.index_copy_(2, self.slots, v)
        return kb[:, :, :self.keys], vb[:, :, :self.keys]


@dataclass
class Graph:
    cache: weakref.ref  # the TreeKVCache it serves
    idx: torch.Tensor  # [3, N] int64: ids, positions, slots
    mask: torch.Tensor  # [1, 1, N, B] bool
    uses: int = 0  # passes run at this shape
    graph: object | None = None  # torch.cuda.CUDAGraph, None until captured (or capture=False)
    out: torch.Tensor | None = None  # [1, N, H] the captured pass's final hidden states
    keep: tuple = ()  # the cache buffers and rotary tables the graph reads


class PassGraphs:
    def __init__(self, base, device: torch.device, capture: bool = True):
        """base: a lean decoder (lean.LeanQwen2 / LeanGemma3 without sliding layers)."""
        self.base, self.device, self.capture = base, device, capture
        self.graphs: OrderedDict[tuple, Graph] = OrderedDict()
        self.pool = None  # one memory pool for all of this runner's graphs, made at the first capture
        self.captured = 0  # graphs captured so far (benchmarks report it)
        self.failed: str | None = None  # why capture failed; passes are eager from then on

    def run(self, ids: list[int], positions: list[int], anc: torch.Tensor, cache: TreeKVCache
            ) -> torch.Tensor | None:
        """Final hidden states [n, H] of the pass's n nodes (cache.begin_pass and reserve done by the
        caller), or None where no fixed shape applies (the caller runs it eagerly).
        anc: [n, pending + n] bool, each node's ancestors-or-self among the uncommitted nodes."""
        n = len(ids)
        rows = next((s for s in SIZES if s >= n), None)
        if rows is None or self.failed or len(cache.k) < len(self.base.layers):
            return None  # a cache's buffers are made by its first (prefill) pass
        L, begin = cache.length, cache.length + cache.pending
        cache.reserve(rows)  # the padding rows' slots too
        keys = min(-(-(begin + rows) // KEY_STEP) * KEY_STEP, cache.capacity)
        key = (rows, keys, cache.k[0].data_ptr())
        g = self.graphs.get(key)
        if g is None:
            self._prune()
            g = self.graphs[key] = Graph(weakref.ref(cache),
                                         torch.zeros(3, rows, dtype=torch.long, device=self.device),
                                         torch.zeros(1, 1, rows, keys, dtype=torch.bool, device=self.device))
            if len(self.graphs) > LIMIT:
                self.graphs.popitem(last=False)
        self.graphs.move_to_end(key)
        pad = rows - n
        idx = torch.tensor([ids + [0] * pad, positions + [positions[-1]] * pad,
                            list(range(begin, begin + rows))], dtype=torch.long)
        g.idx.copy_(idx, non_blocking=True)
        g.mask.zero_()
        g.mask[0, 0, :n, :L] = True
        g.mask[0, 0, :n, L:begin + n] = anc
        if pad:
            r = torch.arange(n, rows, device=self.device)
            g.mask[0, 0, r, begin + r] = True
        g.uses += 1
        if not self.capture or g.graph is None and g.uses < 2:
            return self._pass(g, cache, keys)[0, :n]
        if g.graph is None:
            try:
                self._capture(g, cache, keys)
            except Exception as e:  # noqa: BLE001 - any capture failure: eager from now on, said once
                self.failed = f"{type(e).__name__}: {e}"
                log.warning("CUDA graphs off for this model: %s", self.failed)
                self.graphs.clear()
                return None
        g.graph.replay()
        return g.out[0, :n].clone()  # the next replay (any graph of this pool) may overwrite g.out

    def status(self) -> dict:
        """For the daemon's `status`: shapes known, graphs captured so far, why capture failed (None)."""
        return {"shapes": len(self.graphs), "captured": self.captured, "failed": self.failed}

    def _prune(self) -> None:
        """Drop the graphs of caches that are gone or have grown (and the buffers they hold)."""
        for key in [k for k, g in self.graphs.items()
                    if (c := g.cache()) is None or not c.k or c.k[0].data_ptr() != k[2]]:
            del self.graphs[key]

    def _pass(self, g: Graph, cache: TreeKVCache, keys: int) -> torch.Tensor:
        return self.base(input_ids=g.idx[0:1], position_ids=g.idx[1:2], attention_mask=g.mask,
                         cache=SlotCache(cache, g.idx[2], keys), rope_top=keys).last_hidden_state

    def _capture(self, g: Graph, cache: TreeKVCache, keys: int) -> None:
        # One eager run on a side stream first (the inputs are this pass's own, so the K/V it writes
        # are the right ones): rotary tables, cuBLAS workspaces and the allocator warm up outside the capture.
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self._pass(g, cache, keys)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: another thread's CUDA work during the capture does not break it
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            out = self._pass(g, cache, keys)
        g.graph, g.out = graph, out
        g.keep = (tuple(cache.k), tuple(cache.v), tuple(self.base._rope.values()))
        self.captured += 1
