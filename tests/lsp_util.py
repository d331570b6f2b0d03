"""A raw JSON-RPC client for the real completiond-lsp over stdio: sends any bytes (malformed params,
unknown methods, out-of-order messages), collects every response and notification. Used by
tests/test_editors_truth.py and benchmarks/lsp_fuzz.py."""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

LSP_CMD = [sys.executable, "-m", "completiond_lsp.server"]


class RawLsp:
    """One completiond-lsp process; `responses[id]` fills in as answers arrive."""

    def __init__(self, proc: asyncio.subprocess.Process):
        self.proc = proc
        self.responses: dict[Any, dict] = {}
        self.notifications: list[dict] = []
        self.server_requests: list[dict] = []
        self._waiters: dict[Any, asyncio.Future] = {}
        self._reader = asyncio.create_task(self._read())
        self._next = 10_000_000

    @classmethod
    async def start(cls, log_file: Path | None = None, env: dict | None = None) -> "RawLsp":
        args = [*LSP_CMD, "--log-level", "INFO"] + (["--log-file", str(log_file)] if log_file else [])
        proc = await asyncio.create_subprocess_exec(*args, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.DEVNULL,
                                                    env={**os.environ, **(env or {})}, limit=64 * 1024 * 1024)
        return cls(proc)

    async def _read(self) -> None:
        out = self.proc.stdout
        while True:
            length = None
            while True:
                line = await out.readline()
                if not line:
                    return
                line = line.strip()
                if not line:
                    break
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            msg = json.loads(await out.readexactly(length))
            if "method" in msg and "id" in msg:  # a request from the server: answer it
                self.server_requests.append(msg)
                self.send_raw({"jsonrpc": "2.0", "id": msg["id"],
                               "result": {"applied": True} if msg["method"] == "workspace/applyEdit" else None})
            elif "method" in msg:
                self.notifications.append(msg)
            else:
                self.responses[msg.get("id")] = msg
                fut = self._waiters.pop(msg.get("id"), None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)

    def send_raw(self, msg: Any) -> None:
        body = msg if isinstance(msg, bytes) else json.dumps(msg).encode()
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)

    def request(self, method: str, params: Any = None, msg_id: Any = None) -> Any:
        """Send a request; returns its id (await `answer(id)`)."""
        if msg_id is None:
            self._next += 1
            msg_id = self._next
        msg = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            msg["params"] = params
        self.send_raw(msg)
        return msg_id

    def notify(self, method: str, params: Any = None) -> None:
        msg = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        self.send_raw(msg)

    async def answer(self, msg_id: Any, timeout: float = 30.0) -> dict:
        if msg_id in self.responses:
            return self.responses[msg_id]
        fut = self._waiters.setdefault(msg_id, asyncio.get_running_loop().create_future())
        return await asyncio.wait_for(asyncio.shield(fut), timeout)

    async def call(self, method: str, params: Any = None, timeout: float = 30.0) -> dict:
        return await self.answer(self.request(method, params), timeout)

    async def initialize(self, options: dict, root_uri: str | None = None) -> dict:
        res = await self.call("initialize", {"processId": None, "rootUri": root_uri, "capabilities": {
            "general": {"positionEncodings": ["utf-16"]}}, "initializationOptions": options}, timeout=120)
        self.notify("initialized", {})
        return res

    def alive(self) -> bool:
        return self.proc.returncode is None

    async def close(self) -> int:
        try:
            if self.alive():
                await self.call("shutdown", None, timeout=10)
                self.notify("exit")
                await asyncio.wait_for(self.proc.wait(), 10)
        except (asyncio.TimeoutError, ConnectionError, BrokenPipeError):
            self.proc.kill()
            await self.proc.wait()
        self._reader.cancel()
        return self.proc.returncode


def doc_item(uri: str, text: str, version: int = 1) -> dict:
    return {"textDocument": {"uri": uri, "languageId": "python", "version": version, "text": text}}


def position_params(uri: str, line: Any, character: Any) -> dict:
    """textDocument/inlineCompletion params."""
    return {"textDocument": {"uri": uri}, "position": {"line": line, "character": character},
            "context": {"triggerKind": 1}}
