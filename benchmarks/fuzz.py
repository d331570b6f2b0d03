"""Fuzz a real `completiond serve`: its socket (random, truncated and extreme frames), its HTTP server
(`--http`: idle floods, bodies without the token, 1-byte chunks, malformed framing, oversized
documents) or its remote target (`--target openai:URL` against a misbehaving server: a trickle, endless
and empty event streams, malformed answers); then check that it still answers and completes. The
model is real (the default one unless --target).

    python -m benchmarks.fuzz [--surface socket|http|remote] [--target qwen2.5-coder-0.5b] [--threads 2]

socket: `frames` random msgpack frames (tests/daemon_util.fuzz_frames), random bytes, valid frames cut
short, framing extremes (a 200 MB frame, 10^6-deep lists and maps); counts internal errors (-32603).
http: the daemon's RSS sampled every 50 ms through each attack against its idle RSS (after a warm
completion), and the token holder's completions (POST /v1/completions, 2 tokens) timed during each.
remote: the target is this script's misbehaving server (tests/daemon_util.Misbehaving; the tokenizer is
--target's); times a cancel of a trickle, another document's answer during it, the idle deadline,
max_tokens against endless events and the overall deadline against empty ones.
Writes benchmarks/results/fuzz-[<surface>-]<model>.json (with the CPU's name).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack

from benchmarks.soak import connect, rss_mb, wait_ready
from tests.daemon_util import Misbehaving, fuzz_frames, fuzz_send, mangled_requests, read_frames

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return "

VALID = [[0, 1, "status", {}],
         [0, 2, "document/open", {"uri": "file:///f.py", "text": "def f(x):\n    return ", "version": 1}],
         [0, 3, "complete", {"uri": "file:///f.py", "position": {"line": 1, "character": 11}, "max_tokens": 4}],
         [0, 4, "rewrite", {"uri": "file:///f.py", "instruction": "x", "range": {
             "start": {"line": 0, "character": 0}, "end": {"line": 1, "character": 0}}}]]


def random_bytes(n: int, rng: random.Random) -> list[bytes]:
    return [rng.randbytes(rng.randint(1, 4096)) for _ in range(n)]


def truncated(n: int, rng: random.Random) -> list[bytes]:
    """Valid frames cut at a random byte: the daemon waits for the rest until the client closes."""
    out = []
    for _ in range(n):
        b = msgpack.packb(rng.choice(VALID))
        out.append(b[:rng.randint(1, len(b) - 1)])
    return out


async def extreme(sock: Path, name: str, data: bytes, read_s: float = 10.0) -> dict:
    """One frame on its own connection: what the daemon answers, and whether it closed, within read_s."""
    r, w = await asyncio.open_unix_connection(str(sock))
    t0 = time.perf_counter()
    out: dict = {"case": name, "bytes": len(data)}

    async def write() -> None:  # the daemon may answer and close before it has read everything
        try:
            w.write(data)
            await w.drain()
        except ConnectionError as e:
            out["write_error"] = type(e).__name__

    writer = asyncio.create_task(write())
    got: list = []
    try:
        await asyncio.wait_for(read_frames(r, got), read_s)
        out["closed_by_daemon"] = True
    except asyncio.TimeoutError:
        out["closed_by_daemon"] = False
    if got:
        out["answers"] = [f[2] if isinstance(f, list) and len(f) == 4 else repr(f)[:200] for f in got]
    await writer
    out["ms"] = round((time.perf_counter() - t0) * 1000, 1)
    w.close()
    return out


async def run(sock: Path, pid: int, a: argparse.Namespace) -> dict:
    rng = random.Random(a.seed)
    out: dict = {"rss_mb": {"before": rss_mb(pid)}}
    t = time.perf_counter()
    out["random_frames"] = await fuzz_send(sock, fuzz_frames(a.frames), per_connection=500, read_s=2.0)
    out["random_bytes"] = await fuzz_send(sock, random_bytes(a.blobs, rng), per_connection=10, read_s=0.5)
    out["truncated_frames"] = await fuzz_send(sock, truncated(a.blobs, rng), per_connection=1, read_s=0.1)
    big = msgpack.packb([0, 1, "document/open", {"uri": "file:///big.py", "text": "x" * (200 * 2**20), "version": 1}])
    out["extremes"] = [await extreme(sock, "200 MB frame", big),
                       await extreme(sock, "10^6-deep lists", b"\x91" * 10**6 + b"\xc0"),
                       await extreme(sock, "10^6-deep maps", b"\x81\xa1k" * 10**6 + b"\xc0")]
    out["fuzz_s"] = round(time.perf_counter() - t, 1)
    out["rss_mb"]["after_fuzz"] = rss_mb(pid)
    # still alive and still completing, on the real model
    c = await connect(sock)
    await c.request("document/open", VALID[1][3])
    t = time.perf_counter()
    res = await c.request("complete", VALID[2][3], timeout=600)
    out["after"] = {"alive": True, "complete_ms": round((time.perf_counter() - t) * 1000, 1),
                    "text": res["text"], "cancelled": res["cancelled"]}
    await c.close()
    out["internal_errors"] = sum(out[k]["internal_errors"] for k in ("random_frames", "random_bytes", "truncated_frames"))
    out["internal_errors"] += sum(1 for e in out["extremes"] for f in e.get("answers", [])
                                  if isinstance(f, dict) and f.get("code") == -32603)
    return out


# ---- the HTTP surface ------------------------------------------------------------------------------
class Rss:
    """The daemon's RSS sampled every 50 ms while the block runs: its max (MB)."""

    def __init__(self, pid: int):
        self.pid, self.max = pid, 0.0

    async def _sample(self) -> None:
        while True:
            self.max = max(self.max, rss_mb(self.pid))
            await asyncio.sleep(0.05)

    async def __aenter__(self) -> "Rss":
        self.task = asyncio.create_task(self._sample())
        return self

    async def __aexit__(self, *exc) -> None:
        self.task.cancel()
        self.max = max(self.max, rss_mb(self.pid))


async def http_call(port: int, method: str, path: str, body: dict | None, token: str | None,
                    timeout: float = 120) -> tuple[int, bytes, float]:
    """(status, body, ms) of one request on its own connection."""
    t0 = time.perf_counter()
    r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    data = json.dumps(body).encode() if body is not None else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(data)}\r\n" + (f"Authorization: Bearer {token}\r\n" if token else "")
    w.write(head.encode() + b"\r\n" + data)
    try:
        reply = await asyncio.wait_for(r.read(), timeout)
    finally:
        w.close()
    status = int(reply[9:12]) if reply[:5] == b"HTTP/" else 0
    return status, reply.split(b"\r\n\r\n", 1)[-1], (time.perf_counter() - t0) * 1000


HOLDER = """
import http.client, json, sys, time
port, token, prompt = int(sys.argv[1]), sys.argv[2], sys.argv[3]
while True:
    t0 = time.perf_counter()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        c.request("POST", "/v1/completions", body=json.dumps({"prompt": prompt, "max_tokens": 2}),
                  headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
        status = c.getresponse().status
        c.close()
    except OSError as e:
        status = type(e).__name__
    print(json.dumps([status, round((time.perf_counter() - t0) * 1000, 1)]), flush=True)
    time.sleep(0.3)
"""


class Holder:
    """The token holder: a 2-token completion every 0.3 s while an attack runs, from a process of its
    own (not this one's event loop, busy with the attack); their wall ms."""

    def __init__(self, port: int, token: str):
        self.port, self.token, self.ms, self.failed = port, token, [], []

    async def _read(self) -> None:
        while line := await self.proc.stdout.readline():
            status, ms = json.loads(line)
            (self.ms if status == 200 else self.failed).append(ms if status == 200 else status)

    async def __aenter__(self) -> "Holder":
        self.proc = await asyncio.create_subprocess_exec(sys.executable, "-c", HOLDER, str(self.port), self.token,
                                                         PROMPT, stdout=asyncio.subprocess.PIPE)
        self.task = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc) -> None:
        self.proc.terminate()
        await self.proc.wait()
        await self.task

    def summary(self) -> dict:
        ms = sorted(self.ms)
        return {"served": len(ms), "failed": self.failed, "ms_p50": ms[len(ms) // 2] if ms else None,
                "ms_max": ms[-1] if ms else None}


async def attack(name: str, pid: int, port: int, token: str, idle_mb: float, work) -> dict:
    """Run `work()` with the RSS sampled and the token holder asking; its result and both measures."""
    t0 = time.perf_counter()
    async with Rss(pid) as rss, Holder(port, token) as holder:
        await asyncio.sleep(0.5)  # the holder has started
        got = await work()
        await asyncio.sleep(max(0.0, 3.0 - (time.perf_counter() - t0)))  # at least a few of its requests
    out = {"attack": name, "s": round(time.perf_counter() - t0, 1), "rss_max_mb": rss.max,
           "rss_ratio": round(rss.max / idle_mb, 3), "holder": holder.summary(), **got}
    print(f"  {name}: RSS max {rss.max} MB ({out['rss_ratio']}x idle), holder {out['holder']}, "
          f"{ {k: v for k, v in got.items() if k != 'statuses'} } {got.get('statuses', '')}", flush=True)
    return out


async def idle_flood(port: int, n: int = 100, hold_s: float = 5.0) -> dict:
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(n)]
    await asyncio.sleep(hold_s)
    dropped = sum(r.at_eof() or w.is_closing() for r, w in conns)
    for r, w in conns:
        w.close()
    return {"connections": n, "dropped_by_daemon": dropped}


async def count_status(r: asyncio.StreamReader, w: asyncio.StreamWriter, statuses: dict[str, int]) -> None:
    """Read the answer's status code (or "closed" when none came within 5 s) into `statuses`; close."""
    try:
        head = await asyncio.wait_for(r.read(12), 5)
    except (ConnectionError, OSError, asyncio.TimeoutError):
        head = b""
    key = head[9:12].decode() if head.startswith(b"HTTP/") else "closed"
    statuses[key] = statuses.get(key, 0) + 1
    w.close()


async def unauth_bodies(port: int, conns: int = 60, mib: int = 16, rounds: int = 3) -> dict:
    """Each round: `conns` connections POST `mib` MiB bodies without the token (what grew RSS by GBs)."""
    statuses: dict[str, int] = {}
    sent = 0

    async def one() -> None:
        nonlocal sent
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"POST /infill HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (mib << 20))
        piece = b"x" * (1 << 20)
        try:
            for _ in range(mib):
                w.write(piece)
                await asyncio.wait_for(w.drain(), 5)
                sent += len(piece)
        except (ConnectionError, OSError, asyncio.TimeoutError):
            pass
        await count_status(r, w, statuses)

    for _ in range(rounds):
        await asyncio.gather(*(one() for _ in range(conns)))
    return {"connections": conns * rounds, "mib_each": mib, "bytes_sent": sent, "statuses": statuses}


async def one_byte_chunks(port: int, token: str | None, conns: int = 2, seconds: float = 10.0) -> dict:
    statuses: dict[str, int] = {}
    chunks = 0

    async def one() -> None:
        nonlocal chunks
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"POST /infill HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
                + (f"Authorization: Bearer {token}\r\n".encode() if token else b"") + b"\r\n")
        end = time.monotonic() + seconds
        try:
            while time.monotonic() < end and not r.at_eof():
                w.write(b"1\r\nx\r\n" * 256)
                await asyncio.wait_for(w.drain(), 2)
                chunks += 256
        except (ConnectionError, OSError, asyncio.TimeoutError):
            pass
        await count_status(r, w, statuses)

    await asyncio.gather(*(one() for _ in range(conns)))
    return {"connections": conns, "with_token": token is not None, "chunks_sent": chunks, "statuses": statuses}


async def raw(port: int, data: bytes, read_s: float = 5.0) -> bytes:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    try:
        w.write(data)
        if w.can_write_eof():
            w.write_eof()
        return await asyncio.wait_for(r.read(), read_s)
    except (ConnectionError, OSError, asyncio.TimeoutError):
        return b""
    finally:
        w.close()


async def malformed(port: int, token: str, n: int) -> dict:
    auth = f"Authorization: Bearer {token}\r\n".encode()
    cases = {"chunk size -1": b"-1\r\nhello\r\n0\r\n\r\n", "70 KB chunk extension": b"5;" + b"e" * 70_000 + b"\r\nhello\r\n0\r\n\r\n"}
    named = {}
    for name, chunk in cases.items():
        reply = await raw(port, b"POST /infill HTTP/1.1\r\n" + auth + b"Transfer-Encoding: chunked\r\n\r\n" + chunk)
        named[name] = reply[:12].decode("latin-1") or "closed"
    good = (b"POST /infill HTTP/1.1\r\n" + auth + b"Content-Type: application/json\r\nContent-Length: 30\r\n\r\n"
            + json.dumps({"input_prefix": "a", "n_predict": 1}).encode().ljust(30))
    statuses: dict[str, int] = {}
    for data in mangled_requests(good, n, seed=69):
        reply = await raw(port, data)
        key = reply[9:12].decode() if reply.startswith(b"HTTP/") else "closed"
        statuses[key] = statuses.get(key, 0) + 1
    return {"named": named, "mangled": n, "statuses": statuses}


async def oversized(port: int, token: str) -> dict:
    out = {}
    for name, path, body in (("4.5M-char input_prefix", "/infill", {"input_prefix": "x" * 4_500_000, "n_predict": 4}),
                             ("5.5M chars of input_extra", "/infill",
                              {"input_prefix": "a = ", "n_predict": 4,
                               "input_extra": [{"filename": f"f{i}.py", "text": "y" * 1_100_000} for i in range(5)]})):
        status, reply, ms = await http_call(port, "POST", path, body, token)
        out[name] = {"status": status, "message": json.loads(reply)["error"]["message"] if status >= 400 else "",
                     "ms": round(ms, 1)}
    return out


async def run_http(pid: int, port: int, token: str, a: argparse.Namespace) -> dict:
    for _ in range(3):  # warm: the holder's prompt is cached, the heap has grown to its working size
        status, _, ms = await http_call(port, "POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 2}, token)
    await asyncio.sleep(1.5)  # the engine thread trims its heap once idle (IDLE_TRIM_S)
    idle = rss_mb(pid)
    base = Holder(port, token)
    async with base:
        await asyncio.sleep(3)
    out: dict = {"rss_idle_mb": idle, "holder_idle": base.summary(), "attacks": []}
    print(f"  idle: RSS {idle} MB, holder {out['holder_idle']}", flush=True)
    for name, work in (("100 idle connections", lambda: idle_flood(port)),
                       ("60 x 16 MiB bodies without the token, 3 rounds", lambda: unauth_bodies(port)),
                       ("2 connections of 1-byte chunks, no token, 10 s", lambda: one_byte_chunks(port, None)),
                       ("2 connections of 1-byte chunks with the token, 10 s", lambda: one_byte_chunks(port, token)),
                       ("malformed framing", lambda: malformed(port, token, a.blobs)),
                       ("oversized documents", lambda: oversized(port, token))):
        out["attacks"].append(await attack(name, pid, port, token, idle, work))
    out["rss_ratio_max"] = max(x["rss_ratio"] for x in out["attacks"])
    out["holder_ms_max"] = max((x["holder"]["ms_max"] or 0) for x in out["attacks"])
    out["holder_failed"] = sum(len(x["holder"]["failed"]) for x in out["attacks"])
    status, body, ms = await http_call(port, "POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 8}, token)
    out["after"] = {"status": status, "ms": round(ms, 1), "text": json.loads(body)["choices"][0]["text"] if status == 200 else ""}
    out["internal_errors"] = sum(v for x in out["attacks"] for k, v in x.get("statuses", {}).items() if k == "500")
    return out


# ---- the remote surface ----------------------------------------------------------------------------
async def run_remote(sock: Path, pid: int, srv: Misbehaving, a: argparse.Namespace) -> dict:
    from completiond.service.client import DaemonError

    docs = {}

    async def doc(mode: str):
        if mode not in docs:
            c = await connect(sock)
            uri = f"file:///{mode}.py"
            await c.request("document/open", {"uri": uri, "text": f"# mode: {mode}\n" + PROMPT, "version": 1})
            docs[mode] = (c, uri)
        return docs[mode]

    at = {"line": 4, "character": len("    return ")}

    async def complete(mode: str, max_tokens: int = 16) -> tuple[dict | str, float]:
        c, uri = await doc(mode)
        t0 = time.perf_counter()
        try:
            res = await c.request("complete", {"uri": uri, "position": at, "max_tokens": max_tokens}, timeout=300)
        except DaemonError as e:
            res = e.message
        return res, round((time.perf_counter() - t0) * 1000, 1)

    await complete("good")
    await asyncio.sleep(1.5)
    idle = rss_mb(pid)
    out: dict = {"rss_idle_mb": idle}
    async with Rss(pid) as rss:
        # a trickle (a byte every 0.3 s): another document meanwhile, then the cancel
        c, uri = await doc("trickle")
        msgid, slow = c.send_request("complete", {"uri": uri, "position": at, "max_tokens": 16})
        await asyncio.sleep(1.0)
        good, good_ms = await complete("good")
        t0, t0m = time.perf_counter(), time.monotonic()
        await c.request("cancel", {"id": msgid}, timeout=30)
        try:
            res = await asyncio.wait_for(slow, 60)
            cancelled = res.get("cancelled")
        except DaemonError as e:
            cancelled = e.message
        cancel_ms = (time.perf_counter() - t0) * 1000
        for _ in range(100):  # the server's side of the close
            if "trickle" in srv.closed_at:
                break
            await asyncio.sleep(0.02)
        closed_ms = srv.closed_at.get("trickle", float("nan")) - t0m
        out["trickle_cancel"] = {"answered_ms": round(cancel_ms, 1), "cancelled": cancelled,
                                 "server_saw_close_ms": round(closed_ms * 1000, 1),
                                 "other_document_ms": good_ms, "other_document_text": good["text"]}
        srv.closed_at.pop("trickle", None)
        res, ms = await complete("trickle")
        out["trickle_idle"] = {"ms": ms, "error": res if isinstance(res, str) else None}
        # endless text events, with status asked meanwhile
        c, uri = await doc("endless")
        msgid, endless = c.send_request("complete", {"uri": uri, "position": at, "max_tokens": 16})
        t0 = time.perf_counter()
        await c.request("status", {}, timeout=60)
        status_ms = (time.perf_counter() - t0) * 1000
        res = await asyncio.wait_for(endless, 300)
        out["endless"] = {"max_tokens": 16, "chars": len(res["text"]), "stopped_by": res["stopped_by"],
                          "events_sent_by_server": srv.events_sent.get("endless"), "status_ms": round(status_ms, 1)}
        res, ms = await complete("empty")
        out["empty_events"] = {"ms": ms, "stopped_by": res.get("stopped_by") if isinstance(res, dict) else res}
        out["malformed"] = {m: (await complete(m))[0] for m in ("badtext", "badstatus")}
    out["rss_max_mb"], out["rss_ratio"] = rss.max, round(rss.max / idle, 3)
    res, ms = await complete("good")
    out["after"] = {"ms": ms, "text": res["text"] if isinstance(res, dict) else res}
    for c, _ in docs.values():
        await c.close()
    for k in ("trickle_cancel", "trickle_idle", "endless", "empty_events", "malformed"):
        print(f"  {k}: {out[k]}", flush=True)
    print(f"  RSS idle {idle} MB, max {rss.max} MB ({out['rss_ratio']}x)", flush=True)
    return out


async def main(a: argparse.Namespace) -> dict:
    from completiond.models.device import cpu_features, cpu_name

    tmp = Path(tempfile.mkdtemp(prefix="completiond-fuzz-"))
    sock = tmp / "d.sock"
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "MKL_NUM_THREADS": str(a.threads)}
    target, extra, srv = a.target, [], None
    if a.surface == "http":
        port = free_port()
        extra = ["--http", f"127.0.0.1:{port}", "--token-file", str(tmp / "token")]
    elif a.surface == "remote":
        srv = await Misbehaving().__aenter__()
        target = f"openai:http://127.0.0.1:{srv.port}/v1#{a.target}"
        extra = ["--remote-timeout", "5", "--remote-deadline", "6"]
    cmd = [sys.executable, "-m", "completiond", "serve", "--socket", str(sock), "--target", target,
           "--draft", a.draft, "--log-level", "WARNING", *extra]
    log = open(tmp / "daemon.log", "wb")
    if a.daemon_src:  # a before/after: the daemon of another source tree (`git archive REV completiond`)
        env["PYTHONPATH"] = str(Path(a.daemon_src).resolve())
        out_src = {"daemon_src": a.daemon_src}
    else:
        out_src = {}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=a.daemon_src or ROOT)
    out: dict = {"surface": a.surface, "target": target, "draft": a.draft, "threads": a.threads, "cpu": cpu_name(),
                 "cpu_features": cpu_features(), "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "command": "python -m benchmarks.fuzz " + " ".join(sys.argv[1:]),
                 "load_avg_1m": {"start": round(os.getloadavg()[0], 1)}, **out_src}  # the machine is shared: its load
    try:
        await wait_ready(sock, proc, 900)
        if a.surface == "http":
            out.update(await run_http(proc.pid, port, (tmp / "token").read_text().strip(), a))
        elif a.surface == "remote":
            out.update(await run_remote(sock, proc.pid, srv, a))
        else:
            out.update(await run(sock, proc.pid, a))
        out["crashed"] = proc.poll() is not None
    except Exception as e:
        out["crashed"] = proc.poll() is not None
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
        if srv is not None:
            await srv.__aexit__(None, None, None)
        log.close()
        out["daemon_exit"] = proc.returncode
        out["load_avg_1m"]["end"] = round(os.getloadavg()[0], 1)
        text = (tmp / "daemon.log").read_text(errors="replace")
        # a traceback that escaped to asyncio closed a connection: the daemon survived, that client did not
        out["unhandled_exceptions"] = text.count("Unhandled exception")
        out["tracebacks"] = text.count("Traceback")
        out["daemon_log_tail"] = text[-2000:]
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--surface", default="socket", choices=["socket", "http", "remote"])
    ap.add_argument("--target", default="qwen2.5-coder-0.5b")
    ap.add_argument("--draft", default="none")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--frames", type=int, default=8000, help="random msgpack frames")
    ap.add_argument("--blobs", type=int, default=300, help="random byte strings, and as many truncated frames "
                                                          "(http: mangled requests)")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--daemon-src", default=None, metavar="DIR",
                    help="run the daemon from this source tree (for a before/after: `git archive REV completiond "
                         "| tar -x -C DIR`)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    out = asyncio.run(main(a))
    model = re.sub(r"[^\w.-]+", "_", Path(a.target).name)
    name = f"fuzz-{model}.json" if a.surface == "socket" else f"fuzz-{a.surface}-{model}.json"
    path = Path(a.out) if a.out else ROOT / "benchmarks" / "results" / name
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"{out['cpu']}, {a.surface}, target {out['target']}: crashed {out['crashed']}, "
          f"internal errors {out.get('internal_errors')}, unhandled exceptions {out.get('unhandled_exceptions')}, "
          f"tracebacks {out.get('tracebacks')}, after: {out.get('after')}, {out.get('error', '')}\nwrote {path}")
    for e in out.get("extremes", []):
        print(f"  {e['case']}: closed {e['closed_by_daemon']} in {e['ms']} ms, answers {str(e.get('answers'))[:200]}")
    ok = not out["crashed"] and not out.get("unhandled_exceptions") and "error" not in out
    if a.surface == "socket":
        ok = ok and out.get("internal_errors") == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(cli())
