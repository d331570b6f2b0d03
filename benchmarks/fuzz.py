"""Fuzz a real `completiond serve` (issue 13): random, truncated and extreme frames on its socket, then
check that it still answers and completes. The model is real (the default one unless --target).

    python benchmarks/fuzz.py [--target qwen2.5-coder-0.5b] [--frames 8000] [--threads 2]

Cases: `frames` random msgpack frames (the methods with mutated params, wrong shapes, any value;
tests/daemon_util.fuzz_frames), random bytes, valid frames cut short, and framing extremes (a 200 MB
frame, 10^6-deep nesting of lists and of maps). Counts internal errors (-32603, the daemon's bugs) and
whether the process survived; writes benchmarks/results/fuzz-<model>.json (with the CPU's name).
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

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from daemon_util import fuzz_frames, fuzz_send, read_frames  # noqa: E402
from soak import connect, rss_mb, wait_ready  # noqa: E402  (benchmarks/ is this script's directory)

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


async def main(a: argparse.Namespace) -> dict:
    from completiond.models.device import cpu_name

    tmp = Path(tempfile.mkdtemp(prefix="completiond-fuzz-"))
    sock = tmp / "d.sock"
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "MKL_NUM_THREADS": str(a.threads)}
    cmd = [sys.executable, "-m", "completiond", "serve", "--socket", str(sock), "--target", a.target,
           "--draft", a.draft, "--log-level", "WARNING"]
    log = open(tmp / "daemon.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    out: dict = {"target": a.target, "draft": a.draft, "threads": a.threads, "cpu": cpu_name(),
                 "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv)}
    try:
        await wait_ready(sock, proc, 900)
        out.update(await run(sock, proc.pid, a))
        out["crashed"] = proc.poll() is not None
    except Exception as e:
        out["crashed"] = proc.poll() is not None
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
        log.close()
        out["daemon_exit"] = proc.returncode
        text = (tmp / "daemon.log").read_text(errors="replace")
        # a traceback that escaped to asyncio closed a connection: the daemon survived, that client did not
        out["unhandled_exceptions"] = text.count("Unhandled exception")
        out["daemon_log_tail"] = text[-2000:]
    return out


def cli() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-0.5b")
    ap.add_argument("--draft", default="none")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--frames", type=int, default=8000, help="random msgpack frames")
    ap.add_argument("--blobs", type=int, default=300, help="random byte strings, and as many truncated frames")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    out = asyncio.run(main(a))
    model = re.sub(r"[^\w.-]+", "_", Path(a.target).name)
    path = Path(a.out) if a.out else ROOT / "benchmarks" / "results" / f"fuzz-{model}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"{out['cpu']}, target {a.target}: crashed {out['crashed']}, internal errors {out.get('internal_errors')}, "
          f"unhandled exceptions {out.get('unhandled_exceptions')}, "
          f"after: {out.get('after')}, RSS {out.get('rss_mb')}, {out.get('error', '')}\nwrote {path}")
    for e in out.get("extremes", []):
        print(f"  {e['case']}: closed {e['closed_by_daemon']} in {e['ms']} ms, answers {str(e.get('answers'))[:200]}")
    ok = not out["crashed"] and out.get("internal_errors") == 0 and not out.get("unhandled_exceptions")
    return 0 if ok and "error" not in out else 1


if __name__ == "__main__":
    sys.exit(cli())
