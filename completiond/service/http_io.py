"""HTTP/1.1 framing for `serve --http` (service/http.py): requests with Content-Length or chunked
bodies, keep-alive, bounded header and body sizes, JSON and SSE answers. No HTTP library."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from . import protocol as P

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = P.MAX_FRAME_BYTES
IDLE_S = 30.0  # a keep-alive connection with no next request is closed after this
READ_S = 30.0  # a request's headers and body must arrive within this

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


# ---- HTTP/1.1 framing ------------------------------------------------------------------------------
async def read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> HttpRequest | None:
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
    return HttpRequest(method, target, version, headers, body)


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

