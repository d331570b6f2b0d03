"""HTTP/1.1 framing for `serve --http` (service/http.py): requests with Content-Length or chunked
bodies, keep-alive, JSON and SSE answers. No HTTP library.

A request is read in two steps: its head (bounded by MAX_HEADER_BYTES and HEAD_S), then, once the
server has checked its path and token, its body (bounded per request by MAX_BODY_BYTES with the
chunked framing counted, and across connections by a Budget). A peer without the token never
gets a body buffered. Every malformed request is an HttpError (a 4xx), never an exception that
escapes to asyncio."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from . import protocol as P

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = P.MAX_FRAME_BYTES  # one request's body, chunk framing counted
MAX_BUFFERED_BYTES = 4 * MAX_BODY_BYTES  # request bodies held at once, all connections together
MAX_CHUNK_LINE = 1024  # a chunk-size line with its extensions, or one trailer line
MAX_TRAILERS = 32
MAX_CHUNKS = 1 << 16  # chunks of one body (16 MiB in 256-byte chunks): parsing each costs Python time
IDLE_S = 30.0  # a keep-alive connection of a client that sent the token, with no next request
HEAD_S = 10.0  # a connection that has not yet sent the token has this long for each request's headers
READ_S = 30.0  # a request's body must arrive within this
LINGER_BYTES = 256 * 1024  # read and dropped before closing on an unread body (then a reset is fine)

REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 411: "Length Required", 413: "Payload Too Large",
           431: "Request Header Fields Too Large", 500: "Internal Server Error", 501: "Not Implemented",
           503: "Service Unavailable", 505: "HTTP Version Not Supported"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 413: "invalid_request_error", 503: "unavailable_error"}


class HttpError(Exception):
    def __init__(self, status: int, message: str, close: bool = False):
        super().__init__(message)
        self.status, self.message, self.close = status, message, close

    def body(self) -> dict:
        # llama.cpp's shape ({code, message, type}); the openai client reads message and type from it
        return {"error": {"code": self.status, "message": self.message,
                          "type": ERROR_TYPES.get(self.status, "server_error")}}


def _dumps(obj: Any) -> str:
    """Compact, as llama.cpp writes it: llama.vim accepts an answer only if it matches '"content"\\s*:"'."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


# ---- requests and answers on one connection -----------------------------------------------------
@dataclass
class HttpRequest:
    method: str
    path: str
    version: str
    headers: dict[str, str]
    body: bytes


class Conn:
    """One HTTP connection's writer, streaming chunked (HTTP/1.1) or until close (HTTP/1.0)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, arrived: float = 0.0):
        self.reader, self.writer = reader, writer
        self.chunked = True
        self.gone = False
        self.arrived = arrived  # loop time it connected
        self.authed = False  # sent the token once: never dropped to make room
        self.idle = True  # waiting for a request's head (droppable when not authed)
        self.held = 0  # bytes of the request body in hand (the server's Budget)

    def drop(self) -> None:
        """Close at once (the server needs the slot); the connection's task ends on the EOF."""
        self.gone = True
        self.writer.transport.abort()

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


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Before closing on a request we did not read whole: let the answer reach the client (closing
    with unread input sends a reset, which can destroy the answer in flight)."""
    try:
        if writer.can_write_eof():
            writer.write_eof()
        end, left = asyncio.get_running_loop().time() + 1.0, LINGER_BYTES
        while left > 0 and (data := await asyncio.wait_for(reader.read(65536),
                                                           max(0.0, end - asyncio.get_running_loop().time()))):
            left -= len(data)
    except (asyncio.TimeoutError, ConnectionError, OSError, RuntimeError, ValueError):
        pass


# ---- HTTP/1.1 framing ------------------------------------------------------------------------------
class Budget:
    """Bytes of request bodies held at once, across connections (MAX_BUFFERED_BYTES); a request's
    share is given back once it is answered."""

    def __init__(self, limit: int = MAX_BUFFERED_BYTES):
        self.limit, self.held = limit, 0

    def take(self, n: int) -> None:
        if self.held + n > self.limit:
            raise HttpError(503, f"request bodies over {self.limit} bytes held at once: try again", close=True)
        self.held += n

    def give(self, n: int) -> None:
        self.held -= n


async def read_head(reader: asyncio.StreamReader, timeout: float) -> HttpRequest | None:
    """The next request's line and headers (its body comes later, from read_body, once the request
    is authorized); None when the peer closed or sent nothing within `timeout`."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
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
        raise HttpError(505, f"{version[:20]!r} not supported (HTTP/1.1)", close=True)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError(400, f"malformed header line {line[:60]!r}", close=True)
        name = name.lower()
        if name in headers and name in ("content-length", "transfer-encoding", "authorization"):
            raise HttpError(400, f"{name} given twice", close=True)
        headers[name] = value.strip()
    req = HttpRequest(method, target, version, headers, b"")
    if "transfer-encoding" in headers:
        if headers["transfer-encoding"].lower() != "chunked":
            raise HttpError(501, f"transfer-encoding {headers['transfer-encoding'][:40]!r} (only chunked)", close=True)
        if "content-length" in headers:
            raise HttpError(400, "both content-length and transfer-encoding", close=True)
    elif "content-length" in headers:
        length = headers["content-length"]
        if not (length.isascii() and length.isdigit()) or len(length) > 18:
            raise HttpError(400, f"bad Content-Length {length[:20]!r}", close=True)
    return req


def has_body(req: HttpRequest) -> bool:
    return "transfer-encoding" in req.headers or int(req.headers.get("content-length") or 0) > 0


async def read_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, req: HttpRequest,
                    budget: Budget) -> int:
    """Read the body of an authorized request into req.body, within READ_S, MAX_BODY_BYTES (chunk
    sizes, extensions, line ends and trailers counted) and the server's budget; the bytes taken
    from the budget (give them back when the request is answered)."""
    if "100-continue" in req.headers.get("expect", "").lower() and has_body(req):  # curl asks first
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    count = _Count(budget)
    try:
        req.body = await asyncio.wait_for(_read_body(reader, req, count), READ_S)
    except asyncio.TimeoutError:
        raise HttpError(408, f"request body not received within {READ_S:g} s", close=True) from None
    except asyncio.IncompleteReadError:
        raise HttpError(400, "the request body ended early", close=True) from None
    except BaseException:
        budget.give(count.n)
        raise
    return count.n


class _Count:
    def __init__(self, budget: Budget):
        self.budget, self.n = budget, 0

    def __call__(self, n: int) -> None:
        if self.n + n > MAX_BODY_BYTES:
            raise HttpError(413, f"request body over {MAX_BODY_BYTES} bytes", close=True)
        self.budget.take(n)
        self.n += n


async def _read_body(reader: asyncio.StreamReader, req: HttpRequest, count: _Count) -> bytes:
    if "transfer-encoding" in req.headers:
        body = bytearray()  # not a list of chunks: a million 1-byte chunks would be a million objects
        for n_chunks in range(MAX_CHUNKS + 1):
            if n_chunks % 64 == 63:  # buffered chunks are parsed without a pause: let other clients in
                await asyncio.sleep(0)
            line = await _line(reader, count)
            size = line.split(b";", 1)[0].strip()
            if not size or len(size) > 16 or size.strip(b"0123456789abcdefABCDEF"):
                raise HttpError(400, f"malformed chunk size {size[:20]!r}", close=True)
            n = int(size, 16)
            if n == 0:
                for _ in range(MAX_TRAILERS + 1):
                    if await _line(reader, count) == b"\r\n":
                        return bytes(body)
                raise HttpError(400, f"over {MAX_TRAILERS} trailer lines", close=True)
            count(n + 2)
            body += await reader.readexactly(n)
            if await reader.readexactly(2) != b"\r\n":
                raise HttpError(400, "a chunk does not end with CRLF", close=True)
        raise HttpError(413, f"request body in over {MAX_CHUNKS} chunks", close=True)
    n = int(req.headers.get("content-length") or 0)
    if req.method == "POST" and "content-length" not in req.headers:
        raise HttpError(411, "a POST needs Content-Length (or a chunked body)", close=True)
    count(n)
    return await reader.readexactly(n) if n else b""


async def _line(reader: asyncio.StreamReader, count: _Count) -> bytes:
    """One CRLF-ended line of chunked framing, at most MAX_CHUNK_LINE bytes, counted."""
    try:
        line = await reader.readuntil(b"\r\n")
    except asyncio.LimitOverrunError:
        line = b""
    if not line or len(line) > MAX_CHUNK_LINE:
        raise HttpError(400, f"chunk size line or trailer over {MAX_CHUNK_LINE} bytes", close=True)
    count(len(line))
    return line
