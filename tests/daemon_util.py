"""Start and stop a real `completiond serve` process for tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path


def start_daemon(sock: Path, target: Path, *extra: str, env: dict | None = None, wait: bool = True,
                 log: Path | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "completiond", "serve", "--socket", str(sock), "--target", str(target),
           "--draft", "self:1", "--dtype", "float32", "--log-level", "WARNING", *extra]
    out = open(log, "wb") if log else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT if log else subprocess.PIPE,
                            env={**os.environ, **(env or {})})
    if wait:
        wait_for_socket(sock, proc)
        wait_ready(sock, proc)
    return proc


def daemon_status(sock: Path, timeout: float = 30.0) -> dict:
    """`status` over a blocking socket (callable from inside a running event loop, unlike asyncio.run)."""
    import msgpack

    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(str(sock))
        s.sendall(msgpack.packb([0, 1, "status", {}]))
        unpacker = msgpack.Unpacker(raw=False)
        while True:
            data = s.recv(65536)
            if not data:
                raise ConnectionError("daemon closed the connection before answering status")
            unpacker.feed(data)
            for frame in unpacker:
                if frame[0] == 1 and frame[1] == 1:
                    if frame[2] is not None:
                        raise RuntimeError(f"status failed: {frame[2]}")
                    return frame[3]


def wait_ready(sock: Path, proc: subprocess.Popen, timeout: float = 300.0) -> dict:
    """Until the daemon's models are loaded (its socket answers `status` from the first second)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = daemon_status(sock)
        if st["state"] == "ready":
            return st
        if st["state"] == "failed" or proc.poll() is not None:
            raise RuntimeError(f"daemon failed to load: {st.get('error')}")
        time.sleep(0.1)
    raise TimeoutError("daemon did not load its models")


def wait_for_socket(sock: Path, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """Until the daemon accepts connections (a stale socket file may exist before it binds)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(sock))
            return
        except OSError:
            pass
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise RuntimeError(f"daemon exited with {proc.returncode}: {err[-2000:]}")
        time.sleep(0.05)
    raise TimeoutError("daemon did not create its socket")


def stop_daemon(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


@contextlib.asynccontextmanager
async def in_process(tmp_path: Path, engine, **daemon_kw):
    """A `Daemon` on `engine` in this process and an initialized client: yields (client, daemon)."""
    import asyncio

    from completiond.service.client import Client
    from completiond.service.daemon import Daemon

    daemon = Daemon(engine, {"target": "tiny", "draft": None, "device": "cpu"}, **daemon_kw)
    sock = tmp_path / "d.sock"
    task = asyncio.create_task(daemon.serve(sock))
    while not sock.exists():
        await asyncio.sleep(0.01)
    c = await Client.connect(sock)
    await c.request("initialize", {"client": "t", "protocol": 1, "workspace_roots": []})
    try:
        yield c, daemon
    finally:
        await c.close()
        daemon.stopping.set()
        await asyncio.wait_for(task, 30)


async def wait_warm(c, uri: str, timeout: float = 60.0) -> dict:
    """Until `status` says the next completion's prompt of `uri` is cached; its warm entry."""
    import asyncio

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = (await c.request("status", {}))["warm"][uri]
        if st["warm"]:
            return st
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{uri} never warm: {st}")


def cursor_after(line: int, char: int, typed: str) -> dict:
    """The cursor after typing `typed` (ASCII) at (line, char)."""
    return {"line": line + typed.count("\n"),
            "character": (0 if "\n" in typed else char) + len(typed.rsplit("\n", 1)[-1])}


async def insert(c, uri: str, version: int, line: int, char: int, text: str) -> None:
    """Type `text` at (line, char): an incremental document/change."""
    at = {"line": line, "character": char}
    await c.notify("document/change", {"uri": uri, "version": version,
                                       "changes": [{"range": {"start": at, "end": at}, "text": text}]})


# ---- fuzzing (tests/test_daemon.py on the tiny model, benchmarks/fuzz.py on a real one) ------------
FUZZ_METHODS = ["complete", "rewrite", "cancel", "document/open", "document/change", "document/close",
                "initialize", "status", "debug/lookup", "x"]
FUZZ_KEYS = ["uri", "text", "position", "range", "changes", "id", "version", "mode", "max_tokens", "instruction",
             "protocol", "workspace_roots"]


def fuzz_frames(n: int) -> list[bytes]:
    """n random msgpack frames: requests of the methods above with mutated params, wrong shapes, any value."""
    import msgpack
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=False),
                     st.text(max_size=20), st.binary(max_size=20))
    value = st.recursive(leaf, lambda ch: st.one_of(st.lists(ch, max_size=4),
                                                     st.dictionaries(st.text(max_size=8), ch, max_size=4)),
                         max_leaves=12)
    frame = st.one_of(
        st.tuples(st.just(0), st.integers(0, 2**31), st.sampled_from(FUZZ_METHODS),
                  st.dictionaries(st.sampled_from(FUZZ_KEYS), value, max_size=5)).map(list),
        st.lists(value, max_size=5), value,
    )
    out: list[bytes] = []

    @settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(frame)
    def collect(f):
        out.append(msgpack.packb(f, use_bin_type=True))

    collect()
    return out


async def read_frames(reader, out: list | None = None) -> list:
    """Every frame the daemon sends until it closes the connection (or resets it), appended to `out`
    as it arrives: a caller that times out keeps what came."""
    import msgpack

    out = [] if out is None else out
    unp = msgpack.Unpacker(raw=False)
    try:
        while data := await reader.read(65536):
            unp.feed(data)
            out.extend(unp)
    except ConnectionError:
        pass
    return out


async def fuzz_send(sock: Path, frames: list[bytes], per_connection: int = 500, read_s: float = 1.0) -> dict:
    """Write the frames, `per_connection` to a connection in one write, and read what is answered in
    `read_s` (long completions are cut by the close). Internal errors (-32603) are the daemon's bugs."""
    import asyncio

    answered, internal, closed_early = 0, [], 0
    for i in range(0, len(frames), per_connection):
        r, w = await asyncio.open_unix_connection(str(sock))
        got: list = []
        try:
            w.write(b"".join(frames[i:i + per_connection]))
            await w.drain()
            await asyncio.wait_for(read_frames(r, got), read_s)
            closed_early += 1  # the daemon closed the connection (a frame it cannot resynchronize after)
        except asyncio.TimeoutError:
            pass
        except ConnectionError:
            closed_early += 1
        answered += len(got)
        internal += [f for f in got if isinstance(f, list) and len(f) == 4 and f[0] == 1 and isinstance(f[2], dict)
                     and f[2].get("code") == -32603]
        w.close()
    return {"frames": len(frames), "connections": -(-len(frames) // per_connection), "answered": answered,
            "closed_by_daemon": closed_early, "internal_errors": len(internal), "internal_error_frames": internal[:3]}


# ---- a misbehaving remote target (tests/test_hostile_remote.py, benchmarks/fuzz.py --surface remote) ---
class Misbehaving:
    """(tests/test_hostile_remote.py, benchmarks/fuzz.py --surface remote) An OpenAI-style /v1/completions server whose answer depends on the word after '# mode:' in
    the prompt; records when each connection closed (the daemon's cancel reaching the server)."""

    def __init__(self):
        self.closed_at: dict[str, float] = {}
        self.events_sent: dict[str, int] = {}

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        mode = "?"
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")))
            body = json.loads(await reader.readexactly(length))
            mode = body["prompt"].split("# mode:", 1)[1].split()[0]
            if mode == "badstatus":
                writer.write(b"HTTP/1.1 2x0 Fine\r\n\r\n")
                await writer.drain()
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
            n = 0
            if mode == "trickle":  # one byte at a time, never a whole line
                for b in b'data: {"choices": [{"text": "never"}]}' * 1000:
                    writer.write(bytes([b]))
                    await writer.drain()
                    try:  # a 0.3 s pause that notices the daemon's close (EOF) at once
                        if not await asyncio.wait_for(reader.read(1), 0.3):
                            break
                    except asyncio.TimeoutError:
                        pass
            elif mode == "endless":  # valid text events, as fast as the daemon reads them
                while True:
                    writer.write(b'data: {"choices": [{"text": "xy", "finish_reason": null}]}\n\n' * 50)
                    n += 50
                    self.events_sent[mode] = n
                    await writer.drain()
            elif mode == "empty":  # whole events (each resets an idle timer) with no text, forever
                while True:
                    writer.write(b'data: {"choices": [{"text": "", "finish_reason": null}]}\n\n')
                    await writer.drain()
                    await asyncio.sleep(0.2)
            elif mode == "long":  # 1,000 events of a 128-character line each, one at a time, then the end
                for _ in range(1000):
                    writer.write(b'data: {"choices": [{"text": "%s\\n", "finish_reason": null}]}\n\n' % (b"x" * 127))
                    await writer.drain()
                    await asyncio.sleep(0.003)
                writer.write(b"data: [DONE]\n\n")
            elif mode == "badtext":
                writer.write(b'data: {"choices": [{"text": 5, "finish_reason": null}]}\n\n')
            elif mode == "good":
                writer.write(b'data: {"choices": [{"text": "r * r", "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n')
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, OSError, asyncio.CancelledError):
            pass  # the daemon closed the stream (what the tests wait for), or the server is stopping
        finally:
            self.closed_at[mode] = time.monotonic()
            writer.close()

    async def __aenter__(self):
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc):
        self.server.close()


def mangled_requests(good: bytes, n: int, seed: int) -> list[bytes]:
    """n copies of an HTTP request with 1-6 random byte edits each (flips, cuts, inserted framing)."""
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        data = bytearray(good)
        for _ in range(rng.randint(1, 6)):
            i = rng.randrange(len(data))
            op = rng.random()
            if op < 0.4:
                data[i] = rng.randrange(256)
            elif op < 0.7:
                del data[i:i + rng.randint(1, 8)]
            else:
                data[i:i] = rng.choice([b"\r\n", b":", b" ", b"-1", b"\x00", b"chunked", b"999999999"])
        out.append(bytes(data))
    return out
