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
