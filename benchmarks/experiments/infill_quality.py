"""Suggestion quality through llama.vim's `/infill` vs the editors' own path (the wire `complete`, what
completiond-lsp sends), on one daemon, at the same positions.

Positions: `completiond bench`'s sampler (bench/repo.py: code lines, the rest of the line removed,
cursor at the line's start or mid-line) over installed packages, on lines beyond 256 (llama.vim's
window then starts inside the file). Each position is asked twice per path, alternating which path
goes first:
  cold  the first request of the position (a new document on the wire; through HTTP the request as
        llama.vim sends it: 256 lines before, the line up to the cursor, the rest + 64 lines after,
        t_max_predict_ms 250, n_indent the line's indentation)
  warm  the same request after the daemon was idle for --idle seconds (the warm-up had its turn)
Scored as `bench` scores: exact line (the completion's first line is the removed text), edit
similarity; an /infill answer as llama.vim shows it (s:fim_render: on a line of blanks, which
llama.vim sends as an empty line, the suggestion's first line loses as many leading blanks as the
line has). Latency: wall ms per request (HTTP: a new connection per request, as curl makes).

    python -m benchmarks.experiments infill_quality --packages jinja2,requests --positions 16 \
        --out benchmarks/results/infill-quality.json
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import site
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.daemon_util import stop_daemon, wait_for_socket, wait_ready

from completiond.bench.repo import read_text_file, sample_positions, score  # noqa: E402
from completiond.service.client import Client  # noqa: E402

N_PREFIX, N_SUFFIX = 256, 64


def window(doc: str, offset: int) -> dict:
    """llama.vim's s:fim_ctx_local for a cursor at `offset` of `doc`."""
    lines = doc.splitlines()
    y = doc[:offset].count("\n")
    x = offset - (doc.rfind("\n", 0, offset) + 1)
    cur = lines[y]
    mid, rest = (cur[:x], cur[x:]) if cur.strip() else ("", "")
    indent = len(cur) - len(cur.lstrip()) if cur.strip() else 0
    return {"input_prefix": "\n".join(lines[max(0, y - N_PREFIX):y]) + "\n", "prompt": mid,
            "input_suffix": rest + "\n" + "\n".join(lines[y + 1:y + 1 + N_SUFFIX]) + "\n", "n_indent": indent}


def shown(text: str, line_blanks: int | None) -> str:
    """What llama.vim shows of an /infill answer: on a line of `line_blanks` blanks (None: a line with
    code), the first line's leading blanks up to that many are the line's own (s:fim_render)."""
    if line_blanks is None:
        return text
    first = text.split("\n", 1)[0]
    return text[min(len(first) - len(first.lstrip()), line_blanks):]


def cpu_name() -> str:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "?")
    flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), [])
    isa = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16") if f in flags]
    import os
    return f"{name}, {os.cpu_count()} cores, {'/'.join(isa)}; shared with other agents' jobs"


def infill(port: int, token: str, w: dict, max_tokens: int) -> tuple[float, dict]:
    body = {"id_slot": 0, **w, "input_extra": [], "n_predict": max_tokens, "stop": [], "top_k": 40, "top_p": 0.90,
            "samplers": ["top_k", "top_p", "infill"], "stream": False, "cache_prompt": True, "t_max_prompt_ms": 500,
            "t_max_predict_ms": 250}
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    conn.request("POST", "/infill", body=json.dumps(body), headers={"Authorization": f"Bearer {token}",
                                                                    "Content-Type": "application/json"})
    out = json.loads(conn.getresponse().read())
    conn.close()
    return (time.perf_counter() - t0) * 1e3, out


async def wire(c: Client, uri: str, doc: str, offset: int, max_tokens: int) -> tuple[float, dict]:
    line = doc[:offset].count("\n")
    char = offset - (doc.rfind("\n", 0, offset) + 1)
    t0 = time.perf_counter()
    res = await c.request("complete", {"uri": uri, "position": {"line": line, "character": char},
                                       "max_tokens": max_tokens, "multiline": True}, timeout=900)
    return (time.perf_counter() - t0) * 1e3, res


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--packages", default="jinja2,requests", help="comma list of installed packages")
    ap.add_argument("--positions", type=int, default=16, help="per package")
    ap.add_argument("--min-line", type=int, default=N_PREFIX, help="positions on this 0-based line or later")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--idle", type=float, default=20.0, help="seconds idle before the warm request")
    ap.add_argument("--target", default="qwen2.5-coder-0.5b")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    site_dir = Path(site.getsitepackages()[0])
    todo = []
    for pkg in a.packages.split(","):
        root = site_dir / pkg
        cands = [p for p in sample_positions(root, 400, "both", a.seed) if p.line >= a.min_line]
        todo += [(pkg, root, p) for p in cands[:a.positions]]

    tmp = Path(tempfile.mkdtemp())
    port, sock = free_port(), tmp / "d.sock"
    proc = subprocess.Popen([sys.executable, "-m", "completiond", "serve", "--socket", str(sock), "--device", "cpu",
                             "--target", a.target, "--http", f"127.0.0.1:{port}", "--token-file", str(tmp / "token"),
                             "--log-level", "WARNING"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    rows = []
    try:
        await asyncio.to_thread(wait_for_socket, sock, proc)
        st = await asyncio.to_thread(wait_ready, sock, proc, 1800)
        token = (tmp / "token").read_text().strip()
        c = await Client.connect(sock)
        await c.request("initialize", {"client": "bench", "protocol": 1, "position_encoding": "utf-32"})
        for k, (pkg, root, p) in enumerate(todo):
            doc, offset = p.document(read_text_file(p.file) or "")
            uri = f"file://{p.file}"
            await c.request("document/open", {"uri": uri, "text": doc, "version": 1})
            w = window(doc, offset)
            cur = doc[doc.rfind("\n", 0, offset) + 1:].split("\n", 1)[0]
            blanks = len(cur) if not cur.strip() else None  # llama.vim sends such a line empty
            row = {"package": pkg, "file": str(p.file.relative_to(root)), "line": p.line, "kind": p.kind,
                   "reference": p.reference}
            for phase in ("cold", "warm"):
                if phase == "warm":
                    await asyncio.sleep(a.idle)
                paths = ["http", "lsp"] if (k + (phase == "warm")) % 2 == 0 else ["lsp", "http"]
                for path in paths:
                    if path == "http":
                        ms, out = await asyncio.to_thread(infill, port, token, w, a.max_tokens)
                        text, info = shown(out.get("content", ""), blanks), out.get("completiond", {})
                        lane, ptok = info.get("prompt_lane"), out.get("tokens_evaluated")
                    else:
                        ms, res = await wire(c, uri, doc, offset, a.max_tokens)
                        text, lane, ptok = res["text"], res.get("prompt_lane"), res.get("prompt_tokens")
                    row[f"{path}_{phase}"] = {"text": text, "ms": round(ms, 1), "lane": lane, "prompt_tokens": ptok,
                                              **score(text, p.reference)}
            await c.request("document/close", {"uri": uri})
            rows.append(row)
            print(json.dumps({k2: (v if not isinstance(v, dict) else {x: v[x] for x in ("exact", "ms", "lane",
                                                                                         "prompt_tokens")})
                              for k2, v in row.items() if k2 != "reference"}), flush=True)
        await c.close()
    finally:
        stop_daemon(proc)

    summary = {}
    for pkg in [*a.packages.split(","), "all"]:
        sel = [r for r in rows if pkg in ("all", r["package"])]
        if not sel:
            continue
        s = {"positions": len(sel)}
        for key in ("http_cold", "lsp_cold", "http_warm", "lsp_warm"):
            s[key] = {"exact_line": round(sum(r[key]["exact"] for r in sel) / len(sel), 3),
                      "edit_similarity": round(statistics.mean(r[key]["similarity"] for r in sel), 3),
                      "p50_ms": round(statistics.median(r[key]["ms"] for r in sel), 1),
                      "quick_lane": sum(r[key]["lane"] == "quick" for r in sel)}
        summary[pkg] = s
    result = {"command": " ".join(sys.argv), "target": st.get("target"), "device": st.get("device"),
              "cpu": cpu_name(),
              "summary": summary, "rows": rows}
    print(json.dumps(summary, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
