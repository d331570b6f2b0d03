"""Keystroke replay through a real daemon: type lines character by character, a completion request
per keystroke (the newer cancels the older), and measure time to the first streamed token.

Run twice, with prefix reuse (the daemon's default: only the new tokens are prefilled) and without
(each request prefills its whole prompt), on the same lines at the same typing rate.

Then the quality a user sees (`shown`), once per open pause: at each of the bench's positions the file
is opened without the line's code before the cursor, left open for the pause (the daemon warms up),
and that code is typed up to the cursor (a line-start cursor: Enter at the end of the line above, the
indentation with it, as editors indent). The suggestion streamed for the last keystroke is what the
editor shows; it is scored as the bench scores the engine (repo.score) against the same reference.
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
from .repo import Cursor, read_text_file, score

CHAR_INTERVAL_S = 0.12  # ~100 words per minute
READY_TIMEOUT_S = 900.0  # a first start converts the model (minutes on 2 cores)
OPEN_PAUSES_S = (2.0, 30.0)  # seconds a file is open before typing starts (`shown`, --replay-open-pause)


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



def daemon_failed(e: Exception, log: Path) -> RuntimeError:
    """The benchmark daemon's failure `e`, with its own last words from `log` saying why."""
    tail = log.read_text(errors="replace").strip().splitlines()[-3:]
    return RuntimeError(f"the benchmark daemon: {e}" + (f" ({' / '.join(tail)})" if tail else ""))

def typing_plan(pos: Cursor, text: str) -> tuple[str, tuple[int, int], list[str]]:
    """What the user types to reach `pos`'s cursor: (the document as opened, where typing starts as
    (line, UTF-16 column), the keystrokes). The reference is gone from the document (Cursor.document);
    mid-line, the code between the indentation and the cursor is typed a character a keystroke;
    at a line's start, one keystroke: Enter at the end of the line above, with the indentation."""
    doc, cursor = pos.document(text)
    line_start = cursor - pos.col
    head = doc[line_start:cursor]
    indent = len(head) - len(head.lstrip())
    if pos.col > indent or pos.line == 0:  # (the first line's start: nothing to type, one request)
        start = line_start + indent
        return doc[:start] + doc[cursor:], (pos.line, _utf16(doc[line_start:start])), list(doc[start:cursor])
    start = line_start - 1  # the newline that ends the line above
    above = doc[doc.rfind("\n", 0, start) + 1:start]
    return doc[:start] + doc[cursor:], (pos.line - 1, _utf16(above)), [doc[start:cursor]]


def _utf16(s: str) -> int:
    return len(s.encode("utf-16-le")) // 2


async def _shown(client: Client, uri: str, pos: Cursor, text: str, pause_s: float, max_tokens: int,
                 multiline: bool) -> dict:
    """Open, pause, type up to the cursor (`typing_plan`), one request per keystroke; the last
    keystroke's answer: its streamed text (what the editor shows), lane, ms to its first token."""
    doc, (line, col), keys = typing_plan(pos, text)
    await client.request("document/open", {"uri": uri, "text": doc, "version": 0})
    await client.notify("document/cursor", {"uri": uri, "position": {"line": line, "character": col}})
    await asyncio.sleep(pause_s)
    streamed: dict[int, list[str]] = {}  # msgid -> the text increments, in order
    firsts: dict[int, float] = {}

    def on_partial(p: dict) -> None:
        firsts.setdefault(p["id"], time.perf_counter())
        streamed.setdefault(p["id"], []).append(p["text"])

    unsubscribe = client.on("complete/partial", on_partial)
    pending: list[tuple[float, int, asyncio.Future]] = []
    for version, key in enumerate(keys or [""], 1):  # no keys: the one request at the cursor
        if key:
            await client.request("document/change", {"uri": uri, "version": version, "changes": [{
                "range": {"start": {"line": line, "character": col}, "end": {"line": line, "character": col}},
                "text": key}]})
        if "\n" in key:
            line, col = line + key.count("\n"), _utf16(key.rsplit("\n", 1)[-1])
        else:
            col += _utf16(key)
        t0 = time.perf_counter()
        msgid, fut = client.send_request("complete", {"uri": uri, "position": {"line": line, "character": col},
                                                      "max_tokens": max_tokens, "multiline": multiline})
        pending.append((t0, msgid, fut))
        if version < len(keys):
            await asyncio.sleep(CHAR_INTERVAL_S)
    results = await asyncio.gather(*(f for _, _, f in pending), return_exceptions=True)
    unsubscribe()
    await client.request("document/close", {"uri": uri})
    t0, msgid, _ = pending[-1]
    last = results[-1] if isinstance(results[-1], dict) else {}
    return {"shown": "".join(streamed.get(msgid, [])), "text": last.get("text"), "lane": last.get("prompt_lane"),
            "final_ms": (firsts[msgid] - t0) * 1000 if msgid in firsts else None, "keystrokes": len(keys),
            # the daemon's account of that time: waiting for the engine, indexing + prompt, then its first token
            "daemon_ms": {k: last.get(k) for k in ("ms_waited", "ms_prepared", "ms_first_token")},
            "reused_tokens": last.get("reused_tokens"), "served_tokens": last.get("served_tokens"),
            "error": None if isinstance(results[-1], dict) else repr(results[-1])}


def shown_summary(rows: list[dict], pause_s: float, engine: dict | None = None) -> dict:
    """`keystroke_replay.shown[S]`: the shown suggestions' scores (repo.score, averaged), which lane
    answered the last keystroke, its ms to the first streamed token; beside the engine's scores on the
    same positions (`engine`: exact_line, edit_sim) when given."""
    scores = [score(r["shown"], r["reference"]) for r in rows]
    final = [r["final_ms"] for r in rows if r["final_ms"] is not None]
    lanes = {"quick": 0, "full": 0}
    for r in rows:
        if r["lane"] in lanes:
            lanes[r["lane"]] += 1
    out = {"open_pause_s": pause_s, "positions": len(rows),
           "exact_line": round(sum(s["exact"] for s in scores) / len(rows), 3) if rows else None,
           "edit_sim": round(sum(s["similarity"] for s in scores) / len(rows), 3) if rows else None,
           "lanes": lanes, "p50_final_keystroke_ms": _p(final, 50), "p95_final_keystroke_ms": _p(final, 95),
           "answered": len(final)}
    if engine and rows:  # shown over engine: 1.0 = the user sees the bench's quality
        out["vs_engine"] = {k: round(out[k] / engine[k], 3) if engine[k] else None for k in ("exact_line", "edit_sim")}
    out["rows"] = [{**{k: r.get(k) for k in ("position", "lane", "final_ms", "keystrokes", "reference", "shown",
                                                "daemon_ms", "reused_tokens", "served_tokens")},
                    "exact": s["exact"], "edit_sim": round(s["similarity"], 3)} for r, s in zip(rows, scores)]
    for row in out["rows"]:
        row["final_ms"] = round(row["final_ms"], 1) if row["final_ms"] is not None else None
    return out


def replay(a, root: Path, positions: list[Cursor], engine: dict | None = None) -> dict:
    """Start a daemon with the bench's model flags, wait until it is ready (not only bound: a loading
    daemon's status has no scheduler yet), replay the lines twice (reuse on / off), then the shown
    suggestions after each open pause (a.replay_open_pause, default OPEN_PAUSES_S). engine: the
    engine's scores on the same positions (exact_line, edit_sim), kept beside them."""
    with tempfile.TemporaryDirectory() as tmp:
        sock = Path(tmp) / "bench.sock"
        cmd = [sys.executable, "-m", "completiond", "serve", "--socket", str(sock), "--target", a.target,
               "--draft", a.draft, "--dtype", a.dtype, "--device", a.device, "--quant", a.quant,
               "--log-level", "WARNING"]
        log = open(Path(tmp) / "daemon.log", "wb")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
        try:
            pauses = getattr(a, "replay_open_pause", None) or list(OPEN_PAUSES_S)
            return asyncio.run(_replay(sock, positions, a.max_tokens, proc, pauses, not a.single_line, engine,
                                       reuse_runs=() if getattr(a, "replay_shown_only", False) else (True, False)))
        except (RuntimeError, TimeoutError) as e:
            raise daemon_failed(e, Path(tmp) / "daemon.log") from None
        finally:
            proc.terminate()
            proc.wait(timeout=60)
            log.close()


def _p(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)), 1) if xs else None


async def _replay(sock: Path, positions: list[Cursor], max_tokens: int, proc: subprocess.Popen,
                  pauses: list[float] = (), multiline: bool = True, engine: dict | None = None,
                  reuse_runs: tuple[bool, ...] = (True, False)) -> dict:
    await wait_ready(sock, proc, READY_TIMEOUT_S)
    client = await Client.connect(sock)
    await client.request("initialize", {"client": "bench", "protocol": 1})
    deadline = time.time() + 600
    while (st := await client.request("status", {}))["state"] == "loading" and time.time() < deadline:
        await asyncio.sleep(0.2)  # the pass-cost table it starts with is known once the models are in
    out = {"char_interval_ms": CHAR_INTERVAL_S * 1000, "lines": len(positions), "target": st.get("target"),
           "pass_costs_start": st.get("pass_costs")}
    for reuse in reuse_runs:  # the keystroke-latency runs (bench --replay-shown-only: none)
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
    if engine is not None:
        out["engine"] = engine
    out["shown"] = {}
    for pause in pauses:  # keyed by the pause in seconds ("2", "30")
        rows = []
        for i, pos in enumerate(positions):
            r = await _shown(client, f"bench://shown/{pause:g}/{i}/{pos.file.name}", pos, read_text_file(pos.file) or "",
                             pause, max_tokens, multiline)
            rows.append({**r, "position": i, "reference": pos.reference})
        out["shown"][f"{pause:g}"] = shown_summary(rows, pause, engine)
    end = await client.request("status", {})
    if end.get("target") != out["target"]:  # a background upgrade: the rows would mix two models
        raise RuntimeError(f"the replay's daemon switched from {out['target']} to {end.get('target')} mid-run")
    out["pass_costs"] = end.get("pass_costs")  # the table it ended with
    await client.close()
    return out
