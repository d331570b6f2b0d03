"""Keystroke replay through a real daemon: type lines character by character, a completion request
per keystroke (the newer cancels the older), and measure time to the first streamed token.

Run twice, with prefix reuse (the daemon's default: only the new tokens are prefilled) and without
(each request prefills its whole prompt), on the same lines at the same typing rate.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ..daemon_cli import wait_ready
from ..service.client import Client
from .repo import Cursor, read_text_file

CHAR_INTERVAL_S = 0.12  # ~100 words per minute
READY_TIMEOUT_S = 900.0  # a first start converts the model (minutes on 2 cores)


async def _type_line(client: Client, uri: str, pos: Cursor, text: str, reuse: bool, max_tokens: int,
                     pause_s: float = 0.0, cursor: bool = False, accept: bool = False) -> dict:
    """pause_s: the user looks at the freshly opened file this long before typing (warm-up time);
    cursor: the editor says where its cursor rests (`document/cursor`, as both editor plugins do);
    accept: after the last keystroke's suggestion, the user accepts it (Tab: the text is inserted)
    and the editor asks again at the new cursor: ms to that request's first token."""
    doc, offset = pos.document(text)
    await client.request("document/open", {"uri": uri, "text": doc, "version": 0})
    if cursor:
        await client.notify("document/cursor", {"uri": uri, "position": {"line": pos.line, "character": pos.col}})
    await asyncio.sleep(pause_s)
    # what the warm-up got done in the pause: jobs still queued or running (a warm-up), the full prompt's cache
    st = await client.request("status", {})
    at_first_key = {"jobs_waiting": st["scheduler"]["waiting"], **(st.get("warm", {}).get(uri) or {})}
    line, col = pos.line, pos.col
    ttft, final, superseded, version = [], [], 0, 0
    pending: list[tuple[float, asyncio.Future, dict]] = []
    firsts: dict[int, float] = {}
    unsubscribe = client.on("complete/partial", lambda p: firsts.setdefault(p["id"], time.perf_counter()))
    for ch in pos.reference:
        version += 1
        await client.request("document/change", {"uri": uri, "version": version, "changes": [{
            "range": {"start": {"line": line, "character": col}, "end": {"line": line, "character": col}},
            "text": ch}]})
        col += len(ch.encode("utf-16-le")) // 2
        t0 = time.perf_counter()
        msgid, fut = client.send_request("complete", {"uri": uri, "position": {"line": line, "character": col},
                                                      "max_tokens": max_tokens, "reuse_prefix": reuse})
        pending.append((t0, fut, {"id": msgid}))
        await asyncio.sleep(CHAR_INTERVAL_S)
    results = await asyncio.gather(*(f for _, f, _ in pending), return_exceptions=True)
    served = sum(r.get("served_tokens", 0) > 0 for r in results if isinstance(r, dict))
    for i, ((t0, _, meta), res) in enumerate(zip(pending, results)):
        if meta["id"] in firsts:
            ttft.append((firsts[meta["id"]] - t0) * 1000)
            if i == len(pending) - 1:  # the user stopped typing: this one is never superseded
                final.append(ttft[-1])
        elif isinstance(res, dict) and res.get("cancelled"):
            superseded += 1
    out = {"ttft": ttft, "final": final, "superseded": superseded, "requests": len(pending), "served": served}
    answered = [firsts[m["id"]] for _, _, m in pending if m["id"] in firsts]
    if pending and answered:  # the file's first ghost text, from the first keystroke (the user's first wait)
        first = min(answered)
        out["first_answer_ms"] = (first - pending[0][0]) * 1000
        i = next(i for i, (_, _, m) in enumerate(pending) if firsts.get(m["id"]) == first)
        res = results[i] if isinstance(results[i], dict) else {}
        out["first_answer"] = {"keystroke": i, **at_first_key, **{k: res.get(k) for k in (
            "ms_first_token", "prompt_lane", "prompt_tokens", "reused_tokens", "target_passes")}}
    # typed through the suggestion: the daemon's own time to the served text (no pass before it)
    out["served_ms"] = [r["ms_first_token"] for r in results if isinstance(r, dict) and r.get("served_tokens", 0) > 0]
    out["lanes"] = [r.get("prompt_lane", "full") for r in results if isinstance(r, dict) and not r.get("cancelled")]
    last = results[-1] if results else None
    if accept and isinstance(last, dict) and last.get("text"):
        out.update(await _accept(client, uri, version, line, col, last["text"], reuse, max_tokens, firsts))
    unsubscribe()
    await client.request("document/close", {"uri": uri})
    return out


async def _accept(client: Client, uri: str, version: int, line: int, col: int, suggestion: str, reuse: bool,
                  max_tokens: int, firsts: dict[int, float]) -> dict:
    """Insert the suggestion at the cursor (the editor's accept), then ask at the cursor after it."""
    await client.request("document/change", {"uri": uri, "version": version + 1, "changes": [{
        "range": {"start": {"line": line, "character": col}, "end": {"line": line, "character": col}},
        "text": suggestion}]})
    tail = suggestion.rsplit("\n", 1)[-1]
    line, col = line + suggestion.count("\n"), (col if "\n" not in suggestion else 0) + len(tail.encode("utf-16-le")) // 2
    t0 = time.perf_counter()
    msgid, fut = client.send_request("complete", {"uri": uri, "position": {"line": line, "character": col},
                                                  "max_tokens": max_tokens, "reuse_prefix": reuse})
    res = await fut
    t1 = firsts.get(msgid, time.perf_counter())  # no partial: an empty answer, timed at its arrival
    return {"after_accept_ms": (t1 - t0) * 1000, "after_accept_passes": res.get("target_passes", 0),
            "after_accept_served": res.get("served_tokens", 0) > 0}


def replay(a, root: Path, positions: list[Cursor]) -> dict:
    """Start a daemon with the bench's model flags, wait until it is ready (not only bound: a loading
    daemon's status has no scheduler yet), replay the lines twice (reuse on / off)."""
    with tempfile.TemporaryDirectory() as tmp:
        sock = Path(tmp) / "bench.sock"
        cmd = [sys.executable, "-m", "completiond", "serve", "--socket", str(sock), "--target", a.target,
               "--draft", a.draft, "--dtype", a.dtype, "--device", a.device, "--log-level", "WARNING"]
        log = open(Path(tmp) / "daemon.log", "wb")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
        try:
            return asyncio.run(_replay(sock, positions, a.max_tokens, proc))
        except (RuntimeError, TimeoutError) as e:  # the daemon's own last words say why
            tail = (Path(tmp) / "daemon.log").read_text(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"the benchmark daemon: {e}" + (f" ({' / '.join(tail)})" if tail else "")) from None
        finally:
            proc.terminate()
            proc.wait(timeout=60)
            log.close()


def _p(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)), 1) if xs else None


async def _replay(sock: Path, positions: list[Cursor], max_tokens: int, proc: subprocess.Popen) -> dict:
    await wait_ready(sock, proc, READY_TIMEOUT_S)
    client = await Client.connect(sock)
    await client.request("initialize", {"client": "bench", "protocol": 1})
    deadline = time.time() + 600
    while (st := await client.request("status", {}))["state"] == "loading" and time.time() < deadline:
        await asyncio.sleep(0.2)  # the pass-cost table it starts with is known once the models are in
    out = {"char_interval_ms": CHAR_INTERVAL_S * 1000, "lines": len(positions),
           "pass_costs_start": st.get("pass_costs")}
    for reuse in (True, False):
        ttft, final, superseded, requests = [], [], 0, 0
        for i, pos in enumerate(positions):
            text = read_text_file(pos.file) or ""
            r = await _type_line(client, f"bench://replay/{i}/{reuse}", pos, text, reuse, max_tokens)
            ttft += r["ttft"]
            final += r["final"]
            superseded += r["superseded"]
            requests += r["requests"]
        key = "with_prefix_reuse" if reuse else "without_prefix_reuse"
        out[key] = {"p50_first_token_ms": _p(ttft, 50), "p95_first_token_ms": _p(ttft, 95),
                    "p50_final_keystroke_first_token_ms": _p(final, 50),
                    "p95_final_keystroke_first_token_ms": _p(final, 95),
                    "requests": requests, "answered_with_tokens": len(ttft),
                    "cancelled_before_first_token": superseded}
    out["pass_costs"] = (await client.request("status", {})).get("pass_costs")  # the table it ended with
    await client.close()
    return out
