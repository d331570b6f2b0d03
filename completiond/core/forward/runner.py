"""One model, its KV cache and the token ids the cache holds.

`forward` runs a batch of new nodes (a chain, a token tree, or a chain with a tree below it) in one
pass: each node attends to the committed sequence and to its own ancestors, at position
`length + depth`. Nodes stay uncommitted until `keep`. `extend` is prefill with prefix reuse: only
the tokens after the longest common prefix with what the cache holds are computed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass

import torch

from . import graphs
from .context import NO_CONTEXT, Cancelled, PassContext, Preempted  # Cancelled, Preempted: this module's API too
from .kvcache import TreeKVCache, for_transformers
from .lean import lean_decoder, supports_lean
from ...models import pages
from ...models.loaded import LoadedModel
from ...models.quant import bulk, QuantLinear, exact_head_logits, head_rows

SUPPORTED_LAYER_TYPES = {"full_attention", "sliding_attention"}
REFINE = 8  # top logits recomputed in float32 when the model runs in bf16/fp16
BACKENDS = ("transformers", "lean", "auto")
# Prefill chunk: a cancel lands between chunks and every finished chunk stays cached for the next
# request. Chunks follow a fixed grid of absolute positions, so a prefill resumed after a cancel
# runs the same shapes (hence the same K/V, bit for bit) as one that was never interrupted.
CHUNK = 256
WHOLE_CHUNK_MIN = 8  # see _prefill: superseded prefill chunks longer than this still run to their end
BULK_TOKENS = 64  # prefill chunks at least this long measure the per-token cost of a cold prompt
# The keyword a pass hands its decoder: the lean one takes it, transformers' passes it on to every
# decoder layer, where _layer_hook reads it (an argument of the pass, not a module attribute).
BETWEEN_LAYERS = "between_layers"


@dataclass
class Held:
    """One sequence's KV cache and the ids in its committed slots. A runner holds one at a time; the
    engine keeps one per document (Engine.slots) so that switching documents does not prefill again."""
    cache: TreeKVCache
    tokens: list[int]


@dataclass(frozen=True)
class Pass:
    """What one pass gives back (`Runner.run_pass`)."""
    logits: torch.Tensor  # [len(logits_at), vocab] float32
    hidden: torch.Tensor  # [len(logits_at), H] final hidden states (after the final norm): heads.py reads them
    ms: float  # its wall time


def _layer_hook(module, args, kwargs) -> None:
    """Forward pre-hook on each transformers decoder layer: the pass in flight may stop here."""
    between = kwargs.get(BETWEEN_LAYERS)
    if between is not None:
        between()


class Runner:
    def __init__(self, lm: LoadedModel, capacity: int = 4096, lean: bool = False, backend: str = "transformers",
                 refine: bool = True, cheap_head: bool = False, cuda_graphs: bool | None = None):
        """backend: "transformers" (the reference), "lean" (completiond.core.forward.lean; an error for model types
        it lacks) or "auto" (lean where the model type allows). refine: recompute the top REFINE
        logits in float32 when the model runs in bf16/fp16 (see _logits).
        cheap_head (greedy only, quantized output layer): logits exact on every row that can be the
        argmax and -inf elsewhere (quant.exact_head_logits); set `runner.cheap_head = False` for a
        request that samples, which needs the whole distribution.
        lean=True, for drafts (whose logits only rank proposals): backend "auto" without refinement.
        cuda_graphs: decode/verify passes of up to graphs.SIZES[-1] nodes replayed from CUDA graphs
        (graphs.py); None: on a CUDA device with the lean backend and no sliding window, unless
        COMPLETIOND_CUDA_GRAPHS=0. True elsewhere runs the same fixed-shape passes eagerly (tests)."""
        if lean:
            backend, refine = "auto", False
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r} (expected one of {', '.join(BACKENDS)})")
        if backend == "lean" and not supports_lean(lm.model):
            raise ValueError(f"no lean forward for this {lm.model.config.model_type} configuration")
        if cheap_head and not isinstance(lm.model.get_output_embeddings(), QuantLinear):
            raise ValueError("cheap_head needs a quantized output layer (completiond.models.quant.quantize)")
        if cheap_head and lm.model.get_output_embeddings().full_weight is None:
            raise ValueError("cheap_head needs the full-precision output layer: quantize(..., full_head=True)")
        if backend == "transformers" and hasattr(lm.model, "to_transformers"):
            lm.model = lm.model.to_transformers()  # models/skeleton.py: no eager forward of its own
        self.lm = lm
        self.model = lm.model
        self.base = getattr(lm.model, lm.model.base_model_prefix)  # the decoder without its output layer
        self.backend = "lean" if backend != "transformers" and supports_lean(lm.model) else "transformers"
        if self.backend == "lean":
            self.base = lean_decoder(self.base)
        self.refine = REFINE if refine else 0
        self.cheap_head = cheap_head
        self.device = lm.device
        cfg = lm.model.config
        self.window: int | None = getattr(cfg, "sliding_window", None)
        types = getattr(cfg, "layer_types", None)
        if types:
            if not set(types) <= SUPPORTED_LAYER_TYPES:
                raise ValueError(f"unsupported attention layer types {set(types) - SUPPORTED_LAYER_TYPES}")
            self.layer_types: list[str] | None = list(types)
        else:
            self.layer_types = None  # one mask for every layer (with the window if the model has one)
        if cuda_graphs is None:
            cuda_graphs = graphs.wanted(self.device)
        fixed_shapes = (self.backend == "lean" and self.window is None
                        and getattr(self.base, "native", None) is None)  # the CPU's native layer: one C call already
        self.graphs = (graphs.PassGraphs(self.base, self.device, capture=self.device.type == "cuda")
                       if cuda_graphs and fixed_shapes else None)
        self.capacity = capacity
        self._cache_type = TreeKVCache if self.backend == "lean" else for_transformers()
        self.cache = self._cache_type(capacity)
        self.tokens: list[int] = []  # ids held by cache slots [0, length)
        self._pass_ids: list[int] = []  # uncommitted nodes since the last keep/rollback, and their parents
        self._pass_parents: list[int] = []
        self.prefill_ms_per_token = 0.0  # of the last prefill chunk (the scheduler's work estimates)
        self.bulk_ms_per_token = 0.0  # of long prefill chunks (>= BULK_TOKENS), averaged: a cold prompt's cost
        self.layers_run = 0  # decoder layers started, all passes together (tests count preemption points)
        self._hf_layers = list(getattr(self.base, "layers", [])) if self.backend == "transformers" else []
        for layer in self._hf_layers:
            if not getattr(layer, "_completiond_hooked", False):  # once per module, however many runners
                layer.register_forward_pre_hook(_layer_hook, with_kwargs=True)
                layer._completiond_hooked = True

    @property
    def length(self) -> int:
        return self.cache.length

    def common_prefix(self, seq: Sequence[int]) -> int:
        n = min(len(seq), len(self.tokens))
        i = 0
        while i < n and self.tokens[i] == seq[i]:
            i += 1
        return i

    def rollback(self, length: int) -> None:
        self.cache.truncate(length)
        del self.tokens[length:]
        self._pass_ids, self._pass_parents = [], []

    def reset(self) -> None:
        self.rollback(0)

    def hold(self, seq: Held) -> Held:
        """Work on another sequence's cache from now on; returns the one held until now."""
        was = Held(self.cache, self.tokens)
        self.cache, self.tokens = seq.cache, seq.tokens
        self._pass_ids, self._pass_parents = [], []
        return was

    def new_held(self, capacity: int | None = None) -> Held:
        """An empty sequence; its cache starts at `capacity` slots (default the runner's) and grows."""
        return Held(self._cache_type(capacity or self.capacity), [])

    def forward(self, ids: Sequence[int], parents: Sequence[int], logits_at: Sequence[int],
                append: bool = False, ctx: PassContext = NO_CONTEXT, preemptible: bool = False) -> torch.Tensor:
        """Run new nodes; return float32 logits [len(logits_at), vocab] at those node indices (`run_pass`'s)."""
        return self.run_pass(ids, parents, logits_at, append, ctx, preemptible).logits

    @torch.inference_mode()
    def run_pass(self, ids: Sequence[int], parents: Sequence[int], logits_at: Sequence[int],
                 append: bool = False, ctx: PassContext = NO_CONTEXT, preemptible: bool = False) -> Pass:
        """Run new nodes; their logits and final hidden states at the node indices `logits_at`, and
        the pass's wall time. (The weights' move into 2 MB pages waits while passes run: pages.passing.)"""
        with pages.passing():
            return self._run_pass(ids, parents, logits_at, append, ctx, preemptible)

    def _run_pass(self, ids: Sequence[int], parents: Sequence[int], logits_at: Sequence[int],
                  append: bool, ctx: PassContext, preemptible: bool) -> Pass:
        """run_pass's pass.

        parents[i] is the index of node i's parent in this pass, or -1 for "the last committed token".
        append=True: the uncommitted nodes of the passes since the last keep/rollback stay, and the
        new nodes follow them: indices (in parents, and later in keep) count from the first of
        those nodes, so a new node may hang below any of them (a draft growing a tree step by step).
        ctx: the job's; its cancel is checked before every decoder layer and before the output
        layer (a cancelled pass commits nothing). preemptible: a prefill chunk that yields to a
        scheduler (`_prefill`); ctx.preempt is asked between its layers too (Preempted stops it).
        """
        t0 = time.perf_counter()
        if not append:
            self._pass_ids, self._pass_parents = [], []
        first, L = len(self._pass_ids), self.cache.length
        all_parents = self._pass_parents + list(parents)
        depth = _depths(all_parents)
        anc = _ancestors(all_parents, self.device)[first:]  # [n, first + n] bool: ancestor-or-self
        hidden = None  # [n, H]
        if self.graphs is not None:  # one launch for the whole pass; a cancel lands before or after it
            ctx.check()
            self.cache.begin_pass(pending=first, key_start=[])  # run reserves the rows it needs
            hidden = self.graphs.run(list(ids), [L + d for d in depth[first:]], anc, self.cache)
        if hidden is None:
            hidden = self._eager(ids, depth, anc, first, L, ctx, preemptible)
        self._pass_ids += list(ids)
        self._pass_parents = all_parents
        if len(logits_at):  # the output layer costs about a layer or more
            ctx.check()  # (the nodes stay uncommitted, as after any pass: keep commits)
        hidden = hidden[list(logits_at)]  # [len(logits_at), H]
        logits = self._logits(hidden)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return Pass(logits, hidden, (time.perf_counter() - t0) * 1000)

    def _eager(self, ids: Sequence[int], depth: list[int], anc: torch.Tensor, first: int, L: int,
               ctx: PassContext, preemptible: bool) -> torch.Tensor:
        """The pass through the decoder's own forward; final hidden states [n, H]."""
        node_pos = torch.tensor(depth, device=self.device) + L  # [first + n]: every uncommitted node
        mask, key_start = self._masks(anc, node_pos, L)
        # the pass's state for the cache, in one call: new K/V go after the `first` uncommitted nodes
        # they may attend to; each layer sees keys from its key_start slot on
        self.cache.begin_pass(pending=first, key_start=key_start)
        self.cache.reserve(len(ids))

        preempt = ctx.preempt if preemptible else None

        def between_layers() -> None:
            self.layers_run += 1
            if preempt is not None and preempt():
                raise Preempted()
            ctx.check()

        # A Cancelled raised between layers leaves length, tokens and the earlier uncommitted nodes
        # as they were: the half-written slots after them are overwritten by the next pass.
        out = self.base(
            input_ids=torch.tensor([list(ids)], device=self.device),
            position_ids=node_pos[None, first:],
            attention_mask=mask,
            cache=self.cache,
            use_cache=True,
            **{BETWEEN_LAYERS: between_layers},
        )
        return out.last_hidden_state[0]

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits [n, V] from final hidden states [n, H].

        In bf16/fp16 the output layer rounds logits to steps of 0.125 near 20, so the top tokens
        often tie exactly, and a tie may break one way in a one-token pass and the other way in a
        tree pass. The top REFINE candidates are therefore recomputed in float32 (a few rows of the
        output layer): argmax and sampling then depend on the hidden state, not on rounding. A
        quantized output layer ranks, and its full-precision rows rescore the top ones.
        """
        head = self.model.get_output_embeddings()
        if self.cheap_head:
            logits = exact_head_logits(head, hidden)  # already float32-exact where it can win
        else:
            logits = head(hidden).float()
        if not self.cheap_head and hidden.dtype != torch.float32 and len(hidden) and self.refine:
            top = logits.topk(self.refine, dim=-1).indices  # [n, k]
            rows = head_rows(head, top)  # [n, k, H]
            exact = (rows * hidden.float()[:, None, :]).sum(-1)  # not bmm: its sums depend on n
            if getattr(head, "bias", None) is not None:
                exact = exact + head.bias[top].float()
            logits.scatter_(1, top, exact)
        cap = getattr(self.model.config, "final_logit_softcapping", None)
        if cap:  # rows the cheap head ruled out stay -inf
            logits = torch.where(logits.isneginf(), logits, torch.tanh(logits / cap) * cap)
        return logits

    @torch.inference_mode()
    def keep(self, nodes: Sequence[int]) -> None:
        """Commit these nodes of the last pass (ascending, each the parent of the next)."""
        nodes = list(nodes)
        self.cache.keep(nodes)
        self.tokens.extend(self._pass_ids[i] for i in nodes)
        self._pass_ids, self._pass_parents = [], []

    def pending(self) -> tuple[list[int], list[int]]:
        """The uncommitted nodes since the last keep (ids, parents): `hold` forgets them, so a job that
        keeps nodes uncommitted across its turns (alternatives.py) saves them and restores them."""
        return list(self._pass_ids), list(self._pass_parents)

    def restore_pending(self, ids: list[int], parents: list[int]) -> None:
        """Undo `hold`'s forgetting: the K/V of these nodes is still in the held cache's slots after
        `length` (another sequence's passes wrote into its own cache)."""
        self._pass_ids, self._pass_parents = list(ids), list(parents)

    def compact(self, nodes: Sequence[int]) -> None:
        """Keep only these uncommitted nodes (ascending, each one's parent among them or -1), moved to
        the first uncommitted slots and renumbered in order; nothing is committed. Several branches
        decoded side by side (alternatives.py) stay uncommitted and shed their rejected nodes here."""
        nodes = list(nodes)
        if nodes == list(range(len(self._pass_ids))):
            return
        new = {old: i for i, old in enumerate(nodes)}
        self.cache.move(nodes)
        self._pass_ids = [self._pass_ids[i] for i in nodes]
        self._pass_parents = [new[self._pass_parents[i]] if self._pass_parents[i] >= 0 else -1 for i in nodes]

    def extend(self, seq: Sequence[int], chunk: int = CHUNK, ctx: PassContext = NO_CONTEXT,
               whole_chunks: bool = False) -> torch.Tensor:
        """Make the cache hold `seq` (prefix reuse); return float32 logits [vocab] after its last token.
        Never preempted: run to its end here, it has no turn to give back (only `extend_chunks` has).

        whole_chunks: cancel only between chunks, not between layers. A request superseded by the
        next keystroke in the same document then still finishes the chunk it is in, which the next
        request reuses; cancelled between layers, every keystroke would restart the same chunk."""
        return drain(self.extend_chunks(seq, chunk, dataclasses.replace(ctx, preempt=None), whole_chunks))[0]

    def extend_chunks(self, seq: Sequence[int], chunk: int = CHUNK, ctx: PassContext = NO_CONTEXT,
                      whole_chunks: bool = False) -> Generator[None, None, tuple[torch.Tensor, torch.Tensor]]:
        """`extend`, yielding after every chunk (a scheduler may run another job there; ctx.preempt may
        stop a chunk between two layers for it). Returns the logits [vocab] and the final hidden
        state [H] after the last token (read when they were computed: another job's passes may run
        before this generator ends)."""
        if not seq:
            raise ValueError("empty sequence")
        c = min(self.common_prefix(seq), len(seq) - 1)  # recompute at least the last token for its logits
        return (yield from self._prefill(seq, c, chunk, ctx, logits=True, whole_chunks=whole_chunks))

    def sync(self, seq: Sequence[int], chunk: int = CHUNK, ctx: PassContext = NO_CONTEXT) -> None:
        """Make the cache hold exactly `seq` (prefix reuse), without logits: no pass when it already
        does. Never preempted, as `extend`."""
        drain(self.sync_chunks(seq, chunk, dataclasses.replace(ctx, preempt=None)))

    def sync_chunks(self, seq: Sequence[int], chunk: int = CHUNK, ctx: PassContext = NO_CONTEXT
                    ) -> Generator[None, None, None]:
        """`sync`, yielding after every chunk (ctx.preempt may stop one, as in `extend_chunks`)."""
        yield from self._prefill(seq, self.common_prefix(seq), chunk, ctx, logits=False)

    def _prefill(self, seq: Sequence[int], c: int, chunk: int, ctx: PassContext,
                 logits: bool, whole_chunks: bool = False) -> Generator[None, None, tuple | None]:
        """Roll back to `c` tokens, then run seq[c:] in chunks on the grid of multiples of `chunk`,
        committing each: a cancel keeps every chunk that finished. Yields after each chunk, and when
        `ctx.preempt` stopped one (which then runs again). Returns (logits [vocab], hidden [H]) after
        the last token when `logits`."""
        self.rollback(c)
        out = None
        first = True
        while c < len(seq):
            end = min(len(seq), (c // chunk + 1) * chunk)
            part = list(seq[c:end])
            # whole_chunks: a request's prefill, once begun, runs at least one chunk even if the
            # next keystroke superseded it meanwhile: the next request reuses it (at 200 Hz typing,
            # every request is superseded before it starts, and the prompt would never advance).
            # Not a chunk of a few tokens (a keystroke's): it costs a pass whatever its length, so
            # the next request, whose prompt holds those tokens too, would pay that pass twice.
            whole = whole_chunks and len(part) > WHOLE_CHUNK_MIN
            if not (whole and first):
                ctx.check()
            first = False
            chunk_ctx = dataclasses.replace(ctx, cancel=None) if whole else ctx  # whole: no cancel inside
            at = [len(part) - 1] if logits and end == len(seq) else []
            try:
                with bulk(self.lm.bulk_dtype):  # many rows: dense matmuls beat the per-row kernel
                    done = self.run_pass(part, list(range(-1, len(part) - 1)), at, ctx=chunk_ctx, preemptible=True)
                if at:
                    out = (done.logits[-1], done.hidden[-1])
            except Preempted:  # nothing of this chunk was committed: it runs again
                yield
                continue
            self.keep(range(len(part)))
            ms = self.prefill_ms_per_token = done.ms / len(part)
            if len(part) >= BULK_TOKENS:
                self.bulk_ms_per_token = (self.bulk_ms_per_token + ms) / 2 if self.bulk_ms_per_token else ms
            c = end
            yield
        return out

    def _masks(self, anc: torch.Tensor, node_pos: torch.Tensor, L: int) -> tuple[object, list[int]]:
        """Boolean attention masks [1, 1, n, keys] for the pass (a dict by layer type for hybrid
        models), and the first key slot each layer sees ([] = slot 0 for all).

        anc: [n, m] the new nodes' ancestors among the m uncommitted nodes (the last n are the new
        ones); node_pos: [m] their positions.
        """
        n = anc.shape[0]
        full = torch.cat([torch.ones(n, L, dtype=torch.bool, device=self.device), anc], 1)
        if self.window is None:
            return full[None, None], []
        # Sliding layers see keys from slot `start` on: the oldest any node of this pass can reach.
        start = max(0, L - self.window + 1)
        pos = node_pos[-n:]
        key_pos = torch.cat([torch.arange(start, L, device=self.device), node_pos])
        sliding = full[:, start:] & (pos[:, None] - key_pos[None, :] < self.window)
        if self.layer_types is None:
            return sliding[None, None], [start] * self.model.config.num_hidden_layers
        return ({"full_attention": full[None, None], "sliding_attention": sliding[None, None]},
                [start if t == "sliding_attention" else 0 for t in self.layer_types])


def drain(steps: Generator):
    """Run a generator of steps to its end; its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value


def _depths(parents: Sequence[int]) -> list[int]:
    depth: list[int] = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    return depth


def _ancestors(parents: Sequence[int], device: torch.device) -> torch.Tensor:
    n = len(parents)
    if all(p == i - 1 for i, p in enumerate(parents)):  # a plain chain: causal
        return torch.ones(n, n, dtype=torch.bool, device=device).tril_()
    anc = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            anc[i] |= anc[p]
    return anc.to(device)
