"""`bench --via infill`: the bench's positions asked through a real daemon's `/infill` as llama.vim asks,
and through the wire `complete` as completiond-lsp asks, on one daemon; scored alike.

llama.vim (ggml-org/llama.vim autoload/llama.vim): `llama#fim` sends the 256 lines before the cursor
(`input_prefix`), the line up to the cursor (`prompt`) and the rest of it plus 64 lines (`input_suffix`),
`n_predict` 128, `t_max_prompt_ms` 500, `t_max_predict_ms` 250 for a position's first request (1000
for the speculative follow-up), `n_indent` the line's indentation; a line of blanks is sent empty.
After a cursor jump it queues chunks of the lines above and below its window (`s:pick_chunk`, half
of `ring_chunk_size` 64 lines, within `ring_scope` 1024 lines), which `s:ring_update` sends as a
context update (`n_predict` 0) and every later request carries in `input_extra`.

Per position (the bench's sampler, on lines at or beyond --min-line so llama.vim's window starts
inside the file): the file opened on the wire with the cursor's place (`document/cursor`, as the
editor plugins send it), a ring update with the position's two chunks, then the position through
both paths, alternating which goes first; with --infill-idle S, both again after S seconds idle (the
warm-up had its turn). The `/infill` answer is scored as llama.vim shows it (`s:fim_render`: on a
line of blanks the suggestion's first line loses as many leading blanks as the line has), the LSP
answer as the editor inserts it; both with repo.score against the removed text. Latency: wall ms per
request (HTTP: a new connection per request, as curl makes one).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import http.client
import json
import os
import random
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .replay import daemon_failed
from .repo import Cursor, read_text_file, score

N_PREFIX, N_SUFFIX = 256, 64  # llama.vim's n_prefix, n_suffix (lines)
N_PREDICT = 128  # llama.vim's n_predict
RING_SCOPE, RING_CHUNK = 1024, 64  # llama.vim's ring_scope, ring_chunk_size (lines)
# llama.vim's own response_fields, and ours (a client may ask for any field of the answer)
FIELDS = ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
          "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
          "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated", "tokens_cached"]
OURS = ["tokens_evaluated", "completiond/document", "completiond/prompt_lane", "completiond/reused_tokens",
        "completiond/prompt_tokens", "completiond/stopped_by", "completiond/cancelled", "completiond/extra_chunks"]
READY_TIMEOUT_S = 1800.0  # a first start converts the model (minutes on 2 cores)


# ---- llama.vim's requests -------------------------------------------------------------------------------
def fim_ctx_local(lines: list[str], line: int, col: int | None = None, prev: list[str] | None = None) -> dict:
    """s:fim_ctx_local at 0-based `line` (cursor at `col`, default the line's end): {prefix, middle,
    suffix, indent}. `prev`: a suggestion (its lines) shown at the cursor: the context as if accepted."""
    cur = lines[line]
    if not prev:
        col = len(cur) if col is None else col
        mid, rest = cur[:col], cur[col:]
        before = lines[max(0, line - N_PREFIX):line]
        if not cur.strip():
            mid, rest, indent = "", "", 0
        else:
            indent = len(cur) - len(cur.lstrip())
    else:
        cur = cur + prev[0] if len(prev) == 1 else prev[-1]
        mid, rest, indent = cur, "", 0
        before = lines[max(0, line - N_PREFIX + len(prev) - 1):line]
        if len(prev) > 1:
            before = before + [lines[line] + prev[0]] + prev[1:-1]
    after = lines[line + 1:line + 1 + N_SUFFIX]
    return {"prefix": "\n".join(before) + "\n", "middle": mid, "suffix": rest + "\n" + "\n".join(after) + "\n",
            "indent": indent}


def fim_request(ctx: dict, extra: list[dict], first: bool = True) -> dict:
    """llama#fim's request body (with our answer fields asked for beside llama.vim's)."""
    return {"id_slot": 0, "input_prefix": ctx["prefix"], "input_suffix": ctx["suffix"], "input_extra": extra,
            "prompt": ctx["middle"], "n_predict": N_PREDICT, "stop": [], "n_indent": ctx["indent"], "top_k": 40,
            "top_p": 0.90, "samplers": ["top_k", "top_p", "infill"], "stream": False, "cache_prompt": True,
            "t_max_prompt_ms": 500, "t_max_predict_ms": 250 if first else 1000, "response_fields": FIELDS + OURS}


def ring_request(extra: list[dict]) -> dict:
    """s:ring_update's request body: a context update, nothing generated."""
    return {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": extra, "prompt": "",
            "n_predict": 0, "temperature": 0.0, "samplers": [], "stream": False, "cache_prompt": True,
            "t_max_prompt_ms": 1, "t_max_predict_ms": 1, "response_fields": [""]}


def chunk(lines: list[str], start: int, filename: str, t: float = 1.0) -> dict:
    """A ring chunk (s:pick_chunk): RING_CHUNK // 2 lines from `start`, "\\n"-joined and ended."""
    return {"text": "\n".join(lines[start:start + RING_CHUNK // 2]) + "\n", "time": t, "filename": filename}


def jump_chunks(lines: list[str], line: int, filename: str, rng: random.Random) -> list[dict]:
    """The chunks llama#fim queues after a jump to `line`: one from the lines above its window (within
    ring_scope), one from those below it; a random start in each, as s:pick_chunk picks."""
    out = []
    for lo, hi in ((max(0, line - RING_SCOPE), max(0, line - N_PREFIX)),
                   (min(len(lines), line + N_SUFFIX), min(len(lines), line + N_SUFFIX + RING_CHUNK))):
        if hi - lo >= RING_CHUNK // 4:  # s:pick_chunk skips tiny ranges
            out.append(chunk(lines, rng.randrange(lo, max(lo + 1, hi - RING_CHUNK // 2)), filename, time.time()))
    return out


def shown(text: str, line_blanks: int | None) -> str:
    """What llama.vim shows of an /infill answer: on a line of `line_blanks` blanks (None: a line with
    code), the first line's leading blanks up to that many are the line's own (s:fim_render)."""
    if line_blanks is None:
        return text
    first = text.split("\n", 1)[0]
    return text[min(len(first) - len(first.lstrip()), line_blanks):]


# ---- one daemon, both paths -----------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, token: str, path: str, body: dict, timeout: float = 900.0) -> tuple[float, int, dict]:
    """(wall ms, status, answer) of one request on a new connection."""
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Authorization": f"Bearer {token}",
                                                                   "Content-Type": "application/json"})
        r = conn.getresponse()
        out = json.loads(r.read() or b"{}")
    finally:
        conn.close()
    return (time.perf_counter() - t0) * 1e3, r.status, out


async def _ask(client, port: int, token: str, path: str, uri: str, doc: str, offset: int, body: dict,
               blanks: int | None, max_tokens: int) -> dict:
    """One suggestion through `path` ("infill" or "lsp"): its text as shown, ms, lane, prompt tokens."""
    if path == "infill":
        ms, status, out = await asyncio.to_thread(post, port, token, "/infill", body)
        if status != 200:
            raise RuntimeError(f"/infill answered {status}: {out}")
        text = shown(out.get("content", ""), blanks)
        lane, ptok, how = out.get("completiond/prompt_lane"), out.get("tokens_evaluated"), out.get("completiond/document")
    else:
        line, col = doc[:offset].count("\n"), offset - (doc.rfind("\n", 0, offset) + 1)
        t0 = time.perf_counter()
        res = await client.request("complete", {"uri": uri, "position": {"line": line, "character": col},
                                                "max_tokens": max_tokens, "multiline": True}, timeout=900)
        ms = (time.perf_counter() - t0) * 1e3
        text, lane, ptok, how = res.get("text", ""), res.get("prompt_lane"), res.get("prompt_tokens"), uri
    return {"text": text, "ms": round(ms, 1), "lane": lane, "prompt_tokens": ptok, "document": how}


async def _run(sock: Path, port: int, token_file: Path, proc: subprocess.Popen, root: Path,
               positions: list[Cursor], max_tokens: int, idle_s: float, seed: int) -> tuple[dict, list[dict]]:
    from ..daemon_cli import wait_ready
    from ..service.client import Client

    st = await wait_ready(sock, proc, READY_TIMEOUT_S)
    token = token_file.read_text().strip()
    client = await Client.connect(sock)
    await client.request("initialize", {"client": "bench", "protocol": 1, "position_encoding": "utf-32"})
    rng = random.Random(seed)
    phases = ["cold"] + (["after_idle"] if idle_s > 0 else [])
    rows = []
    for k, p in enumerate(positions):
        text = read_text_file(p.file) or ""
        doc, offset = p.document(text)
        lines = doc.splitlines()
        uri = f"file://{p.file}"
        await client.request("document/open", {"uri": uri, "text": doc, "version": 1})
        # where the cursor rests (completiond-lsp's completiond/cursor, as the editor plugins send it):
        # the daemon warms there, not at the document's end
        await client.notify("document/cursor", {"uri": uri, "position": {"line": p.line, "character": p.col}})
        cur = lines[p.line]
        blanks = len(cur) if not cur.strip() else None  # llama.vim sends such a line empty
        extra = jump_chunks(lines, p.line, p.file.name, rng)
        _, status, _ = await asyncio.to_thread(post, port, token, "/infill", ring_request(extra))
        body = fim_request(fim_ctx_local(lines, p.line, p.col), extra)
        row = {"file": str(p.file.relative_to(root)), "line": p.line, "kind": p.kind, "reference": p.reference,
               "ring_status": status, "loadavg_1m": round(os.getloadavg()[0], 2)}
        for phase in phases:
            if phase == "after_idle":
                await asyncio.sleep(idle_s)
            order = ["infill", "lsp"] if (k + (phase != "cold")) % 2 == 0 else ["lsp", "infill"]
            for path in order:
                got = await _ask(client, port, token, path, uri, doc, offset, body, blanks, max_tokens)
                s = score(got["text"], p.reference)
                row[f"{path}_{phase}"] = {**got, "exact": s["exact"], "exact_middle": s["exact_middle"],
                                          "edit_sim": round(s["similarity"], 3)}
        await client.request("document/close", {"uri": uri})
        rows.append(row)
        print(f"[{k + 1}/{len(positions)}] {row['file']}:{p.line + 1} " + "  ".join(
            f"{key} {'=' if v['exact'] else 'x'} {v['ms']:.0f} ms {v['lane']}" for key, v in row.items()
            if isinstance(v, dict)), file=sys.stderr, flush=True)
    await client.close()
    return st, rows


def _p(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)), 1) if xs else None


def summarize(rows: list[dict], key: str) -> dict:
    """One path and phase over the rows: quality (repo.score averaged) and ms per suggestion."""
    got = [r[key] for r in rows]
    n = len(got)
    lanes: dict[str, int] = {}
    for g in got:
        lanes[str(g["lane"])] = lanes.get(str(g["lane"]), 0) + 1
    return {"exact_line": round(sum(g["exact"] for g in got) / n, 3),
            "exact_middle": round(sum(g["exact_middle"] for g in got) / n, 3),
            "edit_similarity": round(statistics.mean(g["edit_sim"] for g in got), 3),
            "p50_ms": _p([g["ms"] for g in got], 50), "p95_ms": _p([g["ms"] for g in got], 95),
            "lanes": lanes, "mean_prompt_tokens": round(statistics.mean(g["prompt_tokens"] or 0 for g in got), 1)}


def run_infill(a: argparse.Namespace, root: Path, label: str, positions: list[Cursor]) -> dict:
    """Start `serve --socket --http` with the bench's model flags, ask every position through both
    paths, and return the JSON summary: per phase, each path's scores and latency, their difference,
    how often the two first lines agree, the machine and its load."""
    from ..models.device import cpu_features, cpu_name

    idle_s = a.infill_idle
    load_before = os.getloadavg()
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        sock, token_file, port = Path(tmp) / "bench.sock", Path(tmp) / "token", free_port()
        cmd = [sys.executable, "-m", "completiond", "serve", "--socket", str(sock), "--http", f"127.0.0.1:{port}",
               "--token-file", str(token_file), "--target", a.target, "--draft", a.draft, "--dtype", a.dtype,
               "--device", a.device, "--quant", a.quant, "--backend", a.backend, "--log-level", "WARNING"]
        log = open(Path(tmp) / "daemon.log", "wb")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
        try:
            st, rows = asyncio.run(_run(sock, port, token_file, proc, root, positions, a.max_tokens, idle_s, a.seed))
        except (RuntimeError, TimeoutError, ConnectionError) as e:
            raise daemon_failed(e, Path(tmp) / "daemon.log") from None
        finally:
            proc.terminate()
            proc.wait(timeout=60)
            log.close()
    phases = {}
    for phase in ["cold"] + (["after_idle"] if idle_s > 0 else []):
        inf, lsp = summarize(rows, f"infill_{phase}"), summarize(rows, f"lsp_{phase}")
        same = sum(r[f"infill_{phase}"]["text"].split("\n", 1)[0] == r[f"lsp_{phase}"]["text"].split("\n", 1)[0]
                   for r in rows)
        phases[phase] = {"infill": inf, "lsp": lsp,
                         "exact_line_infill_minus_lsp": round(inf["exact_line"] - lsp["exact_line"], 3),
                         "same_first_line": round(same / len(rows), 3)}
    nice = os.nice(0)
    return {
        "repo": label, "via": "infill", "date": datetime.date.today().isoformat(),
        "command": "completiond " + " ".join(shlex.quote(x) for x in sys.argv[1:]),
        "machine": f"{os.cpu_count()} cores, {cpu_name()} ({' '.join(cpu_features()) or 'no AVX2'})",
        # the machine is shared: the load average (1, 5, 15 min) before and after, and per position
        "load": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()],
                 "mean_1m_per_position": round(statistics.mean(r["loadavg_1m"] for r in rows), 2),
                 "nice": nice, "wall_s": round(time.time() - t0, 1)},
        "target": st.get("target"), "draft": st.get("draft"), "device": st.get("device"),
        "positions": len(rows), "min_line": a.min_line, "max_tokens_lsp": a.max_tokens, "n_predict_infill": N_PREDICT,
        "idle_s": idle_s, "phases": phases, "rows": rows,
    }


def table(summary: dict) -> str:
    lines = [f"{summary['repo']}: {summary['positions']} positions (lines >= {summary['min_line']}), "
             f"{summary['target']}, {summary['machine']}, load {summary['load']['mean_1m_per_position']}",
             f"{'phase':<12}{'path':<8}{'exact':>7}{'edit sim':>9}{'p50 ms':>9}{'p95 ms':>9}  lanes"]
    for phase, ph in summary["phases"].items():
        for path in ("infill", "lsp"):
            r = ph[path]
            lines.append(f"{phase:<12}{path:<8}{r['exact_line']:>7.3f}{r['edit_similarity']:>9.3f}"
                         f"{r['p50_ms']:>9.1f}{r['p95_ms']:>9.1f}  {r['lanes']}")
        lines.append(f"{'':<12}/infill - LSP exact line {ph['exact_line_infill_minus_lsp']:+.3f}, "
                     f"same first line {ph['same_first_line']:.3f}")
    return "\n".join(lines)
