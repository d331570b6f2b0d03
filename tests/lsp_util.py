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
        self.arrived: dict[Any, float] = {}  # response id -> loop time it came
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
                self.arrived[msg.get("id")] = asyncio.get_running_loop().time()
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


# ---- fuzzing the real completiond-lsp (tests/test_editors_truth.py short, benchmarks/lsp_fuzz.py long) ----
FUZZ_URIS = [f"file:///fuzz/m{i}.py" for i in range(4)] + ["file:///fuzz/caf%C3%A9.py", "untitled:Untitled-1"]
FUZZ_TEXT = "import os\n\n\ndef add(a, b):\n    return a + b\n\n\nclass A:\n    def f(self):\n        x = 'é😀'\n    "
JUNK = [None, True, -1, 2**40, 1.5, "x", "", [], {}, [1, "a"], {"a": 1}, "\ud800", "0" * 1000]


def _junk(rng: random.Random) -> Any:
    return rng.choice(JUNK)


def _mutate(rng: random.Random, value: Any, depth: int = 0) -> Any:
    """`value` with one field replaced, dropped or retyped somewhere inside."""
    if isinstance(value, dict) and value and depth < 4:
        key = rng.choice(list(value))
        out = dict(value)
        roll = rng.random()
        if roll < 0.2:
            del out[key]
        elif roll < 0.6:
            out[key] = _mutate(rng, value[key], depth + 1)
        else:
            out[key] = _junk(rng)
        return out
    return _junk(rng) if rng.random() < 0.7 else value


def fuzz_messages(n: int, seed: int = 0, huge_every: int = 500, huge_chars: int = 4 * 1024 * 1024 + 17
                  ) -> list[tuple[str, Any]]:
    """`n` messages for an initialized completiond-lsp, as ("request", (method, params)),
    ("notify", (method, params)), ("cancel", k) (cancel the request sent k requests ago) or
    ("raw", bytes): valid, malformed and out-of-order document updates, completions at good and bad
    positions, unknown methods, junk params, interleaved cancels, bodies that are no JSON, and a
    document over the daemon's limit every `huge_every` messages."""
    rng = random.Random(seed)
    versions = {u: 0 for u in FUZZ_URIS}
    out: list[tuple[str, Any]] = []
    for i in range(n):
        uri = rng.choice(FUZZ_URIS)
        roll = rng.random()
        if huge_every and i % huge_every == huge_every - 1:
            versions[uri] += 1
            out.append(("notify", ("textDocument/didOpen", doc_item(uri, "x = 1\n" * (huge_chars // 6 + 1),
                                                                     versions[uri]))))
        elif roll < 0.12:
            versions[uri] += 1
            out.append(("notify", ("textDocument/didOpen", doc_item(uri, FUZZ_TEXT, versions[uri]))))
        elif roll < 0.30:
            # valid, out-of-range, backwards, older-version and malformed edits
            versions[uri] += 1
            version = versions[uri] if rng.random() < 0.7 else rng.randint(-3, versions[uri])
            line, char = rng.randint(0, 14), rng.randint(0, 20)
            end = {"line": line + rng.randint(-1, 2), "character": rng.randint(0, 30)}
            change = {"range": {"start": {"line": line, "character": char}, "end": end},
                      "text": rng.choice(["x", "\n", "", "é😀", "    return ", "def f():\n    "])}
            if rng.random() < 0.1:
                change = {"text": FUZZ_TEXT}
            params = {"textDocument": {"uri": uri, "version": version}, "contentChanges": [change]}
            out.append(("notify", ("textDocument/didChange", params if rng.random() < 0.85 else _mutate(rng, params))))
        elif roll < 0.34:
            out.append(("notify", ("textDocument/didClose", {"textDocument": {"uri": uri}})))
        elif roll < 0.60:
            params = position_params(uri, rng.randint(-1, 14), rng.randint(-1, 30))
            out.append(("request", ("textDocument/inlineCompletion",
                                    params if rng.random() < 0.6 else _mutate(rng, params))))
        elif roll < 0.68:
            out.append(("cancel", rng.randint(0, 3)))
        elif roll < 0.74:
            method = rng.choice(["foo/bar", "textDocument/completion", "$/unknown", "completiond/nothing", ""])
            out.append(("request" if rng.random() < 0.6 else "notify", (method, _junk(rng))))
        elif roll < 0.80:
            params = {"textDocument": {"uri": uri}, "range": {"start": {"line": 0, "character": 0},
                                                             "end": {"line": rng.randint(0, 20), "character": 0}},
                      "context": {"diagnostics": []}}
            out.append(("request", ("textDocument/codeAction", params if rng.random() < 0.5 else _mutate(rng, params))))
        elif roll < 0.85:
            arg = {"uri": uri, "range": {"start": {"line": 0, "character": 0}, "end": {"line": 1, "character": 0}},
                   "instruction": "shorter"}
            out.append(("request", ("workspace/executeCommand",
                                    {"command": "completiond.rewrite", "arguments": [_mutate(rng, arg)]})))
        elif roll < 0.91:
            params = {"textDocument": {"uri": uri}, "position": {"line": rng.randint(0, 14), "character": 0}}
            out.append(("notify", ("completiond/cursor", params if rng.random() < 0.5 else _mutate(rng, params))))
        elif roll < 0.95:
            out.append(("notify", ("workspace/didChangeConfiguration",
                                   {"settings": {"completiond": {"maxTokens": rng.choice([4, 8, -1, "x", 10**9]),
                                                                 "debounceMs": rng.choice([0, -5, "y"])}}})))
        elif roll < 0.98:
            out.append(("request", ("initialize", {"processId": None, "capabilities": {}})))  # a second one
        else:
            out.append(("raw", rng.choice([b"{not json", b"[]", b'{"jsonrpc": "2.0"}', b"\xff\xfe", b"null"])))
    return out


async def run_fuzz(lsp: RawLsp, messages: list[tuple[str, Any]], answer_timeout: float = 300.0,
                   pace_s: float = 0.0) -> dict:
    """Send `messages`; every request must be answered (result or error) within `answer_timeout` of
    the last one sent. Returns counts, error codes, unanswered ids and answer latencies."""
    loop = asyncio.get_running_loop()
    sent: dict[Any, tuple[str, float]] = {}
    order: list[Any] = []
    kinds: dict[str, int] = {}
    for kind, body in messages:
        kinds[kind] = kinds.get(kind, 0) + 1
        if kind == "request":
            method, params = body
            msg_id = lsp.request(method, params)
            sent[msg_id] = (method, loop.time())
            order.append(msg_id)
        elif kind == "notify":
            lsp.notify(*body)
        elif kind == "cancel" and order:
            lsp.notify("$/cancelRequest", {"id": order[max(0, len(order) - 1 - body)]})
        elif kind == "raw":
            lsp.send_raw(body)
        await lsp.proc.stdin.drain()
        if pace_s:
            await asyncio.sleep(pace_s)
    deadline = loop.time() + answer_timeout
    while loop.time() < deadline and any(i not in lsp.responses for i in sent) and lsp.alive():
        await asyncio.sleep(0.1)
    codes: dict[str, int] = {}
    latencies = []
    slowest: dict[str, float] = {}
    for msg_id, (method, t) in sent.items():
        res = lsp.responses.get(msg_id)
        if res is None:
            continue
        key = "result" if "result" in res else str(res.get("error", {}).get("code"))
        codes[key] = codes.get(key, 0) + 1
        latencies.append(lsp.arrived[msg_id] - t)
        slowest[method] = round(max(slowest.get(method, 0.0), latencies[-1]), 3)
    unanswered = [(i, sent[i][0]) for i in sent if i not in lsp.responses]
    return {"messages": len(messages), "kinds": kinds, "requests": len(sent),
            "answered": len(sent) - len(unanswered), "unanswered": unanswered[:20],
            "answers": dict(sorted(codes.items())), "server_alive": lsp.alive(), "slowest_s": slowest,
            "answer_s": {"p50": _pct(latencies, 50), "p99": _pct(latencies, 99), "max": _pct(latencies, 100)}}


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(len(xs) * q / 100))], 3)
