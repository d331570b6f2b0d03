"""Async MessagePack-RPC client for the daemon (used by the CLI, the LSP server, tests and benchmarks)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..paths import socket_path
from . import protocol as P


class DaemonError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(f"{message} ({code})")
        self.code = code
        self.message = message


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._handlers: dict[str, list[Callable[[dict], None]]] = {}
        self._unpacker = P.unpacker()
        self._task = asyncio.create_task(self._read_loop())
        self.closed = asyncio.Event()
        self.close_reason = ""  # the daemon's last error frame with no msgid (sent before it hangs up)

    @classmethod
    async def connect(cls, path: str | Path | None = None, host: str | None = None, port: int | None = None
                      ) -> "Client":
        if host is not None:
            reader, writer = await asyncio.open_connection(host, port)
        else:
            reader, writer = await asyncio.open_unix_connection(str(path or socket_path()))
        return cls(reader, writer)

    def on(self, method: str, handler: Callable[[dict], None]) -> Callable[[], None]:
        """Call handler(params) for each notification `method`; returns an unsubscribe function."""
        self._handlers.setdefault(method, []).append(handler)
        return lambda: self._handlers[method].remove(handler)

    def send_request(self, method: str, params: dict | None = None) -> tuple[int, asyncio.Future]:
        """Write a request now (lone surrogates in strings are sent as U+FFFD); its future resolves later."""
        msgid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending[msgid] = fut
        self.writer.write(P.pack([P.REQUEST, msgid, method, params or {}]))
        return msgid, fut

    async def request(self, method: str, params: dict | None = None, timeout: float | None = None) -> Any:
        _, fut = self.send_request(method, params)
        await self.writer.drain()
        return await asyncio.wait_for(fut, timeout)

    async def notify(self, method: str, params: dict | None = None) -> None:
        self.writer.write(P.pack([P.NOTIFICATION, method, params or {}]))
        await self.writer.drain()

    async def _read_loop(self) -> None:
        try:
            while data := await self.reader.read(65536):
                self._unpacker.feed(data)
                for obj in self._unpacker:
                    self._dispatch(obj)
        except (ConnectionError, OSError, ValueError):
            pass
        finally:
            self.closed.set()
            reason = f": {self.close_reason}" if self.close_reason else ""
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionError(f"daemon connection closed{reason}"))
            self._pending.clear()

    def _dispatch(self, obj) -> None:
        if obj[0] == P.RESPONSE:
            if obj[1] is None and obj[2] is not None:
                self.close_reason = obj[2].get("message", "")
            fut = self._pending.pop(obj[1], None)
            if fut is None or fut.done():
                return
            if obj[2] is not None:
                fut.set_exception(DaemonError(obj[2].get("code", 0), obj[2].get("message", "")))
            else:
                fut.set_result(obj[3])
        elif obj[0] == P.NOTIFICATION:
            for h in list(self._handlers.get(obj[1], [])):
                h(obj[2])

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
        self._task.cancel()


class Mismatch(Exception):
    """The running daemon cannot answer as asked (another model, a flag it does not run with)."""


async def complete_once(sock: Path, uri: str, text: str, line: int, character: int, params: dict,
                        check: Callable[[dict], str | None], roots: list[str] | None = None,
                        on_wait: Callable[[dict], None] | None = None, connect_timeout: float = 5.0,
                        load_timeout: float = 300.0) -> tuple[dict, dict]:
    """One completion from the daemon on `sock` (`completiond complete`): (its model info, the result).

    Opens the document, completes at (line, character) in UTF-32 code points, closes it. `check(info)`
    returns why this daemon cannot serve the request (Mismatch), or None. A daemon still loading is
    waited for (`on_wait(status)` once) up to load_timeout seconds. Raises OSError / TimeoutError
    when there is no daemon or it does not answer, DaemonError when it refuses the request."""
    client = await asyncio.wait_for(Client.connect(sock), connect_timeout)
    try:
        await client.request("initialize", {"client": "completiond-cli", "protocol": P.PROTOCOL_VERSION,
                                            "position_encoding": "utf-32", "workspace_roots": roots or []},
                             timeout=connect_timeout)
        info = await client.request("status", {}, timeout=connect_timeout)  # initialize names the models only
        loop = asyncio.get_running_loop()
        deadline = loop.time() + load_timeout
        waited = False
        while info.get("state") != "ready":
            if info.get("state") == "failed":
                raise Mismatch(f"it failed to load its models: {info.get('error')}")
            if loop.time() > deadline:
                raise TimeoutError(f"the daemon on {sock} did not finish loading in {load_timeout:g} s")
            if not waited and on_wait is not None:
                on_wait(info)
            waited = True
            await asyncio.sleep(0.1)
            info = await client.request("status", {}, timeout=connect_timeout)
        why = check(info)
        if why:
            raise Mismatch(why)
        await client.request("document/open", {"uri": uri, "text": text, "version": 0}, timeout=connect_timeout)
        result = await client.request("complete", {"uri": uri, "position": {"line": line, "character": character},
                                                   **params})
        await client.request("document/close", {"uri": uri}, timeout=connect_timeout)
        return info, result
    finally:
        await client.close()
