"""`serve --http 127.0.0.1:PORT`: llama.cpp server's `POST /infill` and `GET /health`, OpenAI's
`POST /v1/completions` (with `suffix`) and `GET /v1/models`, on the daemon's own event loop.

An HTTP request is turned into the daemon's own wire methods (`document/open|change`, `complete`)
on one synthetic session, dispatched exactly as an editor's frames are: the warm cache, prompt
lookup, typed-through memory, the scheduler's turns and latest-wins cancellation are the editors'.
HTTP clients send no document identity (llama.vim's `/infill` carries a window of lines around the
cursor, OpenAI's a prefix and a suffix), so a request is matched to the synthetic document whose
text shares the longest prefix or suffix with its own (a user typing on, or moving a line); a new
one is opened otherwise, the least recently used closed beyond MAX_DOCS. A client that hangs up
(llama.vim kills its curl for the next keystroke) has its completion cancelled.

Loopback only; every path but /health needs `Authorization: Bearer <token>` (the --token-file
token, as for --tcp). llama.cpp's own behaviour is kept where clients see it: `stop`, `n_indent`
and `t_max_predict_ms` (stop once a line is done and the time is up), `response_fields` (flat
"a/b" keys), `n_cmpl` / `n` alternatives, SSE streams (`data: {...}`; OpenAI's end `data: [DONE]`).
Sampling: a request without `temperature` is greedy (the daemon's lossless default), not
llama.cpp's 0.8 or OpenAI's 1.0; with one, `top_p` and `top_k` apply as well. No HTTP library:
HTTP/1.1 with Content-Length or chunked bodies, keep-alive, bounded header and body sizes.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import itertools
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import protocol as P
from .session import Session

if TYPE_CHECKING:
    from .daemon import Daemon

log = logging.getLogger("completiond.http")

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = P.MAX_FRAME_BYTES
MAX_CONNECTIONS = 64
IDLE_S = 30.0  # a keep-alive connection with no next request is closed after this
READ_S = 30.0  # a request's headers and body must arrive within this
MAX_DOCS = 16  # synthetic documents kept open (least recently used closed first)
MIN_MATCH_CHARS = 64  # shared prefix or suffix that makes a request "the same document"
MAX_ALTERNATIVES = 8  # n_cmpl / n
DEFAULT_N_PREDICT = 128  # /infill without n_predict (or -1): llama.vim's default
OPENAI_DEFAULT_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions
URI = "completiond-http:/"
POLL_S = 0.05  # how often a waiting request checks that its client is still there

REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 411: "Length Required", 413: "Payload Too Large",
           431: "Request Header Fields Too Large", 500: "Internal Server Error", 501: "Not Implemented",
           503: "Service Unavailable", 505: "HTTP Version Not Supported"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 503: "unavailable_error"}


class HttpError(Exception):
    def __init__(self, status: int, message: str, close: bool = False):
        super().__init__(message)
        self.status, self.message, self.close = status, message, close

    def body(self) -> dict:
        # llama.cpp's shape ({code, message, type}); the openai client reads message and type from it
        return {"error": {"code": self.status, "message": self.message,
                          "type": ERROR_TYPES.get(self.status, "server_error")}}


class StartError(Exception):
    pass


def parse_http(spec: str) -> tuple[str, int]:
    """`--http HOST:PORT` with a loopback IP (the daemon serves one user's editors, not a network)."""
    host, _, port = spec.rpartition(":")
    host = host.strip("[]")
    try:
        ip = ipaddress.ip_address(host)
        port_n = int(port)
    except ValueError:
        raise StartError(f"--http wants HOST:PORT with a loopback IP, got {spec!r}") from None
    if not ip.is_loopback:
        raise StartError(f"--http {host}: only loopback addresses (127.0.0.0/8, ::1) are allowed")
    if not 0 < port_n < 65536:
        raise StartError(f"--http port {port_n} out of range")
    return host, port_n


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
        self._doc_ids = itertools.count(1)
        self._pending: dict[int, Pending] = {}
        self.texts: OrderedDict[str, str] = OrderedDict()  # uri -> the text last sent
        self.extra: str | None = None  # the input_extra chunks' text (an open buffer for prompt lookup)
        self.lock = asyncio.Lock()  # a request's documents and its complete are dispatched together
        self._session: Session | None = None

    @property
    def session(self) -> Session:
        s = self._session
        if s is None or s.closed:  # first use, or the daemon dropped it (stopping)
            self.d._next_session += 1
            s = Session(self.d._next_session, _Sink(self._route), authed=True, tcp=True, encoding="utf-32",
                        name="http")
            self.d.sessions[s.id] = s
            self._session = s
            self.texts.clear()
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
    def match(self, text: str) -> str | None:
        """The open synthetic document this text continues: the longest shared prefix or suffix."""
        need = min(MIN_MATCH_CHARS, len(text) // 2 + 1)
        best, best_n = None, 0
        for uri, old in self.texts.items():
            n = max(_common_prefix(old, text), _common_suffix(old, text))
            if n >= need and n >= best_n:
                best, best_n = uri, n
        return best

    async def document(self, text: str) -> str:
        """Open or update the synthetic document for `text`; its uri."""
        uri = self.match(text)
        if uri is None:
            while len(self.texts) >= MAX_DOCS:
                old, _ = self.texts.popitem(last=False)
                await self._quiet("document/close", {"uri": old})
            uri = f"{URI}doc-{next(self._doc_ids)}"
            await self.call("document/open", {"uri": uri, "text": text, "version": 1})
        elif self.texts[uri] != text:  # one whole-text change: the daemon diffs prompts by tokens
            await self.call("document/change", {"uri": uri, "changes": [{"text": text}]})
        self.texts[uri] = text
        self.texts.move_to_end(uri)
        return uri

    async def set_extra(self, chunks: list[dict]) -> None:
        """input_extra chunks: one open buffer, so prompt lookup (and --repo-context) sees them."""
        text = "\n".join(f"{c['text']}" for c in chunks)
        if text == self.extra:
            return
        uri = f"{URI}extra"
        if self.extra is None:
            await self.call("document/open", {"uri": uri, "text": text, "version": 1})
        else:
            await self.call("document/change", {"uri": uri, "changes": [{"text": text}]})
        self.extra = text

    async def _quiet(self, method: str, params: dict) -> None:
        try:
            await self.call(method, params)
        except DaemonFailed as e:
            log.info("%s %s: %s", method, params.get("uri"), e.message)


def _common_prefix(a: str, b: str) -> int:
    """Length of the shared prefix, by bisection over C-speed slice compares (not a Python loop)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_suffix(a: str, b: str) -> int:
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid:] == b[len(b) - mid:]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def position(text: str, offset: int) -> dict:
    """The LSP position of `offset` in code points (the session speaks utf-32); line breaks as the
    daemon's documents count them (\\r\\n, \\r, \\n)."""
    from ..core.prompt import line_index

    starts = line_index(text[:offset])
    return {"line": len(starts) - 1, "character": offset - int(starts[-1])}


# ---- requests: what a client asked for, checked ------------------------------------------------
def _field(body: dict, key: str, types: type | tuple, default: Any = None, check: Callable[[Any], bool] | None = None,
           what: str = "") -> Any:
    v = body.get(key, default)
    if v is None:
        return default
    types_t = types if isinstance(types, tuple) else (types,)
    if isinstance(v, bool) and bool not in types_t or not isinstance(v, types_t):
        raise HttpError(400, f"'{key}' must be {what or ' or '.join(t.__name__ for t in types_t)}")
    if check is not None and not check(v):
        raise HttpError(400, f"'{key}' out of range: {v!r}" + (f" ({what})" if what else ""))
    return v


def _stops(body: dict, key: str = "stop") -> list[str]:
    v = body.get(key)
    if v is None:
        return []
    if isinstance(v, str):
        return [v] if v else []
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise HttpError(400, f"'{key}' must be a string or a list of strings")
    return [s for s in v if s]


@dataclass
class Ask:
    """One completion as HTTP asked for it, in the daemon's terms plus llama.cpp's client-side stops."""
    text: str
    cursor: int
    max_tokens: int
    temperature: float | None
    top_p: float
    top_k: int
    seed: int | None
    stop: list[str]
    n_indent: int = 0
    t_max_predict_ms: float = 0.0
    n: int = 1
    stream: bool = False

    def params(self, uri: str, i: int = 0) -> dict:
        p = {"uri": uri, "position": position(self.text, self.cursor), "max_tokens": self.max_tokens,
             "multiline": True}
        if self.temperature is not None and self.temperature >= P.MIN_TEMPERATURE:
            p.update(temperature=min(self.temperature, P.MAX_TEMPERATURE), top_p=self.top_p, top_k=self.top_k)
            if self.seed is not None or self.n > 1:
                p["seed"] = (self.seed or 0) + i  # alternatives differ; one seed repeats itself
        return p

    @property
    def greedy(self) -> bool:
        return self.temperature is None or self.temperature < P.MIN_TEMPERATURE


def infill_ask(body: dict) -> tuple[Ask, list[dict]]:
    """llama.cpp /infill: the document is input_prefix + prompt + input_suffix, the cursor after prompt
    (llama.cpp puts `prompt` after <|fim_middle|>: llama.vim and llama.vscode send the current line's
    text before the cursor there)."""
    prefix = _field(body, "input_prefix", str, "")
    suffix = _field(body, "input_suffix", str, "")
    prompt = _field(body, "prompt", str, "", what="a string (token arrays are not supported)")
    extra = _field(body, "input_extra", list, [])
    chunks = []
    for i, c in enumerate(extra):  # llama.cpp refuses the same shapes (tools/server tests)
        if not isinstance(c, dict) or not isinstance(c.get("text"), str) \
                or not isinstance(c.get("filename", ""), str):
            raise HttpError(400, f"input_extra[{i}] must be an object {{\"filename\": string, \"text\": string}}")
        chunks.append({"filename": c.get("filename", "tmp"), "text": c["text"]})
    n_predict = _field(body, "n_predict", int, -1, lambda v: v >= -1, ">= -1")
    ask = Ask(text=prefix + prompt + suffix, cursor=len(prefix) + len(prompt),
              max_tokens=min(P.MAX_TOKENS, DEFAULT_N_PREDICT if n_predict == -1 else max(n_predict, 1)),
              temperature=_field(body, "temperature", (int, float), None, lambda v: v >= 0, ">= 0"),
              top_p=_field(body, "top_p", (int, float), 1.0, lambda v: 0 < v <= 1, "0 < top_p <= 1"),
              top_k=_field(body, "top_k", int, 0, lambda v: v >= 0, ">= 0"),
              seed=_seed(body), stop=_stops(body),
              n_indent=_field(body, "n_indent", int, 0, lambda v: v >= 0, ">= 0"),
              t_max_predict_ms=_field(body, "t_max_predict_ms", (int, float), 0.0, lambda v: v >= 0, ">= 0"),
              n=_field(body, "n_cmpl", int, 1, lambda v: 1 <= v <= MAX_ALTERNATIVES, f"1..{MAX_ALTERNATIVES}"),
              stream=_field(body, "stream", bool, False))
    for key, typ in (("cache_prompt", bool), ("samplers", list), ("id_slot", int), ("response_fields", list),
                     ("t_max_prompt_ms", (int, float)), ("return_tokens", bool)):
        _field(body, key, typ)  # accepted (llama.vim, llama.vscode send them); type-checked like llama.cpp
    if n_predict == 0:
        ask.max_tokens = 0  # a context update (llama.vim's ring buffer): nothing to generate
    return ask, chunks


def _seed(body: dict) -> int | None:
    s = _field(body, "seed", int, None)
    return None if s is None or s < 0 else s % 2**32


def openai_ask(body: dict) -> tuple[Ask, bool]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise HttpError(400, "'prompt' must be a string (or a list of one string)")
    suffix = _field(body, "suffix", str, "")
    if body.get("logprobs") not in (None, 0):
        raise HttpError(400, "'logprobs' is not supported")
    if body.get("best_of") not in (None, 1):
        raise HttpError(400, "'best_of' is not supported")
    stop = _stops(body)
    ask = Ask(text=prompt + suffix, cursor=len(prompt),
              max_tokens=_field(body, "max_tokens", int, OPENAI_DEFAULT_MAX_TOKENS,
                                lambda v: 1 <= v <= P.MAX_TOKENS, f"1..{P.MAX_TOKENS}"),
              temperature=_field(body, "temperature", (int, float), None, lambda v: 0 <= v <= 2, "0..2"),
              top_p=_field(body, "top_p", (int, float), 1.0, lambda v: 0 < v <= 1, "0 < top_p <= 1"),
              top_k=0, seed=_seed(body), stop=stop,
              n=_field(body, "n", int, 1, lambda v: 1 <= v <= MAX_ALTERNATIVES, f"1..{MAX_ALTERNATIVES}"),
              stream=_field(body, "stream", bool, False))
    if ask.stream and ask.n > 1:
        raise HttpError(400, "'stream' with 'n' > 1 is not supported")
    _field(body, "stream_options", dict)
    return ask, _field(body, "echo", bool, False)


def client_cut(ask: Ask, text: str) -> tuple[int | None, str, str]:
    """Where llama.cpp's request-side rules end the text: (cut or None, stop_type, stopping word).
    A stop string ends before itself; `n_indent` ends a line that starts less indented than it,
    after its indentation, as llama.cpp cuts it."""
    best: tuple[int | None, str, str] = (None, "", "")
    for s in ask.stop:
        i = text.find(s)
        if i >= 0 and (best[0] is None or i < best[0]):
            best = (i, "word", s)
    if ask.n_indent > 0:
        start = text.find("\n")
        while start >= 0:
            pos = start + 1
            while pos < len(text) and text[pos] in " \t":
                pos += 1
            if pos < len(text) and text[pos] != "\n" and pos - start - 1 < ask.n_indent:
                if best[0] is None or pos < best[0]:
                    best = (pos, "limit", "")
                break
            start = text.find("\n", start + 1)
    return best


def _held(ask: Ask, text: str) -> int:
    """How much of the end of `text` could still become a stop string: held back from a stream."""
    hold = 0
    for s in ask.stop:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                hold = max(hold, k)
                break
    return hold


# ---- answers -----------------------------------------------------------------------------------
@dataclass
class Done:
    """A finished completion with the client's rules applied."""
    text: str
    res: dict
    stop_type: str
    stopping_word: str = ""

    @property
    def predicted(self) -> int:
        return len(self.res.get("token_ids") or [])


def _stop_type(res: dict) -> str:
    return {"eos": "eos", "stop_rule": "eos", "max_tokens": "limit", "deadline": "limit"}.get(
        res.get("stopped_by", ""), "none")


def timings(res: dict, predicted: int) -> dict:
    """llama.cpp's `timings` from the daemon's result (prompt: until the first token)."""
    prompt_n = max(0, res.get("prompt_tokens", 0) - res.get("reused_tokens", 0))
    prompt_ms = res.get("ms_first_token", 0.0)
    pred_ms = max(0.0, res.get("ms_total", 0.0) - prompt_ms)
    return {"cache_n": res.get("reused_tokens", 0), "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": 1e3 * prompt_n / prompt_ms if prompt_ms else 0.0,
            "predicted_n": predicted, "predicted_ms": pred_ms,
            "predicted_per_token_ms": pred_ms / predicted if predicted else 0.0,
            "predicted_per_second": 1e3 * predicted / pred_ms if pred_ms else 0.0}


def infill_json(d: Daemon, ask: Ask, done: Done, index: int, stream: bool, return_tokens: bool) -> dict:
    res = done.res
    out = {"index": index, "content": "" if stream else done.text,
           "tokens": res.get("token_ids", []) if return_tokens and not stream else [],
           "id_slot": 0, "stop": True, "model": d.info.get("target"), "tokens_predicted": done.predicted,
           "tokens_evaluated": res.get("prompt_tokens", 0),
           "generation_settings": {"n_predict": ask.max_tokens, "temperature": ask.temperature or 0.0,
                                   "top_k": ask.top_k, "top_p": ask.top_p, "stop": ask.stop, "n_indent": ask.n_indent,
                                   "t_max_predict_ms": ask.t_max_predict_ms},
           "has_new_line": "\n" in done.text, "truncated": False, "stop_type": done.stop_type,
           "stopping_word": done.stopping_word,
           "tokens_cached": res.get("prompt_tokens", 0) + done.predicted,
           "timings": timings(res, done.predicted),
           # ours, beside llama.cpp's: how the daemon got there
           "completiond": {k: res.get(k) for k in ("mode", "target_passes", "mean_accepted", "reused_tokens",
                                                   "served_tokens", "prompt_lane", "stopped_by", "cancelled", "document")}}
    return out


def pick_fields(out: dict, fields: list) -> dict:
    """llama.cpp's response_fields: each "a/b" path present in the answer, under that flat key."""
    picked = {}
    for path in fields:
        if not isinstance(path, str):
            continue
        cur: Any = out
        for k in path.split("/"):
            if isinstance(cur, dict) and k in cur:
                cur = cur[k]
            else:
                break
        else:
            picked[path] = cur
    return picked


def finish_reason(done: Done) -> str:
    return "length" if done.stop_type == "limit" and done.res.get("stopped_by") == "max_tokens" else "stop"


# ---- the server ----------------------------------------------------------------------------------
@dataclass
class Request:
    method: str
    path: str
    version: str
    headers: dict[str, str]
    body: bytes


class Conn:
    """One HTTP connection's writer, streaming chunked (HTTP/1.1) or until close (HTTP/1.0)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.chunked = True
        self.gone = False

    def closed_by_peer(self) -> bool:
        return self.gone or self.reader.at_eof() or self.writer.is_closing()

    async def send(self, status: int, body: dict | list, keep: bool) -> None:
        data = _dumps(body).encode("utf-8", "replace")
        head = (f"HTTP/1.1 {status} {REASONS.get(status, '')}\r\nContent-Type: application/json; charset=utf-8\r\n"
                f"Content-Length: {len(data)}\r\nConnection: {'keep-alive' if keep else 'close'}\r\n")
        if status == 401:
            head += 'WWW-Authenticate: Bearer realm="completiond"\r\n'
        await self._write(head.encode() + b"\r\n" + data)

    async def start_stream(self, http10: bool) -> None:
        self.chunked = not http10
        head = ("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                + ("Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n" if self.chunked else "Connection: close\r\n"))
        await self._write(head.encode() + b"\r\n")

    async def event(self, payload: str) -> None:
        data = f"data: {payload}\n\n".encode("utf-8", "replace")
        await self._write(f"{len(data):x}\r\n".encode() + data + b"\r\n" if self.chunked else data)

    async def end_stream(self) -> None:
        if self.chunked:
            await self._write(b"0\r\n\r\n")

    async def _write(self, data: bytes) -> None:
        if self.gone:
            return
        try:
            self.writer.write(data)
            await self.writer.drain()
        except (ConnectionError, OSError, RuntimeError):
            self.gone = True


class HttpServer:
    def __init__(self, daemon: Daemon, token: str):
        self.d = daemon
        self.token = token
        self.bridge = Bridge(daemon)
        self.connections = 0
        self.served = 0

    async def start(self, host: str, port: int) -> asyncio.AbstractServer:
        srv = await asyncio.start_server(self.connection, host=host, port=port, limit=MAX_HEADER_BYTES)
        log.info("http on %s:%d", host, port)
        return srv

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Conn(reader, writer)
        self.connections += 1
        try:
            if self.connections > MAX_CONNECTIONS:
                await conn.send(503, HttpError(503, "too many HTTP connections").body(), keep=False)
                return
            while not conn.gone:
                try:
                    req = await read_request(reader, writer)
                except HttpError as e:
                    await conn.send(e.status, e.body(), keep=False)
                    await _linger(reader, writer)
                    return
                if req is None:  # closed, or idle too long
                    return
                keep = req.version == "HTTP/1.1" and req.headers.get("connection", "").lower() != "close"
                try:
                    await self.handle(req, conn, keep)
                except HttpError as e:
                    await conn.send(e.status, e.body(), keep and not e.close)
                    keep = keep and not e.close
                except Exception as e:  # a bug costs this request, not the daemon
                    log.exception("http %s %s failed", req.method, req.path)
                    await conn.send(500, HttpError(500, f"{type(e).__name__}: {e}").body(), keep=False)
                    return
                if not keep:
                    return
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            self.connections -= 1
            try:
                writer.close()
            except (ConnectionError, OSError, RuntimeError):
                pass

    async def handle(self, req: Request, conn: Conn, keep: bool) -> None:
        path = req.path.split("?", 1)[0].rstrip("/") or "/"
        routes = {"/health": ("GET", self.health), "/v1/health": ("GET", self.health),
                  "/infill": ("POST", self.infill), "/v1/completions": ("POST", self.completions),
                  "/completions": ("POST", self.completions), "/v1/models": ("GET", self.models),
                  "/models": ("GET", self.models)}
        if path not in routes:
            raise HttpError(404, f"no endpoint {path} (this server has /infill, /v1/completions, /health, /v1/models)")
        method, fn = routes[path]
        if req.method != method:
            raise HttpError(405, f"{path} takes {method}, not {req.method}")
        if fn != self.health:
            self.authorize(req)
        await fn(req, conn, keep)

    def authorize(self, req: Request) -> None:
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

    async def health(self, req: Request, conn: Conn, keep: bool) -> None:
        if self.d.error:
            await conn.send(500, HttpError(500, f"models failed to load: {self.d.error}").body(), keep)
        elif not self.d.ready.is_set():
            await conn.send(503, HttpError(503, "Loading model").body(), keep)
        else:
            await conn.send(200, {"status": "ok"}, keep)

    async def models(self, req: Request, conn: Conn, keep: bool) -> None:
        await conn.send(200, {"object": "list", "data": [{"id": self.d.info.get("target"), "object": "model",
                                                          "created": int(self.d.started), "owned_by": "completiond"}]},
                        keep)

    # ---- /infill ----
    async def infill(self, req: Request, conn: Conn, keep: bool) -> None:
        body = json_body(req)
        ask, chunks = infill_ask(body)
        self._ready()
        fields = body.get("response_fields") or []
        return_tokens = bool(body.get("return_tokens"))
        if chunks or self.bridge.extra:
            async with self.bridge.lock:
                await self.bridge.set_extra(chunks)
        if ask.max_tokens == 0 or not ask.text:  # a context update: answer at once, warm meanwhile
            if ask.text:
                async with self.bridge.lock:
                    uri = await self.bridge.document(ask.text)
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
    async def completions(self, req: Request, conn: Conn, keep: bool) -> None:
        body = json_body(req)
        ask, echo = openai_ask(body)
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
        """n completions: greedy ones are one completion n times; sampled ones run one after another
        (each supersedes nothing: the previous has finished)."""
        dones: list[Done] = []
        for i in range(1 if ask.greedy else ask.n):
            done = await self.run(ask, conn, i, None)
            if done is None:
                return [Done("", {}, "none")] * ask.n
            dones.append(done)
        return dones * ask.n if ask.greedy else dones

    async def run(self, ask: Ask, conn: Conn, i: int, emit: Callable[[str], Any] | None) -> Done | None:
        """One `complete` through the bridge: streams increments through `emit` (text the client's
        stops allow), cancels when the client hangs up or a client-side stop fires; None if the client left."""
        async with self.bridge.lock:  # the document's text and the completion's snapshot of it, together
            uri = await self.bridge.document(ask.text)
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


def _dumps(obj: Any) -> str:
    """Compact, as llama.cpp writes it: llama.vim accepts an answer only if it matches '"content"\\s*:"'."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _usage(done: Done) -> dict:
    pt = done.res.get("prompt_tokens", 0)
    return {"prompt_tokens": pt, "completion_tokens": done.predicted, "total_tokens": pt + done.predicted}


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Before closing on a request we did not read whole: let the answer reach the client (closing
    with unread input sends a reset, which can destroy the answer in flight)."""
    try:
        if writer.can_write_eof():
            writer.write_eof()
        end = asyncio.get_running_loop().time() + 1.0
        while await asyncio.wait_for(reader.read(65536), max(0.0, end - asyncio.get_running_loop().time())):
            pass
    except (asyncio.TimeoutError, ConnectionError, OSError, RuntimeError, ValueError):
        pass


def json_body(req: Request) -> dict:
    try:
        body = json.loads(req.body.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise HttpError(400, f"request body is not UTF-8: {e.reason} at byte {e.start}") from None
    except json.JSONDecodeError as e:
        raise HttpError(400, f"request body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise HttpError(400, "request body is not valid JSON: nested too deep") from None
    if not isinstance(body, dict):
        raise HttpError(400, "request body must be a JSON object")
    return P.scrub(body)  # lone surrogates (JSON "\ud800") -> U+FFFD, as the wire does


# ---- HTTP/1.1 framing ------------------------------------------------------------------------------
async def read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Request | None:
    """The next request on a connection; None when the peer closed (or stayed idle IDLE_S)."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_S)
    except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError):
        return None
    except asyncio.LimitOverrunError:
        raise HttpError(431, f"request headers over {MAX_HEADER_BYTES} bytes", close=True) from None
    try:
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ")
    except ValueError:
        raise HttpError(400, "malformed request line", close=True) from None
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise HttpError(505, f"{version!r} not supported (HTTP/1.1)", close=True)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError(400, f"malformed header line {line[:60]!r}", close=True)
        headers[name.lower()] = value.strip()
    if "100-continue" in headers.get("expect", "").lower():  # curl asks before a large body
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    try:
        body = await asyncio.wait_for(_read_body(reader, headers, method), READ_S)
    except asyncio.TimeoutError:
        raise HttpError(408, f"request body not received within {READ_S:g} s", close=True) from None
    except asyncio.IncompleteReadError:
        return None
    return Request(method, target, version, headers, body)


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str], method: str) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts, size = [], 0
        while True:
            line = await reader.readuntil(b"\r\n")
            try:
                n = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                raise HttpError(400, "malformed chunk size", close=True) from None
            size += n
            if size > MAX_BODY_BYTES:
                raise HttpError(413, f"request body over {MAX_BODY_BYTES} bytes", close=True)
            if n == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                    pass
                return b"".join(parts)
            parts.append(await reader.readexactly(n))
            await reader.readexactly(2)
    length = headers.get("content-length")
    if length is None:
        if method == "POST":
            raise HttpError(411, "a POST needs Content-Length (or a chunked body)", close=True)
        return b""
    try:
        n = int(length)
    except ValueError:
        raise HttpError(400, f"bad Content-Length {length[:20]!r}", close=True) from None
    if n < 0:
        raise HttpError(400, "negative Content-Length", close=True)
    if n > MAX_BODY_BYTES:
        raise HttpError(413, f"request body over {MAX_BODY_BYTES} bytes", close=True)
    return await reader.readexactly(n)


async def start_http(daemon: Daemon, host: str, port: int, token: str) -> HttpServer:
    """Listen for HTTP on the daemon's loop; the daemon closes the listener when it stops."""
    server = HttpServer(daemon, token)
    daemon.servers.append(await server.start(host, port))
    return server
