"""`serve --http 127.0.0.1:PORT`: llama.cpp server's `POST /infill` and `GET /health`, OpenAI's
`POST /v1/completions` (with `suffix`) and `GET /v1/models`, on the daemon's own event loop.

An HTTP request is turned into the daemon's own wire methods (`document/open|change`, `complete`)
on one synthetic session, dispatched exactly as an editor's frames are: the warm cache, prompt
lookup, typed-through memory, the scheduler's turns and latest-wins cancellation are the editors'.
HTTP clients send no document identity (llama.vim's `/infill` carries a window of lines around the
cursor, OpenAI's a prefix and a suffix), so a request is placed in the synthetic document the
client names (X-Completiond-File), or whose lines its window aligns with (a cursor jump), or whose
text it continues (http_docs.py); a new one is opened otherwise, the least recently used closed
beyond MAX_DOCS. A client that hangs up (llama.vim kills its curl for the next keystroke) has its
completion cancelled; one client's request never supersedes another's (no latest-wins by document).
`input_extra` chunks are one context buffer: prompt lookup reads it, the warm-up never takes it.

Loopback only; every path but /health needs `Authorization: Bearer <token>` (the --token-file
token, as for --tcp), checked on the request's head before any of its body is read; idle
connections that never sent the token make room for those that do (HttpServer; limits in
docs/hostile-peers.md). llama.cpp's own behaviour is kept where clients see it: `stop`, `n_indent`
and `t_max_predict_ms` (stop once a line is done and the time is up), `response_fields` (flat
"a/b" keys), `n_cmpl` / `n` alternatives, SSE streams (`data: {...}`; OpenAI's end `data: [DONE]`).
Sampling: a request without `temperature` is greedy (the daemon's lossless default), not
llama.cpp's 0.8 or OpenAI's 1.0; with one, `top_p` and `top_k` apply as well.

Roles: this file (the bridge onto the daemon's methods, the endpoints), http_api.py (requests
checked, answers shaped), http_io.py (HTTP/1.1 framing; no HTTP library).
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import protocol as P
from .http_api import (Ask, Done, _held, _stop_type, _usage, client_cut, finish_reason, infill_ask, infill_json,
                       json_body, openai_ask, pick_fields, position)
from .http_docs import URI, DocumentMap
from .http_io import (HEAD_S, IDLE_S, MAX_HEADER_BYTES, Budget, Conn, HttpError, HttpRequest, _dumps, _linger,
                      has_body, read_body, read_head)
from .session import Session
from .transport import WAITING_GRACE_S, StartError, parse_loopback  # noqa: F401 (StartError: what parse_http raises)

if TYPE_CHECKING:
    from .daemon import Daemon

log = logging.getLogger("completiond.http")

MAX_CONNECTIONS = 64  # beyond this, idle connections that never sent the token are dropped
MAX_YOUNG = 192  # connections younger than WAITING_GRACE_S allowed beyond that; then a newcomer gets 503
POLL_S = 0.05  # how often a waiting request checks that its client is still there


def parse_http(spec: str) -> tuple[str, int]:
    return parse_loopback(spec, "--http")


# ---- the bridge: HTTP requests as the daemon's own frames ----------------------------------------
class _Sink:
    """The synthetic session's writer: frames the daemon sends are decoded and routed at once."""

    def __init__(self, route: Callable[[Any], None]):
        self.unpacker = P.unpacker()
        self.route = route

    def write(self, data: bytes) -> None:
        self.unpacker.feed(data)
        for obj in self.unpacker:
            self.route(obj)

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        return None

    def is_closing(self) -> bool:
        return False


class DaemonFailed(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code, self.message = code, message


@dataclass
class Pending:
    msgid: int
    fut: asyncio.Future
    text: list[str] = field(default_factory=list)  # partial increments as they arrive
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    first_at: float | None = None  # when the first text arrived (t_max_predict_ms counts from it)


class Bridge:
    """One synthetic session for every HTTP client; its documents are matched by text (module doc)."""

    def __init__(self, daemon: Daemon):
        self.d = daemon
        self._ids = itertools.count(1)
        self._pending: dict[int, Pending] = {}
        self.docs = DocumentMap()  # the synthetic documents' texts (http_docs.py)
        self.extra: str | None = None  # the input_extra chunks' text (an open buffer for prompt lookup)
        self.lock = asyncio.Lock()  # a request's documents and its complete are dispatched together
        self._session: Session | None = None

    @property
    def session(self) -> Session:
        s = self._session
        if s is None or s.closed:  # first use, or the daemon dropped it (stopping)
            self.d._next_session += 1
            s = Session(self.d._next_session, _Sink(self._route), authed=True, tcp=True, encoding="utf-32",
                        name="http", supersede=False)  # each HTTP client cancels its own (by hanging up)
            self.d.sessions[s.id] = s
            self._session = s
            self.docs.clear()
            self.extra = None
        return s

    def _route(self, obj: Any) -> None:
        if not isinstance(obj, list):
            return
        if obj[0] == P.RESPONSE and len(obj) == 4:
            p = self._pending.get(obj[1])
            if p is not None and not p.fut.done():
                p.fut.set_result((obj[2], obj[3]))
                p.arrived.set()  # a waiting request wakes now, not at its next poll
        elif obj[0] == P.NOTIFICATION and len(obj) == 3 and isinstance(obj[2], dict):
            p = self._pending.get(obj[2].get("id"))
            if p is not None and isinstance(obj[2].get("text"), str):
                if p.first_at is None:
                    p.first_at = time.monotonic()
                p.text.append(obj[2]["text"])
                p.arrived.set()

    async def start(self, method: str, params: dict) -> Pending:
        """Dispatch one request frame on the session; its answer arrives on the returned Pending."""
        msgid = next(self._ids) % 2**32
        p = Pending(msgid, asyncio.get_running_loop().create_future())
        self._pending[msgid] = p
        try:
            await self.d.dispatch(self.session, [P.REQUEST, msgid, method, params])
        except BaseException:
            self._pending.pop(msgid, None)
            raise
        return p

    async def result(self, p: Pending) -> Any:
        try:
            err, res = await p.fut
        finally:
            self._pending.pop(p.msgid, None)
        if err is not None:
            raise DaemonFailed(err.get("code", P.INTERNAL_ERROR), err.get("message", "error"))
        return res

    async def call(self, method: str, params: dict) -> Any:
        return await self.result(await self.start(method, params))

    def cancel(self, p: Pending) -> None:
        """What the `cancel` method does: the engine stops between passes and answers what it has."""
        job = self.session.jobs.get(p.msgid)
        if job is not None:
            job.cancel.set()

    # ---- documents ----
    async def document(self, ask: Ask) -> str:
        """Open or update the synthetic document `ask` belongs to (http_docs.py); its uri. `ask`'s text
        and cursor become the document's (a window spliced into the file seen so far)."""
        if len(ask.text) > P.MAX_DOCUMENT_CHARS:
            raise HttpError(413, f"the document (input_prefix + prompt + input_suffix, or prompt + suffix) has "
                                 f"{len(ask.text)} characters; the limit is {P.MAX_DOCUMENT_CHARS}")
        placed = self.docs.place(ask.text, ask.cursor, ask.file)
        uri = placed.uri
        if uri is None:
            for old in self.docs.evict():
                await self._quiet("document/close", {"uri": old})
            uri = self.docs.new_uri(ask.file)
            await self.call("document/open", {"uri": uri, "text": placed.text, "version": 1})
        elif self.docs.texts[uri].text != placed.text:  # one whole-text change: the daemon diffs prompts by tokens
            await self.call("document/change", {"uri": uri, "changes": [{"text": placed.text}]})
        self.docs.record(uri, placed.text, ask.file)
        ask.text, ask.cursor = placed.text, placed.cursor
        return uri

    async def set_extra(self, chunks: list[dict]) -> None:
        """input_extra chunks: one open buffer, so prompt lookup (and --repo-context) sees them."""
        text = "\n".join(f"{c['text']}" for c in chunks)
        if len(text) > P.MAX_DOCUMENT_CHARS:
            raise HttpError(413, f"input_extra has {len(text)} characters in all; the limit is "
                                 f"{P.MAX_DOCUMENT_CHARS}")
        if text == self.extra:
            return
        uri = f"{URI}extra"
        if self.extra is None:
            self.d.warmer.context_only(self.session, uri)  # read by prompt lookup, never warmed
            await self.call("document/open", {"uri": uri, "text": text, "version": 1})
        else:
            await self.call("document/change", {"uri": uri, "changes": [{"text": text}]})
        self.extra = text
        log.info("input_extra: %d chunks, %d characters (%s)", len(chunks), len(text),
                 ", ".join(sorted({c["filename"] for c in chunks}))[:200])

    async def _quiet(self, method: str, params: dict) -> None:
        try:
            await self.call(method, params)
        except DaemonFailed as e:
            log.info("%s %s: %s", method, params.get("uri"), e.message)


# ---- the server ----------------------------------------------------------------------------------
class HttpServer:
    """Connections: at most MAX_CONNECTIONS; beyond that the oldest idle ones that never sent the
    token are dropped (never the newcomer, never a client that sent the token), so idle peers
    cannot lock the token holder out. A request's path, method and token are checked before its
    body is read (http_io)."""

    def __init__(self, daemon: Daemon, token: str):
        self.d = daemon
        self.token = token
        self.bridge = Bridge(daemon)
        self.conns: dict[int, Conn] = {}  # by id(conn), oldest first
        self.budget = Budget()
        self.served = 0
        self.dropped = 0
        self._trim_timer: asyncio.TimerHandle | None = None

    @property
    def connections(self) -> int:
        return len(self.conns)

    async def start(self, host: str, port: int) -> asyncio.AbstractServer:
        srv = await asyncio.start_server(self.connection, host=host, port=port, limit=MAX_HEADER_BYTES)
        log.info("http on %s:%d", host, port)
        return srv

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Conn(reader, writer, asyncio.get_running_loop().time())
        self.conns[id(conn)] = conn
        try:
            if len(self.conns) > MAX_CONNECTIONS:
                self._trim()
            if len(self.conns) > MAX_CONNECTIONS + MAX_YOUNG:  # a flood younger than the grace: the newcomer
                await conn.send(503, HttpError(503, "too many HTTP connections").body(), keep=False)
                return
            while not conn.gone:
                conn.idle = True
                try:
                    req = await read_head(reader, IDLE_S if conn.authed else HEAD_S)
                except HttpError as e:
                    await self._refuse(conn, e, None)
                    return
                if req is None:  # closed, idle too long, or dropped
                    return
                conn.idle = False
                keep = req.version == "HTTP/1.1" and req.headers.get("connection", "").lower() != "close"
                try:
                    await self.handle(req, conn, keep)
                except HttpError as e:
                    keep = keep and not e.close and not (has_body(req) and conn.held == 0 and not req.body)
                    if not keep:
                        await self._refuse(conn, e, req)
                        return
                    await conn.send(e.status, e.body(), keep)
                except Exception as e:  # a bug costs this request, not the daemon
                    log.exception("http %s %s failed", req.method, req.path[:200])
                    await conn.send(500, HttpError(500, f"{type(e).__name__}: {e}").body(), keep=False)
                    return
                finally:
                    self.budget.give(conn.held)
                    conn.held = 0
                    req.body = b""
                if not keep:
                    return
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            self.conns.pop(id(conn), None)
            try:
                writer.close()
            except (ConnectionError, OSError, RuntimeError):
                pass

    async def _refuse(self, conn: Conn, e: HttpError, req: HttpRequest | None) -> None:
        """Answer an error and close: what the client sent and we did not read is let drain a moment
        (LINGER_BYTES at most), so that the answer reaches it before the close."""
        if e.status >= 500:
            log.info("http %s: %d %s", req.path[:200] if req else "request", e.status, e.message)
        await conn.send(e.status, e.body(), keep=False)
        await _linger(conn.reader, conn.writer)

    def _trim(self, timer: bool = False) -> None:
        """Over MAX_CONNECTIONS: drop the oldest idle connections that never sent the token, once they
        are WAITING_GRACE_S old (a newcomer's first request may be on its way); the young ones later."""
        if timer:
            self._trim_timer = None
        excess = len(self.conns) - MAX_CONNECTIONS
        if excess <= 0:
            return
        now = asyncio.get_running_loop().time()
        idle = [c for c in self.conns.values() if c.idle and not c.authed and not c.gone]
        old = [c for c in idle if now - c.arrived >= WAITING_GRACE_S][:excess]
        for c in old:
            c.drop()
            self.dropped += 1
        if len(old) < min(excess, len(idle)) and self._trim_timer is None:
            self._trim_timer = asyncio.get_running_loop().call_later(WAITING_GRACE_S, self._trim, True)

    async def handle(self, req: HttpRequest, conn: Conn, keep: bool) -> None:
        path = req.path.split("?", 1)[0].rstrip("/") or "/"
        routes = {"/health": ("GET", self.health), "/v1/health": ("GET", self.health),
                  "/infill": ("POST", self.infill), "/v1/completions": ("POST", self.completions),
                  "/completions": ("POST", self.completions), "/v1/models": ("GET", self.models),
                  "/models": ("GET", self.models)}
        if path not in routes:
            raise HttpError(404, f"no endpoint {path[:200]} (this server has /infill, /v1/completions, /health, "
                                 f"/v1/models)")
        method, fn = routes[path]
        if req.method != method:
            raise HttpError(405, f"{path} takes {method}, not {req.method[:20]}")
        if fn != self.health:
            self.authorize(req)
            conn.authed = True
        elif has_body(req):  # /health needs no token, so it reads no body either
            raise HttpError(400, f"{path} takes no body", close=True)
        conn.held = await read_body(conn.reader, conn.writer, req, self.budget)
        try:
            await fn(req, conn, keep)
        except DaemonFailed as e:  # the daemon refused the documents (sizes): the client's error
            raise HttpError(400 if e.code in (P.INVALID_PARAMS, P.INVALID_REQUEST) else 500, e.message) from None

    def authorize(self, req: HttpRequest) -> None:
        auth = req.headers.get("authorization", "")
        scheme, _, given = auth.partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise HttpError(401, "missing 'Authorization: Bearer <token>' (the daemon's --token-file)")
        if not hmac.compare_digest(given.strip().encode(), self.token.encode()):
            raise HttpError(401, "invalid token")

    def _ready(self) -> None:
        if self.d.error:
            raise HttpError(500, f"models failed to load: {self.d.error}")
        if not self.d.ready.is_set():
            raise HttpError(503, "Loading model")

    async def health(self, req: HttpRequest, conn: Conn, keep: bool) -> None:
        if self.d.error:
            await conn.send(500, HttpError(500, f"models failed to load: {self.d.error}").body(), keep)
        elif not self.d.ready.is_set():
            await conn.send(503, HttpError(503, "Loading model").body(), keep)
        else:
            await conn.send(200, {"status": "ok"}, keep)

    async def models(self, req: HttpRequest, conn: Conn, keep: bool) -> None:
        await conn.send(200, {"object": "list", "data": [{"id": self.d.info.get("target"), "object": "model",
                                                          "created": int(self.d.started), "owned_by": "completiond"}]},
                        keep)

    # ---- /infill ----
    async def infill(self, req: HttpRequest, conn: Conn, keep: bool) -> None:
        body = json_body(req)
        ask, chunks = infill_ask(body, req.headers)
        self._ready()
        fields = body.get("response_fields") or []
        return_tokens = bool(body.get("return_tokens"))
        if chunks or self.bridge.extra:
            async with self.bridge.lock:
                await self.bridge.set_extra(chunks)
        if ask.max_tokens == 0 or not ask.text:  # a context update: answer at once, warm meanwhile
            if ask.text:
                async with self.bridge.lock:
                    uri = await self.bridge.document(ask)
                await self.bridge.call("document/cursor", {"uri": uri, "position": position(ask.text, ask.cursor)})
            empty = Done("", {}, "limit")
            out = infill_json(self.d, ask, empty, 0, False, False)
            await conn.send(200, pick_fields(out, fields) if fields else out, keep)
            return
        if ask.stream:
            await conn.start_stream(req.version == "HTTP/1.0")

            def partial(text: str) -> dict:
                return {"index": 0, "content": text, "tokens": [], "stop": False, "id_slot": 0,
                        "tokens_predicted": 0, "tokens_evaluated": 0}

            try:
                done = await self.run(ask, conn, 0, lambda t: conn.event(_dumps(partial(t))))
            except HttpError as e:  # the headers are out: the error goes as an event
                done = None
                await conn.event(_dumps(e.body()))
            if done is not None:
                out = infill_json(self.d, ask, done, 0, True, False)
                await conn.event(_dumps(pick_fields(out, fields) if fields else out))
            await conn.end_stream()
            return
        outs = []
        for i, done in enumerate(await self.alternatives(ask, conn)):
            out = infill_json(self.d, ask, done, i, False, return_tokens)
            outs.append(pick_fields(out, fields) if fields else out)
        if not conn.gone and not conn.closed_by_peer():
            await conn.send(200, outs[0] if ask.n == 1 else outs, keep)

    # ---- /v1/completions ----
    async def completions(self, req: HttpRequest, conn: Conn, keep: bool) -> None:
        body = json_body(req)
        ask, echo = openai_ask(body, req.headers)
        self._ready()
        cid, created, model = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time()), self.d.info.get("target")
        prompt = ask.text[:ask.cursor]

        def chunk(text: str, finish: str | None, usage: dict | None = None) -> str:
            out = {"id": cid, "object": "text_completion", "created": created, "model": model,
                   "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]}
            if usage is not None:
                out["usage"] = usage
            return _dumps(out)

        if ask.stream:
            await conn.start_stream(req.version == "HTTP/1.0")
            if echo:
                await conn.event(chunk(prompt, None))
            try:
                done = await self.run(ask, conn, 0, lambda t: conn.event(chunk(t, None)))
            except HttpError as e:  # the headers are out: the error goes as an event
                done = None
                await conn.event(_dumps(e.body()))
            if done is not None:
                usage = _usage(done)
                include = isinstance(body.get("stream_options"), dict) and body["stream_options"].get("include_usage")
                await conn.event(chunk("", finish_reason(done), usage if include else None))
            await conn.event("[DONE]")
            await conn.end_stream()
            return
        dones = await self.alternatives(ask, conn)
        if conn.closed_by_peer():
            return
        usage = {"prompt_tokens": dones[0].res.get("prompt_tokens", 0),
                 "completion_tokens": sum(d.predicted for d in dones)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        await conn.send(200, {"id": cid, "object": "text_completion", "created": created, "model": model,
                              "choices": [{"text": (prompt if echo else "") + d.text, "index": i, "logprobs": None,
                                           "finish_reason": finish_reason(d)} for i, d in enumerate(dones)],
                              "usage": usage}, keep)

    # ---- running completions ----
    async def alternatives(self, ask: Ask, conn: Conn) -> list[Done]:
        """n completions. Greedy: one `complete` with the daemon's distinct alternatives (up to 3,
        the greedy one first), the greedy one repeated to fill n; sampled: n runs one after another
        (each supersedes nothing: the previous has finished)."""
        dones: list[Done] = []
        for i in range(1 if ask.greedy else ask.n):
            done = await self.run(ask, conn, i, None)
            if done is None:
                return [Done("", {}, "none")] * ask.n
            dones.append(done)
        if not ask.greedy:
            return dones
        dones += greedy_alternatives(ask, dones[0])[:ask.n - 1]
        return dones + [dones[0]] * (ask.n - len(dones))

    async def run(self, ask: Ask, conn: Conn, i: int, emit: Callable[[str], Any] | None) -> Done | None:
        """One `complete` through the bridge: streams increments through `emit` (text the client's
        stops allow), cancels when the client hangs up or a client-side stop fires; None if the client left."""
        async with self.bridge.lock:  # the document's text and the completion's snapshot of it, together
            uri = await self.bridge.document(ask)
            p = await self.bridge.start("complete", ask.params(uri, i))
        sent, cancelled_by = 0, ""
        while not p.fut.done():
            try:
                await asyncio.wait_for(p.arrived.wait(), POLL_S)
            except asyncio.TimeoutError:
                pass
            p.arrived.clear()
            if conn.closed_by_peer():
                self.bridge.cancel(p)
                cancelled_by = "client"
                continue
            text = "".join(p.text)
            cut = client_cut(ask, text)[0]
            if cut is not None and not cancelled_by:
                self.bridge.cancel(p)
                cancelled_by = "stop"
            elif (ask.t_max_predict_ms and not cancelled_by and "\n" in text and p.first_at is not None
                  and (time.monotonic() - p.first_at) * 1e3 > ask.t_max_predict_ms):
                self.bridge.cancel(p)  # llama.cpp: time is up once a line is done
                cancelled_by = "time"
            if emit is not None:
                upto = cut if cut is not None else len(text) - _held(ask, text)
                if upto > sent:
                    await emit(text[sent:upto])
                    sent = upto
        try:
            res = await self.bridge.result(p)
        except DaemonFailed as e:
            raise HttpError(400 if e.code in (P.INVALID_PARAMS, P.INVALID_REQUEST) else 500, e.message) from None
        if cancelled_by == "client":
            return None
        self.served += 1
        res = {**res, "document": uri}
        text = res.get("text", "")
        cut, stop_type, word = client_cut(ask, text)
        if cut is not None:
            text = text[:cut]
        elif cancelled_by == "time":
            stop_type = "limit"
        else:
            stop_type = _stop_type(res)
        if emit is not None and len(text) > sent:
            await emit(text[sent:])
        return Done(text, res, stop_type, word)


async def start_http(daemon: Daemon, host: str, port: int, token: str) -> HttpServer:
    """Listen for HTTP on the daemon's loop; the daemon closes the listener when it stops."""
    server = HttpServer(daemon, token)
    daemon.servers.append(await server.start(host, port))
    return server


def greedy_alternatives(ask: Ask, main: Done) -> list[Done]:
    """The daemon's alternatives to `main` with the client's stops applied, each still distinct
    (a stop string can cut two texts to the same one) and not empty."""
    seen, out = {main.text}, []
    for a in main.res.get("alternatives") or []:
        text = a.get("text", "")
        res = {**main.res, "text": text, "token_ids": a.get("token_ids", []), "stopped_by": a.get("stopped_by", "")}
        cut, stop_type, word = client_cut(ask, text)
        if cut is not None:
            text = text[:cut]
        else:
            stop_type = _stop_type(res)
        if text and text not in seen:
            seen.add(text)
            out.append(Done(text, res, stop_type, word))
    return out
