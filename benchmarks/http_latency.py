"""Latency per completion through `/infill` (HTTP, llama.vim's request) vs the daemon's own wire
protocol (MessagePack over the Unix socket), on one daemon, side by side.

Three cases, each path alternating with the other so machine noise hits both alike:
  cold   a window of a file never seen before (its prompt prefilled from nothing)
  typed  the same window with one more character typed at the cursor (the warm cache / typed-through)
  again  the identical request once more (engine work ~0: what is left is the transport)
Positions: one per stdlib file (distinct texts: the HTTP side cannot match another's document), a
llama.vim-sized window around a line start (n_prefix / n_suffix lines).

    python benchmarks/http_latency.py --positions 8 --out benchmarks/results/http-latency.json
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import random
import socket
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from daemon_util import stop_daemon, wait_for_socket, wait_ready  # noqa: E402

from completiond.service.client import Client  # noqa: E402


def positions(n: int, n_prefix: int, n_suffix: int, seed: int) -> list[dict]:
    """llama.vim-shaped requests (prefix lines, the line before the cursor, suffix lines)."""
    rng = random.Random(seed)
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    rng.shuffle(files)
    out = []
    for f in files:
        lines = f.read_text(encoding="utf-8", errors="replace").split("\n")
        cands = [i for i, ln in enumerate(lines) if n_prefix <= i < len(lines) - n_suffix - 1
                 and len(ln.strip()) > 12 and not ln.strip().startswith("#")]
        if not cands:
            continue
        y = rng.choice(cands)
        line = lines[y]
        x = len(line) - len(line.lstrip()) + max(4, len(line.strip()) // 2)
        out.append({"file": f.name, "input_prefix": "\n".join(lines[y - n_prefix:y]) + "\n", "prompt": line[:x],
                    "input_suffix": line[x:] + "\n" + "\n".join(lines[y + 1:y + 1 + n_suffix]) + "\n"})
        if len(out) == n:
            return out
    return out


def infill(port: int, token: str, pos: dict, max_tokens: int) -> tuple[float, dict]:
    body = {"id_slot": 0, "input_prefix": pos["input_prefix"], "input_suffix": pos["input_suffix"], "input_extra": [],
            "prompt": pos["prompt"], "n_predict": max_tokens, "stop": [], "n_indent": 0, "top_k": 40, "top_p": 0.90,
            "samplers": ["top_k", "top_p", "infill"], "stream": False, "cache_prompt": True, "t_max_prompt_ms": 500,
            "t_max_predict_ms": 60_000}
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)  # a new connection, as curl makes
    conn.request("POST", "/infill", body=json.dumps(body), headers={"Authorization": f"Bearer {token}",
                                                                    "Content-Type": "application/json"})
    r = conn.getresponse()
    out = json.loads(r.read())
    conn.close()
    return (time.perf_counter() - t0) * 1e3, out


async def wire(c: Client, uri: str, pos: dict, max_tokens: int, opened: set) -> tuple[float, dict]:
    text = pos["input_prefix"] + pos["prompt"] + pos["input_suffix"]
    cursor = len(pos["input_prefix"]) + len(pos["prompt"])
    t0 = time.perf_counter()  # the editor's cost: the buffer update and the completion
    if uri in opened:
        await c.notify("document/change", {"uri": uri, "changes": [{"text": text}]})
    else:
        await c.notify("document/open", {"uri": uri, "text": text, "version": 1})
        opened.add(uri)
    res = await c.request("complete", {"uri": uri, "max_tokens": max_tokens, "position": {
        "line": text[:cursor].count("\n"), "character": cursor - text.rfind("\n", 0, cursor) - 1}}, timeout=600)
    return (time.perf_counter() - t0) * 1e3, res


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--positions", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--n-prefix", type=int, default=32, help="lines before the cursor (llama.vim: 256)")
    ap.add_argument("--n-suffix", type=int, default=8, help="lines after (llama.vim: 64)")
    ap.add_argument("--again", type=int, default=10, help="identical repeats per path")
    ap.add_argument("--target", default="default")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="http-latency-"))
    sock, port = tmp / "d.sock", free_port()
    cmd = [sys.executable, "-m", "completiond", "serve", "--socket", str(sock), "--target", a.target,
           "--http", f"127.0.0.1:{port}", "--token-file", str(tmp / "token"), "--no-warm", "--log-level", "WARNING"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for_socket(sock, proc)
        info = wait_ready(sock, proc, 900)
        token = (tmp / "token").read_text().strip()
        c = await Client.connect(sock)
        await c.request("initialize", {"client": "bench", "protocol": 1, "position_encoding": "utf-32"})
        pos = positions(2 * a.positions, a.n_prefix, a.n_suffix, a.seed)
        rows, opened = [], set()
        for i in range(a.positions):  # position 2i over the wire, 2i+1 over HTTP; then the other way round
            for k, path in enumerate(("wire", "http") if i % 2 == 0 else ("http", "wire")):
                p = pos[2 * i + k]
                uri = f"file:///bench/{p['file']}"
                typed = {**p, "prompt": p["prompt"] + p["input_suffix"][:1],
                         "input_suffix": p["input_suffix"][1:]}
                for case, q in (("cold", p), ("typed", typed)):
                    if path == "wire":
                        ms, res = await wire(c, uri, q, a.max_tokens, opened)
                        n, served = len(res["token_ids"]), res.get("served_tokens", 0)
                    else:
                        ms, res = await asyncio.to_thread(infill, port, token, q, a.max_tokens)
                        n, served = res["tokens_predicted"], res["completiond"]["served_tokens"]
                    rows.append({"path": path, "case": case, "file": p["file"], "ms": round(ms, 2), "tokens": n,
                                 "served_tokens": served})
        probe = pos[0]
        for _ in range(a.again):
            for path in ("wire", "http"):
                if path == "wire":
                    ms, _ = await wire(c, f"file:///bench/{probe['file']}", probe, a.max_tokens, opened)
                else:
                    ms, _ = await asyncio.to_thread(infill, port, token, probe, a.max_tokens)
                rows.append({"path": path, "case": "again", "file": probe["file"], "ms": round(ms, 2)})
        await c.close()
    finally:
        stop_daemon(proc)
    summary = {}
    for case in ("cold", "typed", "again"):
        for path in ("wire", "http"):
            ms = [r["ms"] for r in rows if r["case"] == case and r["path"] == path]
            summary[f"{case}_{path}_p50_ms"] = round(statistics.median(ms), 1)
        summary[f"{case}_http_over_wire_p50"] = round(summary[f"{case}_http_p50_ms"] / summary[f"{case}_wire_p50_ms"], 3)
    out = {"command": " ".join(["python", "benchmarks/http_latency.py", *sys.argv[1:]]),
           "target": info.get("target"), "device": info.get("device"), "dtype": info.get("dtype"),
           "quant": info.get("quant"), "positions": a.positions, "max_tokens": a.max_tokens,
           "n_prefix": a.n_prefix, "n_suffix": a.n_suffix, "machine": "2-core EPYC, shared with other agents",
           "summary": summary, "rows": rows}
    print(json.dumps(summary, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
