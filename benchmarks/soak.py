"""Soak a real `completiond serve`: keystroke storm, concurrent clients, a 4M-character
document and a 2,000-line rewrite, against one daemon on a temporary socket.

    python -m benchmarks.soak [--target qwen2.5-coder-0.5b] [--draft none] [--threads 1] [--storm-s 10]

Prints p50/p95 latencies, the daemon's RSS at each phase and error counts; writes
benchmarks/results/soak-<model>.json (with the CPU's name).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from completiond.service import protocol as P  # noqa: E402
from completiond.service.client import Client, DaemonError  # noqa: E402

SOURCE = (ROOT / "completiond" / "core" / "prompt" / "__init__.py").read_text()  # a realistic file to type into
TYPED = "    total = accumulate(total, value * weight, index=i)  # running sum\n"
BIG_LINE = "row_{:06d} = compute({}, 'abc') + offset\n"


def rss_mb(pid: int) -> float:
    try:
        import psutil
        return round(psutil.Process(pid).memory_info().rss / 2**20, 1)
    except ImportError:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))], 1)


def summary(ms: list[float]) -> dict:
    return {"n": len(ms), "p50_ms": pct(ms, 50), "p95_ms": pct(ms, 95), "max_ms": round(max(ms), 1) if ms else None}


class Counts:
    def __init__(self) -> None:
        self.answered = self.cancelled = self.version_errors = self.other_errors = 0
        self.messages: list[str] = []

    def add(self, fut: asyncio.Future) -> dict | None:
        try:
            res = fut.result()
        except DaemonError as e:
            if "version" in e.message:
                self.version_errors += 1
            else:
                self.other_errors += 1
            if len(self.messages) < 5:
                self.messages.append(f"{e.code}: {e.message}")
            return None
        except Exception as e:  # the connection went away
            self.other_errors += 1
            self.messages.append(f"{type(e).__name__}: {e}")
            return None
        if res["cancelled"]:
            self.cancelled += 1
        else:
            self.answered += 1
        return res

    def to_json(self) -> dict:
        return {"answered": self.answered, "cancelled": self.cancelled, "version_errors": self.version_errors,
                "other_errors": self.other_errors, "error_messages": self.messages}


async def connect(sock: Path) -> Client:
    c = await Client.connect(sock)
    await c.request("initialize", {"client": "soak", "protocol": P.PROTOCOL_VERSION}, timeout=30)
    return c


async def wait_ready(sock: Path, proc: subprocess.Popen, timeout: float) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited with {proc.returncode}")
        try:
            c = await Client.connect(sock)
            try:
                st = await c.request("status", {}, timeout=10)
            finally:
                await c.close()
            if st.get("state", "ready") == "ready":
                return st
            if st.get("state") == "failed":
                raise RuntimeError(f"daemon failed to load: {st.get('error')}")
        except (OSError, asyncio.TimeoutError):
            pass
        await asyncio.sleep(0.5)
    raise TimeoutError("daemon not ready")


async def storm(sock: Path, seconds: float, rate: float, rounds: int, max_tokens: int) -> dict:
    """One client types at `rate` Hz: each keystroke a document/change and a complete (the older one
    superseded). Each round types for seconds/rounds, then waits for the last keystroke's answer."""
    c = await connect(sock)
    uri = "file:///soak/storm.py"
    text = SOURCE + "\n\ndef soak(values, weights):\n    total = 0\n    for i, value in enumerate(values):\n"
    await c.request("document/open", {"uri": uri, "text": text, "version": 1, "language_id": "python"})
    line, col, version, typed = text.count("\n"), 0, 1, 0
    t0 = time.perf_counter()  # the file's first completion prefills its whole prompt: not a keystroke's cost
    await c.request("complete", {"uri": uri, "version": 1, "max_tokens": max_tokens,
                                 "position": {"line": line, "character": 0}}, timeout=600)
    cold_ms = (time.perf_counter() - t0) * 1000
    counts, finals, futures = Counts(), [], []
    per_round = seconds / rounds
    for _ in range(rounds):
        t_end = time.perf_counter() + per_round
        next_at = time.perf_counter()
        last = None
        while time.perf_counter() < t_end:
            ch = TYPED[typed % len(TYPED)]
            typed += 1
            version += 1
            await c.notify("document/change", {"uri": uri, "version": version, "changes": [
                {"range": {"start": {"line": line, "character": col}, "end": {"line": line, "character": col}},
                 "text": ch}]})
            line, col = (line + 1, 0) if ch == "\n" else (line, col + 1)
            _, last = c.send_request("complete", {"uri": uri, "version": version, "max_tokens": max_tokens,
                                                  "position": {"line": line, "character": col}})
            t_last = time.perf_counter()
            futures.append(last)
            next_at += 1 / rate
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        try:
            await asyncio.wait_for(asyncio.shield(last), 120)
        except Exception:
            pass
        finals.append((time.perf_counter() - t_last) * 1000)
    await asyncio.gather(*futures, return_exceptions=True)
    final_results = [counts.add(f) for f in futures]
    last_ok = sum(1 for r in final_results[-1:] if r is not None and not r["cancelled"])
    await c.close()
    return {"seconds": seconds, "rate_hz": rate, "rounds": rounds, "keystrokes": len(futures),
            "first_completion_in_the_file_ms": round(cold_ms, 1),
            "final_answer_after_last_keystroke": summary(finals), "final_answer_ms": [round(x, 1) for x in finals],
            "last_request_answered": bool(last_ok), **counts.to_json()}


async def concurrent(sock: Path, clients: int, requests: int, max_tokens: int) -> dict:
    """`clients` connections, each completing `requests` times in its own document, all at once."""
    counts, lat = Counts(), []

    async def one(k: int) -> None:
        c = await connect(sock)
        uri = f"file:///soak/client{k}.py"
        body = SOURCE + f"\n\ndef client_{k}(items):\n    result = []\n    for item in items:\n        "
        await c.request("document/open", {"uri": uri, "text": body, "version": 1, "language_id": "python"})
        last = body.count("\n")
        for _ in range(requests):
            t0 = time.perf_counter()
            _, fut = c.send_request("complete", {"uri": uri, "max_tokens": max_tokens,
                                                 "position": {"line": last, "character": 8}})
            await asyncio.gather(fut, return_exceptions=True)
            if counts.add(fut) is not None:
                lat.append((time.perf_counter() - t0) * 1000)
        await c.close()

    await asyncio.gather(*(one(k) for k in range(clients)))
    return {"clients": clients, "requests_each": requests, "latency": summary(lat), **counts.to_json()}


async def big_document(sock: Path, chars: int, edits: int, max_tokens: int) -> dict:
    """Open a `chars`-character document, edit it, complete after each edit; a second client's
    `status` round trip meanwhile shows whether the event loop was held."""
    c, probe = await connect(sock), await connect(sock)
    uri = "file:///soak/big.py"
    text = "".join(BIG_LINE.format(i, i) for i in range(chars // len(BIG_LINE.format(0, 0)) + 1))[:chars]
    text = text[: text.rfind("\n") + 1]
    t0 = time.perf_counter()
    await c.request("document/open", {"uri": uri, "text": text, "version": 1}, timeout=120)
    open_ms = (time.perf_counter() - t0) * 1000
    change_ms, complete_ms, prompt_tokens, probe_ms = [], [], [], []
    counts = Counts()
    stop = asyncio.Event()

    async def probing() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            await probe.request("status", {}, timeout=120)
            probe_ms.append((time.perf_counter() - t) * 1000)
            await asyncio.sleep(0.05)

    prober = asyncio.create_task(probing())
    last = text.count("\n")
    for v in range(2, 2 + edits):
        line = last if v % 2 == 0 else (last * (v - 1)) // (edits + 2)  # the end, then lines through the middle
        t = time.perf_counter()
        await c.request("document/change", {"uri": uri, "version": v, "changes": [
            {"range": {"start": {"line": line, "character": 0}, "end": {"line": line, "character": 0}},
             "text": "x = "}]}, timeout=120)
        change_ms.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        _, fut = c.send_request("complete", {"uri": uri, "version": v, "max_tokens": max_tokens,
                                             "position": {"line": line, "character": 4}})
        await asyncio.gather(fut, return_exceptions=True)
        if (res := counts.add(fut)) is not None:
            complete_ms.append((time.perf_counter() - t) * 1000)
            prompt_tokens.append(res["prompt_tokens"])
    stop.set()
    await prober
    await c.close()
    await probe.close()
    return {"chars": len(text), "lines": last, "open_ms": round(open_ms, 1), "change": summary(change_ms),
            "complete": summary(complete_ms), "prompt_tokens_max": max(prompt_tokens, default=None),
            "prompt_budget": P.MAX_PROMPT_TOKENS, "status_probe_while_editing": summary(probe_ms), **counts.to_json()}


async def big_rewrite(sock: Path, max_tokens: int, fit_lines: int) -> dict:
    """The issue's 2,000-line rewrite (max_tokens 2) with another client's completion sent right after."""
    a, b = await connect(sock), await connect(sock)
    sel = "".join(f"    v{i:04d} = f(v{i - 1:04d}, {i % 97:2d}) + 1  # ok\n" for i in range(2000))  # 70,000 chars
    await a.request("document/open", {"uri": "file:///soak/rw.py", "text": sel, "version": 1})
    await b.request("document/open", {"uri": "file:///soak/other.py", "text": "def add(a, b):\n    return ",
                                      "version": 1})
    t0 = time.perf_counter()
    _, rw = a.send_request("rewrite", {"uri": "file:///soak/rw.py", "instruction": "rename f to g", "max_tokens": 2,
                                       "range": {"start": {"line": 0, "character": 0},
                                                 "end": {"line": 2000, "character": 0}}})
    _, other = b.send_request("complete", {"uri": "file:///soak/other.py", "max_tokens": max_tokens,
                                           "position": {"line": 1, "character": 11}})
    out: dict = {"selection_chars": len(sel), "selection_lines": 2000}
    try:
        res = await asyncio.wait_for(rw, 600)
        out["rewrite"] = {"refused": False, "prompt_tokens": res["prompt_tokens"]}
    except DaemonError as e:
        out["rewrite"] = {"refused": True, "code": e.code, "message": e.message}
    out["rewrite"]["ms"] = round((time.perf_counter() - t0) * 1000, 1)
    await asyncio.gather(other, return_exceptions=True)
    out["other_client_complete_ms"] = round((time.perf_counter() - t0) * 1000, 1)
    out["other_client_ok"] = other.exception() is None
    # a rewrite within the budget (the last `fit_lines` lines): how long it holds the engine from another
    # client. That client's completion in a small document of its own, first alone (idle), then in a
    # twin document right after the rewrite starts; each timed to its own answer.
    twins = {"idle": "def mul(x, y):\n    return ", "during": "def div(x, y):\n    return "}
    for name, text in twins.items():
        await b.request("document/open", {"uri": f"file:///soak/{name}.py", "text": text, "version": 1})
    fit: dict = {"lines": fit_lines}
    t = time.perf_counter()
    await b.request("complete", {"uri": "file:///soak/idle.py", "max_tokens": max_tokens,
                                 "position": {"line": 1, "character": 11}}, timeout=600)
    fit["other_client_idle_ms"] = round((time.perf_counter() - t) * 1000, 1)
    t0 = time.perf_counter()
    _, rw = a.send_request("rewrite", {"uri": "file:///soak/rw.py", "instruction": "rename f to g", "max_tokens": 2,
                                       "range": {"start": {"line": 2000 - fit_lines, "character": 0},
                                                 "end": {"line": 2000, "character": 0}}})
    await asyncio.sleep(0.5)  # the rewrite's prefill is under way
    t1 = time.perf_counter()
    _, other = b.send_request("complete", {"uri": "file:///soak/during.py", "max_tokens": max_tokens,
                                           "position": {"line": 1, "character": 11}})
    other.add_done_callback(lambda _: fit.setdefault("other_client_complete_ms",
                                                     round((time.perf_counter() - t1) * 1000, 1)))
    try:
        res = await asyncio.wait_for(rw, 600)
        fit.update(prompt_tokens=res["prompt_tokens"], ms=round((time.perf_counter() - t0) * 1000, 1))
    except DaemonError as e:
        fit.update(error=f"{e.code}: {e.message}")
    await asyncio.gather(other, return_exceptions=True)
    if other.exception() is None:  # where its time went, as the daemon saw it
        fit["other_client_result"] = {k: other.result().get(k) for k in (
            "ms_first_token", "ms_total", "prompt_tokens", "reused_tokens", "target_passes", "prompt_lane")}
    fit["other_client_answered_first"] = fit.get("other_client_complete_ms", 1e12) < fit.get("ms", 0) - 500
    out["rewrite_within_budget"] = fit
    await a.close()
    await b.close()
    return out


async def cancelled(sock: Path, pid: int, settle_s: float) -> dict:
    """RSS before and after each kind of cancelled request (the goal: within 10 % of its start).
    "before" is read before the request's document is opened, so the document, its warm-up and the
    cancelled request's own cache and activations all count against it."""
    c = await connect(sock)
    body = SOURCE + "\n\ndef cancelled_{k}(items):\n    result = []\n    for item in items:\n        "
    rw_sel = "".join(f"    w{i:04d} = f(w{i - 1:04d}, {i % 97:2d}) + 1  # ok\n" for i in range(60))
    kinds = [  # (name, document text, method, params, seconds before the cancel)
        ("cold_completion_mid_prefill", body, "complete",
         lambda uri, t: {"uri": uri, "max_tokens": 8, "position": {"line": t.count("\n"), "character": 8}}, 0.3),
        ("rewrite_60_lines_mid_prefill", rw_sel, "rewrite",
         lambda uri, t: {"uri": uri, "instruction": "rename f to g", "max_tokens": 600,
                         "range": {"start": {"line": 0, "character": 0}, "end": {"line": 60, "character": 0}}}, 1.5),
        ("rewrite_60_lines_mid_decode", rw_sel, "rewrite",
         lambda uri, t: {"uri": uri, "instruction": "rename f to g", "max_tokens": 600,
                         "range": {"start": {"line": 0, "character": 0}, "end": {"line": 60, "character": 0}}}, 8.0),
    ]
    out: dict = {}
    for k, (name, text, method, params, after_s) in enumerate(kinds):
        await asyncio.sleep(settle_s)
        before = rss_mb(pid)
        uri = f"file:///soak/cancel{k}.py"
        text = text.replace("{k}", str(k))
        await c.request("document/open", {"uri": uri, "text": text, "version": 1, "language_id": "python"})
        msgid, fut = c.send_request(method, params(uri, text))
        await asyncio.sleep(after_s)
        peak = rss_mb(pid)
        res: dict = {"finished_before_cancel": fut.done()}
        if not fut.done():
            await c.request("cancel", {"id": msgid}, timeout=60)
        try:
            r = await asyncio.wait_for(fut, 120)
            res.update(cancelled=r["cancelled"], tokens=len(r.get("tokens") or []))
        except DaemonError as e:
            res.update(cancelled=e.code == -32800, error=f"{e.code}: {e.message}")
        await c.request("document/close", {"uri": uri})
        await asyncio.sleep(settle_s)
        after = rss_mb(pid)
        out[name] = {**res, "rss_before_mb": before, "rss_at_cancel_mb": peak, "rss_after_mb": after,
                     "after_over_before": round(after / before, 3)}
        print(f"  {name}: {out[name]}", flush=True)
    await c.close()
    out["worst_after_over_before"] = max(v["after_over_before"] for v in out.values())
    return out


async def main(a: argparse.Namespace) -> dict:
    from completiond.models.device import cpu_name

    tmp = Path(tempfile.mkdtemp(prefix="completiond-soak-"))
    sock = tmp / "d.sock"
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "MKL_NUM_THREADS": str(a.threads)}
    daemon_root = Path(a.checkout).resolve() if a.checkout else ROOT  # the code the daemon runs
    if a.checkout:
        env["PYTHONPATH"] = str(daemon_root)
    cmd = [sys.executable, "-m", "completiond", "serve", "--socket", str(sock), "--target", a.target,
           "--draft", a.draft, "--log-level", "WARNING", *a.serve_arg]
    log = open(tmp / "daemon.log", "wb")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=daemon_root)
    out: dict = {"target": a.target, "draft": a.draft, "threads": a.threads, "cpu": cpu_name(), "cpu_count": os.cpu_count(),
                 "loadavg_start": os.getloadavg(),  # other processes on the machine (the numbers are contended)
                 "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv),
                 "daemon_code": _commit(daemon_root)}
    try:
        st = await wait_ready(sock, proc, a.load_timeout)
        out["load_s"] = round(time.perf_counter() - t0, 1)
        out["daemon"] = {k: st.get(k) for k in ("target", "draft", "device", "dtype", "quant")}
        rss = {"ready": rss_mb(proc.pid)}
        c = await connect(sock)  # warm-up: the first completion pays one-time costs
        await c.request("document/open", {"uri": "file:///soak/warm.py", "text": SOURCE, "version": 1})
        await c.request("complete", {"uri": "file:///soak/warm.py", "max_tokens": a.max_tokens,
                                     "position": {"line": 10, "character": 0}}, timeout=600)
        await c.close()
        rss["warm"] = rss_mb(proc.pid)
        phases = [("storm", lambda: storm(sock, a.storm_s, a.rate, a.rounds, a.max_tokens)),
                  ("concurrent", lambda: concurrent(sock, a.clients, a.requests, a.max_tokens)),
                  ("big_document", lambda: big_document(sock, a.big_chars, a.edits, a.max_tokens)),
                  ("big_rewrite", lambda: big_rewrite(sock, a.max_tokens, a.rewrite_lines)),
                  ("cancelled", lambda: cancelled(sock, proc.pid, a.settle_s))]
        for name, run in [(n, r) for n, r in phases if n in a.phases.split(",")]:
            t = time.perf_counter()
            out[name] = await run()
            out[name]["phase_s"] = round(time.perf_counter() - t, 1)
            rss[f"after_{name}"] = rss_mb(proc.pid)
            print(f"{name}: {json.dumps(out[name])}", flush=True)
        out["rss_mb"] = rss
        out["loadavg_end"] = os.getloadavg()
        c = await connect(sock)
        await c.request("shutdown", {}, timeout=30)
        await c.close()
        out["daemon_exit"] = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
        log.close()
        out["daemon_log_tail"] = (tmp / "daemon.log").read_text(errors="replace")[-2000:]
    return out


def _commit(root: Path) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def cli() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-0.5b")
    ap.add_argument("--draft", default="none")
    ap.add_argument("--threads", type=int, default=1, help="OMP/MKL threads of the daemon")
    ap.add_argument("--storm-s", type=float, default=10.0, help="seconds of typing in all")
    ap.add_argument("--rate", type=float, default=200.0, help="keystrokes per second")
    ap.add_argument("--rounds", type=int, default=5, help="the storm is cut in this many bursts (one final answer each)")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=2, help="completions per concurrent client")
    ap.add_argument("--big-chars", type=int, default=4_000_000)
    ap.add_argument("--edits", type=int, default=3, help="edit + complete rounds on the big document")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--rewrite-lines", type=int, default=60, help="lines of the rewrite that fits the budget")
    ap.add_argument("--load-timeout", type=float, default=900.0)
    ap.add_argument("--serve-arg", action="append", default=[], help="extra `serve` argument (repeatable)")
    ap.add_argument("--phases", default="storm,concurrent,big_document,big_rewrite,cancelled",
                    help="comma-separated")
    ap.add_argument("--settle-s", type=float, default=2.0, help="idle seconds before each RSS reading of `cancelled`")
    ap.add_argument("--checkout", default=None, help="run the daemon from this checkout (an older commit, say)")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/soak-<model>.json)")
    a = ap.parse_args()
    out = asyncio.run(main(a))
    model = re.sub(r"[^\w.-]+", "_", Path(a.target).name)
    path = Path(a.out) if a.out else ROOT / "benchmarks" / "results" / f"soak-{model}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    s, bd = out.get("storm", {}), out.get("big_document", {})
    print(f"\n{out['cpu']}, {a.threads} thread(s), target {a.target}, draft {a.draft}")
    print(f"storm: final answer p50 {s.get('final_answer_after_last_keystroke', {}).get('p50_ms')} ms, "
          f"p95 {s.get('final_answer_after_last_keystroke', {}).get('p95_ms')} ms after the last keystroke; "
          f"{s.get('version_errors')} version errors, {s.get('cancelled')} cancelled, {s.get('other_errors')} other")
    print(f"concurrent: {out.get('concurrent', {}).get('latency')}")
    print(f"big document: change {bd.get('change')}, complete {bd.get('complete')}, "
          f"prompt tokens <= {bd.get('prompt_tokens_max')}")
    print(f"2,000-line rewrite: {out.get('big_rewrite')}")
    print(f"RSS MB: {out.get('rss_mb')}\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(cli())
