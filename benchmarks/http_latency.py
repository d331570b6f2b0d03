"""Latency per completion through `/infill` (HTTP, llama.vim's request) vs the daemon's own wire
protocol (MessagePack over the Unix socket), on one daemon, side by side.

Three cases, each path alternating with the other so machine noise hits both alike:
  cold   a window of a file never seen before (its prompt prefilled from nothing); every path gets
         the same window, each path on a daemon of its own (same model, same flags), so that none
         finds another's prompt cached or remembered
  typed  the same window with one more character typed at the cursor (the warm cache / typed-through)
  again  the identical request once more (engine work ~0: what is left is the transport)
With --remote, a third path: a daemon whose target is another daemon's --http (`--target
openai:http://127.0.0.1:PORT/v1#<target>`), asked over its wire protocol: the network path of a
team's shared server (on loopback here: no network time, the protocol's and the second hop's).
Positions: one per stdlib file, a llama.vim-shaped window around the cursor (n_prefix / n_suffix lines).

    python -m benchmarks.http_latency --positions 8 --out benchmarks/results/http-latency.json
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

from tests.daemon_util import stop_daemon, wait_for_socket, wait_ready  # noqa: E402

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
    ap.add_argument("--remote", action="store_true", help="also through a second daemon with a remote target")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="http-latency-"))
    paths = ["wire", "http"] + (["remote"] if a.remote else [])
    # one daemon per path: the typed-through memory and the caches of one path must not serve
    # another's (the quick prompt around the cursor is the same text on every path)
    procs, socks, ports = {}, {}, {}
    for name in ("wire", "http", "server")[:2 + a.remote]:
        socks[name], ports[name] = tmp / f"{name}.sock", free_port()
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "completiond", "serve", "--socket", str(socks[name]), "--target", a.target,
             "--http", f"127.0.0.1:{ports[name]}", "--token-file", str(tmp / "token"), "--no-warm",
             "--log-level", "WARNING"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_for_socket(socks[name], procs[name])  # one at a time: the first start writes the token file
    try:
        infos = {name: wait_ready(socks[name], procs[name], 1800) for name in procs}
        info = infos["wire"]
        token = (tmp / "token").read_text().strip()
        port = ports["http"]
        if a.remote:
            socks["remote"] = tmp / "laptop.sock"
            procs["remote"] = subprocess.Popen(
                [sys.executable, "-m", "completiond", "serve", "--socket", str(socks["remote"]), "--target",
                 f"openai:http://127.0.0.1:{ports['server']}/v1#{info['target']}", "--remote-token-file",
                 str(tmp / "token"), "--no-warm", "--log-level", "WARNING"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            wait_for_socket(socks["remote"], procs["remote"])
            wait_ready(socks["remote"], procs["remote"], 900)
        clients = {}
        for name in ("wire", "remote")[:1 + a.remote]:
            clients[name] = await Client.connect(socks[name])
            await clients[name].request("initialize", {"client": "bench", "protocol": 1, "position_encoding": "utf-32"})
        pos = positions(a.positions, a.n_prefix, a.n_suffix, a.seed)
        rows, opened = [], set()
        for i in range(a.positions):  # each position on both paths; which goes first alternates
            for path in paths if i % 2 == 0 else paths[::-1]:
                p = pos[i]
                uri = f"file:///bench/{path}/{p['file']}"
                typed = {**p, "prompt": p["prompt"] + p["input_suffix"][:1],
                         "input_suffix": p["input_suffix"][1:]}
                for case, q in (("cold", p), ("typed", typed)):
                    if path in ("wire", "remote"):
                        ms, res = await wire(clients[path], uri, q, a.max_tokens, opened)
                        n, served = len(res["token_ids"]), res.get("served_tokens", 0)
                    else:
                        ms, res = await asyncio.to_thread(infill, port, token, q, a.max_tokens)
                        n, served = res["tokens_predicted"], res["completiond"]["served_tokens"]
                    rows.append({"path": path, "case": case, "file": p["file"], "ms": round(ms, 2), "tokens": n,
                                 "served_tokens": served})
        probe = pos[0]
        for it in range(a.again + 1):  # the first round fills the caches: not recorded
            for path in paths:
                if path in ("wire", "remote"):
                    ms, _ = await wire(clients[path], f"file:///bench/{path}/{probe['file']}", probe,
                                       a.max_tokens, opened)
                else:
                    ms, _ = await asyncio.to_thread(infill, port, token, probe, a.max_tokens)
                if it:
                    rows.append({"path": path, "case": "again", "file": probe["file"], "iter": it, "ms": round(ms, 2)})
        for c in clients.values():
            await c.close()
    finally:
        for proc in procs.values():
            stop_daemon(proc)
    summary = {}
    for case in ("cold", "typed", "again"):
        for path in paths:
            ms = [r["ms"] for r in rows if r["case"] == case and r["path"] == path]
            summary[f"{case}_{path}_p50_ms"] = round(statistics.median(ms), 1)
        for path in paths[1:]:
            summary[f"{case}_{path}_over_wire_p50"] = round(
                summary[f"{case}_{path}_p50_ms"] / summary[f"{case}_wire_p50_ms"], 3)
        # paired: the same position's ratio, then the median of those (positions differ in cost)
        for path in paths[1:]:
            pairs = [(r["ms"], w["ms"]) for r in rows for w in rows if r["case"] == w["case"] == case
                     and r["path"] == path and w["path"] == "wire" and r["file"] == w["file"]
                     and r.get("iter") == w.get("iter")]
            summary[f"{case}_{path}_over_wire_paired_p50"] = round(statistics.median(x / y for x, y in pairs), 3)
    out = {"command": " ".join(["python", "-m", "benchmarks.http_latency", *sys.argv[1:]]),
           "target": info.get("target"), "device": info.get("device"), "dtype": info.get("dtype"),
           "quant": info.get("quant"), "positions": a.positions, "paths": paths, "max_tokens": a.max_tokens,
           "n_prefix": a.n_prefix, "n_suffix": a.n_suffix, "machine": "2-core EPYC, shared with other agents",
           "summary": summary, "rows": rows}
    print(json.dumps(summary, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
