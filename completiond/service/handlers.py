"""The daemon's methods: typed params in (protocol.py), a result map out.

Immediate methods run on the event loop. `complete` and `rewrite` are *prepared* there, in the order
frames arrive (document, version, position and text are fixed at that moment), and return an
`EngineJob` (`CompletionJob`, `RewriteJob`) whose `build` makes the engine request later on the
engine thread. A completion's inputs are one value (`CompletionPlan`); what the engine thread learns
(its lanes, a new anchor) comes back in a `Built`, which the event loop applies: the engine thread
writes no session state.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from . import protocol as P
from ..core.forward.context import PassContext
from ..core.prompt.context import locate, related_files
from .documents import Document, DocumentError
from ..core.prompt import build_prompt, extend_middle, fim_tokens, stops_at
from ..core.prompt.rewrite import TooLarge, check_selection, finish, rewrite_prompt
from .history import change_span, job_key
from .next_edit import prepare as prepare_next_edit
from . import plan as quick_plan  # the quick prompt's size and outline (read per request: tests set them)
# QUICK_PROMPT_TOKENS: imported from here by callers and tests
from .plan import QUICK_PROMPT_TOKENS, Anchor, Built, EngineJob, Lane, quick_prompt_tokens  # noqa: F401
from ..core.prompt.stops import drop_repeated_head
from .session import Session

if TYPE_CHECKING:  # torch stays unimported until the models load (the socket is up before)
    from .serving import Serving
    from ..core.engine_like import EngineLike
    from ..core.request import Result


MAX_OTHER_BUFFERS = 16  # open buffers a completion considers for its repository context


@dataclass(frozen=True)
class Method:
    params: type[P.Params]
    fn: Callable[..., Any]
    job: bool = False  # prepared now, run on the engine thread as its own task


# ---- immediate methods --------------------------------------------------------------------------
async def initialize(d: Serving, s: Session, p: P.Initialize, msgid) -> dict:
    if not s.authed:
        if not (d.token and hmac.compare_digest(p.token.encode(), d.token.encode())):
            raise P.RpcError(P.INVALID_REQUEST, "bad or missing token", close=True)
        s.authed = True
    if p.protocol != P.PROTOCOL_VERSION:
        raise P.RpcError(P.INVALID_PARAMS, f"protocol {p.protocol} not supported (this daemon speaks "
                                           f"{P.PROTOCOL_VERSION})")
    s.name, s.encoding = p.client, p.position_encoding
    ignored = []
    for root in p.workspace_roots:
        path = Path(root[7:] if root.startswith("file://") else root)
        if s.tcp:  # a TCP peer may be another user: it gets only the roots the daemon's owner configured
            if not d.configured(path):
                ignored.append(str(path))
            continue
        if path.is_dir():
            await asyncio.to_thread(d.watcher.add_root, path)
    return {"protocol": P.PROTOCOL_VERSION, "server_version": __version__, "position_encoding": s.encoding,
            "ignored_roots": ignored, **d.model_info()}


async def doc_open(d: Serving, s: Session, p: P.DocumentOpen, msgid) -> None:
    old = s.docs.get(p.uri)
    if old is None and len(s.docs) >= P.MAX_OPEN_DOCUMENTS:
        raise P.RpcError(P.INVALID_PARAMS, f"too many open documents: {P.MAX_OPEN_DOCUMENTS} per connection")
    if s.chars() - (len(old.text) if old else 0) + len(p.text) > P.MAX_SESSION_CHARS:
        raise P.RpcError(P.INVALID_PARAMS, f"open documents over {P.MAX_SESSION_CHARS} characters in all: close some")
    s.docs[p.uri] = Document(p.uri, p.text, p.version, p.language_id)


async def doc_change(d: Serving, s: Session, p: P.DocumentChange, msgid) -> None:
    doc = s.doc(p.uri)
    before, span = doc.text, change_span(doc, p.changes, s.encoding)
    room = min(P.MAX_DOCUMENT_CHARS, P.MAX_SESSION_CHARS - s.chars() + len(doc.text))
    try:
        doc.apply(p.changes, doc.version + 1 if p.version is None else p.version, s.encoding, room)
    except DocumentError as e:
        raise P.RpcError(P.INVALID_PARAMS, str(e)) from None
    edited(s, doc, before, span)


def edited(s: Session, doc: Document, before: str, span: tuple[int, int, int] | None = None) -> None:
    """After a change: into the edit history (next_edit reads it); a next edit of the older text is stale."""
    if span is not None:
        s.history.record_span(doc.uri, before, doc.text, *span, doc.version)
    else:
        s.history.record(doc.uri, before, doc.text, doc.version)
    if (job := s.latest.get(job_key(doc.uri))) is not None:
        job.cancel.set()


async def doc_close(d: Serving, s: Session, p: P.DocumentClose, msgid) -> None:
    if s.docs.pop(p.uri, None) is None:
        raise P.RpcError(P.INVALID_PARAMS, f"document not open: {p.uri}")
    d.engine.index.close(s.index_key(p.uri))
    s.anchors.pop(p.uri, None)
    d.warmer.closed(s, p.uri)
    d.next_edits.closed(s, p.uri)


async def doc_cursor(d: Serving, s: Session, p: P.DocumentCursor, msgid) -> None:
    """The editor's cursor rests here (LSP sends no cursor): once it stays, warm this position."""
    s.offset(s.doc(p.uri), p.position)  # -32602 for a position outside the document
    d.warmer.touched(s, p.uri, p.position, 0.0)  # editors send it once the cursor rests: warm at once
    d.next_edits.touched(s, p.uri, p.position, 0.0)


async def cancel(d: Serving, s: Session, p: P.Cancel, msgid) -> None:
    job = s.jobs.get(p.id)
    if job is None:
        raise P.RpcError(P.INVALID_PARAMS, f"no request {p.id} in flight")
    job.cancel.set()


async def status(d: Serving, s: Session, p: P.Empty, msgid) -> dict:
    st = d.engine.stats
    return {
        **d.info, "server_version": __version__, "pid": os.getpid(),
        "uptime_s": round(time.time() - d.started, 1),
        "weights": d.engine.target.meta.get("weights"),  # live: the move into 2 MB pages ends after ready
        "weights_file": d.engine.target.meta.get("runtime"),  # the runtime form's weights the target maps (None: none)
        "clients": sum(1 for c in d.sessions.values() if c is not s),  # not the one asking
        "documents": sum(len(c.docs) for c in d.sessions.values()),
        "indexed_files": d.engine.index.n_files, "workspace_roots": [str(r) for r in d.watcher.roots],
        "index_idle": d.watcher.idle, "requests_served": d.served,
        "workspace": d.watcher.status(),  # per root: files, bytes, watched dirs, cap message
        "mean_accepted": round(st["accepted"] / st["passes"], 4) if st["passes"] else 0.0,
        # work that no editor saw: cancelled requests (and their wall ms), warm-ups (and the preempted
        # ones), tokens served from memory with no pass
        "stale": {k: round(st[k], 1) for k in ("cancelled", "cancelled_ms", "warms", "warms_preempted", "warm_ms",
                                               "served_tokens") if k in st},
        "pass_cost_ms": {str(n): round(ms, 1) for n, ms in d.engine.budget.costs().items()},  # by tree size
        # the same table with where each entry came from (calibrated / cached / interpolated / observed),
        # its passes and probes, and the table's origin, age and the load it was measured under
        "pass_costs": d.engine.budget.table_status(),
        "warm": d.warmer.status(s),  # per document of the asker: is its next completion's prompt cached?
        # the engine thread's turns: jobs queued or paused now, prefill chunks stopped for a new
        # request, documents with a cached sequence
        "scheduler": {**d.scheduler.stats, "waiting": len(d.scheduler.jobs), "slots": len(d.engine.slots)},
        # the target's passes replayed from CUDA graphs (core/forward/graphs.py); None: eager passes
        # (or a remote target, whose runner has none)
        "cuda_graphs": graphs.status() if (graphs := getattr(d.engine.runner, "graphs", None)) else None,
    }


async def lookup(d: Serving, s: Session, p: P.Lookup, msgid) -> dict:
    """What prompt lookup would propose at a position (texts), for debugging and tests."""
    doc = s.doc(p.uri)
    offset = s.offset(doc, p.position)
    text, starts, tok = doc.text, doc.starts, d.engine.target.tokenizer

    def work(ctx: PassContext) -> list[str]:  # no pass: nothing to cancel or preempt
        ids = build_prompt(tok, text, offset, starts=starts).ids
        return [tok.decode(c) for c in d.engine.lookup(ids, p.max_len, 8)]

    return {"candidates": await asyncio.wrap_future(d.scheduler.submit(work, (s.id, p.uri)))}


async def shutdown(d: Serving, s: Session, p: P.Empty, msgid) -> None:
    asyncio.get_running_loop().call_later(0.05, d.stopping.set)


# ---- engine jobs --------------------------------------------------------------------------------
def _mode(d: Serving, mode: str | None) -> str:
    mode = mode or d.default_mode
    if mode == "draft" and d.engine.draft is None:
        raise P.RpcError(P.INVALID_PARAMS, f"mode 'draft' needs a draft model; this daemon has none: "
                                           f"{d.info.get('draft') or 'none'}")
    return mode


QUICK_CAPACITY = 512  # its cached sequence starts this small (it grows if typing makes it longer)


def pick_lane(e: EngineLike, quick_prompt_ms: float, full: Lane, quick: Lane | None) -> Lane:
    """The full lane, unless its cache lacks more than `quick_prompt_ms` of prefill (measured per
    token on this device; < 0: never) and the quick lane lacks less. Reads cache snapshots: any thread."""
    if quick is None or quick_prompt_ms < 0:
        return full
    lacks = len(full.ids) - e.cached_prefix_len(full.ids, full.slot)
    if lacks * e.prefill_ms_per_token() <= quick_prompt_ms:
        return full
    return quick if len(quick.ids) - e.cached_prefix_len(quick.ids, quick.slot) < lacks else full


MAX_TYPED_CHARS = 512  # typed past the anchor: after this many characters the prompt is rebuilt


def typed_since(a: Anchor | None, text: str, offset: int) -> str | None:
    """What was typed at the anchor's cursor to turn its text into `text` with the cursor at
    `offset` (nothing else changed), else None."""
    if a is None or not a.fim or not 0 < offset - a.offset <= MAX_TYPED_CHARS \
            or len(text) != len(a.text) + offset - a.offset:
        return None
    typed = text[a.offset:offset]
    if not (text.startswith(a.text[:a.offset]) and text.endswith(a.text[a.offset:])):
        return None
    return typed


@dataclass(frozen=True)
class CompletionPlan:
    """A completion as the event loop fixed it, in frame order: the document's text and cursor, the
    request's parameters, the repository context and the anchor as they were then. The engine
    thread builds the prompt from it (`build_completion`) and reads nothing of the session."""
    uri: str
    slot: tuple[int, str]  # the document's cached sequence: (session id, uri)
    mode: str
    text: str
    offset: int
    starts: Any  # the document's line index (prompt.line_index), for position -> offset
    params: P.Complete
    greedy: bool
    anchor: Anchor | None  # the document's anchor, used when `typed` is not None
    typed: str | None  # typed at the anchor's cursor since: the prompt extends the anchor's
    roots: tuple[Path, ...]
    others: tuple[tuple[str, str], ...]  # other open buffers (uri, text), with serve --repo-context
    indexed: tuple[tuple[Path, tuple[str, ...]], ...]  # indexed workspace files per root, likewise
    repo_context: bool  # the daemon's serve --repo-context
    quick_prompt_ms: float  # the daemon's: see pick_lane


def plan_completion(d: Serving, s: Session, p: P.Complete) -> CompletionPlan:
    """Snapshot on the event loop everything a completion's prompt depends on."""
    doc = s.current(p.uri, p.version)
    offset = s.offset(doc, p.position)
    # Repository context, snapshotted on the event loop (the engine thread must not read sessions):
    # this client's other open documents, most recently opened first (a few: the prompt shows at
    # most context.MAX_FILES), and the indexed workspace files; only with serve --repo-context.
    roots = tuple(d.watcher.roots)
    others, indexed = (), ()
    if d.repo_context:
        recent = itertools.islice(reversed(s.docs.values()), MAX_OTHER_BUFFERS + 1)
        others = tuple((o.uri, o.text) for o in recent if o.uri != doc.uri)[:MAX_OTHER_BUFFERS]
        indexed = tuple((root, tuple(d.watcher.indexed.get(root, {}))) for root in roots)
    greedy = p.temperature < P.MIN_TEMPERATURE
    anchor = s.anchors.get(doc.uri) if greedy and p.reuse_prefix else None
    return CompletionPlan(uri=doc.uri, slot=(s.id, doc.uri), mode=_mode(d, p.mode), text=doc.text, offset=offset,
                          starts=doc.starts, params=p, greedy=greedy, anchor=anchor,
                          typed=typed_since(anchor, doc.text, offset), roots=roots, others=others, indexed=indexed,
                          repo_context=d.repo_context, quick_prompt_ms=d.quick_prompt_ms)


def build_completion(engine: EngineLike, plan: CompletionPlan) -> Built:
    """On the engine thread: the plan's prompt (tokenized here, off the event loop) in the lane
    that pays, as a Request; the lanes and a new anchor come back for the event loop to keep."""
    from ..core.engine import Request
    from ..core.speculation.verify import Sampling

    p, text, offset, slot, tok = plan.params, plan.text, plan.offset, plan.slot, engine.target.tokenizer
    common = dict(mode=plan.mode, max_tokens=p.max_tokens, seed=p.seed, n=p.n, sampling=Sampling(p.temperature, p.top_p, p.top_k),
                  deadline_ms=p.deadline_ms, reuse_prefix=p.reuse_prefix, typed_through=plan.greedy)
    if plan.typed is not None:  # the user typed on at the anchor's cursor: keep its prompt, add what was typed
        anchor, typed = plan.anchor, plan.typed
        lane = pick_lane(engine, plan.quick_prompt_ms, anchor.full, anchor.quick)
        stops = stops_at(text, offset, p.multiline, fim=True)
        served = engine.typed_prompt(lane.ids, typed)  # typed what the suggestion said: no pass
        line_head = text[text.rfind("\n", 0, offset) + 1:offset]

        def extended(a: Lane) -> Lane:
            ids, heal = extend_middle(tok, a.ids, (a.heal.text if a.heal else "") + typed,
                                      heal_last=bool(line_head.strip()))
            return Lane(ids, heal, a.slot, a.capacity)

        chosen = Lane(*served, lane.slot, lane.capacity) if served is not None else extended(lane)
        full = chosen if lane is anchor.full else extended(anchor.full)
        req = Request(prompt=chosen.ids, stops=stops, heal=chosen.heal, slot=chosen.slot, **common)
        return Built(request=req, lane=chosen, full=full)
    path, repo = locate(plan.uri, plan.roots)
    workspace = ((Path(f).relative_to(root).as_posix(), Path(f)) for root, files in plan.indexed for f in files
                 if Path(f).is_relative_to(root))  # walked only if the file imports something
    context = related_files(path, text, [(locate(u, plan.roots)[0], t) for u, t in plan.others], workspace) \
        if plan.repo_context else None
    prompt = build_prompt(tok, text, offset, multiline=p.multiline, path=path, repo=repo, context=context,
                          starts=plan.starts)
    full = Lane(prompt.ids, prompt.heal, slot)
    quick = None
    size = quick_prompt_tokens(engine.prefill_ms_per_token())
    if p.reuse_prefix and p.quick and plan.quick_prompt_ms >= 0 and len(full.ids) > size + 64:
        q = build_prompt(tok, text, offset, multiline=p.multiline, max_tokens=size, path=path,
                         repo=repo, starts=plan.starts, outline=quick_plan.QUICK_OUTLINE)
        quick = Lane(q.ids, q.heal, (*slot, "quick"), max(QUICK_CAPACITY, 2 * size))
    chosen = pick_lane(engine, plan.quick_prompt_ms, full, quick)
    req = Request(prompt=chosen.ids, stops=prompt.stops, heal=chosen.heal, slot=chosen.slot, **common)
    return Built(request=req, lane=chosen, full=full,
                 anchor=Anchor(text, offset, full, quick, fim=fim_tokens(tok) is not None))


def shown_text(cursor_head: str, out: str, final: bool) -> str | None:
    """What a client is shown of the engine's text `out` so far: without a repeat of the line's last
    words, and nothing while it is whitespace alone (after an accept the model often starts with the
    line break: drawn alone it is a blank ghost line, and Tab would insert it). None while undecided
    (a partial held back); "" when the final text shows nothing."""
    out = drop_repeated_head(cursor_head, out, final)
    if out is not None and not out.strip():
        return "" if final else None
    return out


@dataclass(frozen=True, kw_only=True)
class CompletionJob(EngineJob):
    """`complete`: its plan, and the session that keeps the anchor its prompt leaves."""
    partial = "complete/partial"
    plan: CompletionPlan
    session: Session
    cursor_head: str  # the cursor's line up to the cursor

    def build(self, engine: EngineLike) -> Built:
        return build_completion(engine, self.plan)

    def learned(self, built: Built) -> None:  # on the event loop, once the engine built the prompt
        if built.anchor is not None:
            self.session.anchors[self.plan.uri] = built.anchor

    def shown(self, text: str, final: bool) -> str | None:
        # a suggestion never writes the line's last words again (`    def ` + `def f(` -> `def def f(`)
        return shown_text(self.cursor_head, text, final)

    def answer(self, result: Result, built: Built) -> dict:
        lane = "quick" if built.lane is not None and built.lane.slot != self.plan.slot else "full"
        out = P.Completion.of(result, text=self.shown(result.text, True)).to_wire()
        seen = {out["text"]}
        alternatives = []
        for a in out["alternatives"]:  # cleaned like the main text; one that becomes a duplicate goes
            a["text"] = self.shown(a["text"], True)
            if a["text"] and a["text"] not in seen:
                seen.add(a["text"])
                alternatives.append(a)
        return {**out, "alternatives": alternatives, "prompt_lane": lane}


def complete(d: Serving, s: Session, p: P.Complete) -> CompletionJob:
    plan = plan_completion(d, s, p)
    text, offset = plan.text, plan.offset
    return CompletionJob(uri=plan.uri, mode=plan.mode, plan=plan, session=s,
                         cursor_head=text[text.rfind("\n", 0, offset) + 1:offset])


@dataclass(frozen=True, kw_only=True)
class RewriteJob(EngineJob):
    """`rewrite`: the document's text and the selection [start, end) as the request found them."""
    partial = "rewrite/partial"
    params: P.Rewrite
    text: str
    start: int
    end: int
    n_sel: int  # the selection's tokens
    lang: str

    def build(self, engine: EngineLike) -> Built:
        from ..core.engine import Request

        p = self.params
        # default: room for the selection rewritten at twice its length
        max_tokens = min(P.MAX_TOKENS, 2 * self.n_sel + 64) if p.max_tokens is None else p.max_tokens
        try:  # the context before the selection is windowed to the prompt budget
            ids, stops = rewrite_prompt(engine.target.tokenizer, self.text, self.start, self.end, p.instruction,
                                        self.lang, max_tokens=P.MAX_PROMPT_TOKENS)
        except TooLarge as e:
            raise P.RpcError(P.INVALID_PARAMS, str(e)) from None
        return Built(request=Request(prompt=ids, mode=self.mode, max_tokens=max_tokens, stops=stops))

    def answer(self, result: Result, built: Built) -> dict:
        return P.Completion.of(result, text=finish(result.text, self.text[self.start:self.end])).to_wire()


def rewrite(d: Serving, s: Session, p: P.Rewrite) -> RewriteJob:
    doc = s.current(p.uri, p.version)
    start = s.offset(doc, p.range.start, "range")
    end = s.offset(doc, p.range.end, "range")
    if end < start:
        raise P.RpcError(P.INVALID_PARAMS, "range ends before it starts")
    mode = _mode(d, p.mode)
    try:  # sized now (one bounded tokenization): a selection over the budget is refused at once
        n_sel = check_selection(d.engine.target.tokenizer, doc.text[start:end], P.MAX_PROMPT_TOKENS)
    except TooLarge as e:
        raise P.RpcError(P.INVALID_PARAMS, str(e)) from None
    return RewriteJob(uri=doc.uri, mode=mode, params=p, text=doc.text, start=start, end=end,
                      n_sel=n_sel, lang=doc.language_id)


METHODS: dict[str, Method] = {
    "initialize": Method(P.Initialize, initialize), "document/open": Method(P.DocumentOpen, doc_open),
    "document/change": Method(P.DocumentChange, doc_change), "document/close": Method(P.DocumentClose, doc_close),
    "document/cursor": Method(P.DocumentCursor, doc_cursor),
    "complete": Method(P.Complete, complete, job=True), "rewrite": Method(P.Rewrite, rewrite, job=True),
    "cancel": Method(P.Cancel, cancel), "status": Method(P.Empty, status), "shutdown": Method(P.Empty, shutdown),
    "debug/lookup": Method(P.Lookup, lookup),
    "next_edit": Method(P.NextEdit, prepare_next_edit, job=True),
}
