"""Latency and quality per completion: completiond's in-process target vs completiond with a remote
target on llama.cpp's own server (`llama-server`, same Qwen2.5-Coder GGUF) vs that server directly.

Paths, every position on each, the order rotating per position so machine noise hits all alike:
  local     `completiond serve --target <model>`: the model in-process (the runtime form), wire protocol
  llamacpp  `completiond serve --target llamacpp:URL#<model>`: the daemon builds the prompt and stops,
            llama-server's /infill runs the model (the daemon's prompt split at its FIM tokens)
  openai    `--target openai:URL/v1#<model>#raw`: the daemon's whole FIM prompt as text to
            llama-server's /v1/completions (vLLM's way: FIM tokens in the prompt, no suffix)
  direct    llama-server's /infill asked directly (llama.vim's request, greedy, no daemon)
Cases: "cold" (a window never asked before on that path) and "repeat" (the same request again:
completiond's typed-through memory locally, llama-server's prompt cache remotely).
Quality: each completion's first line against the file's real rest of the line (exact match, and the
characters matched from the start), and the paths' texts against each other.

    python -m benchmarks.experiments remote_latency --server-bin /path/to/llama-server --positions 8 \\
        --out benchmarks/results/remote-latency.json
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.daemon_util import stop_daemon, wait_for_socket, wait_ready  # noqa: E402
from benchmarks.http_latency import free_port, positions, wire  # noqa: E402

from completiond.service.client import Client  # noqa: E402

GGUF = Path.home() / ".cache" / "completiond" / "gguf" / "qwen2.5-coder-0.5b.gguf"


def direct(port: int, pos: dict, max_tokens: int) -> tuple[float, dict]:
    """llama-server's /infill, greedy, on a new connection (as the daemon's remote target makes)."""
    body = {"input_prefix": pos["input_prefix"], "prompt": pos["prompt"], "input_suffix": pos["input_suffix"],
            "input_extra": [], "n_predict": max_tokens, "temperature": 0.0, "cache_prompt": True, "stream": False}
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/infill", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    out = json.loads(r.read())
    conn.close()
    if r.status != 200:
        raise RuntimeError(f"llama-server /infill answered {r.status}: {out}")
    return (time.perf_counter() - t0) * 1e3, out


def wait_health(port: int, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise TimeoutError("llama-server did not become healthy")


def quality(text: str, truth: str) -> dict:
    """The completion's first line against the file's rest of the line."""
    first = text.split("\n")[0]
    n = 0
    while n < min(len(first), len(truth)) and first[n] == truth[n]:
        n += 1
    return {"line_exact": first.rstrip() == truth.rstrip() and bool(first.strip()), "chars_matched": n}


def serve(tmp: Path, name: str, target: str) -> tuple[subprocess.Popen, Path]:
    sock = tmp / f"{name}.sock"
    proc = subprocess.Popen([sys.executable, "-m", "completiond", "serve", "--socket", str(sock), "--target", target,
                             "--no-warm", "--log-level", "WARNING"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for_socket(sock, proc)
    return proc, sock


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server-bin", required=True, help="llama.cpp's llama-server")
    ap.add_argument("--gguf", default=str(GGUF))
    ap.add_argument("--target", default="qwen2.5-coder-0.5b", help="completiond's model (the GGUF's)")
    ap.add_argument("--positions", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--n-prefix", type=int, default=32)
    ap.add_argument("--n-suffix", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--paths", default="local,llamacpp,openai,direct")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    paths = a.paths.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="remote-latency-"))
    port = free_port()
    procs: dict[str, subprocess.Popen] = {}
    procs["llama-server"] = subprocess.Popen(
        [a.server_bin, "-m", a.gguf, "--host", "127.0.0.1", "--port", str(port), "-c", "4096", "-t", str(a.threads),
         "-np", "1"], stdout=subprocess.DEVNULL, stderr=open(tmp / "llama-server.log", "wb"))
    socks: dict[str, Path] = {}
    try:
        specs = {"local": a.target, "llamacpp": f"llamacpp:http://127.0.0.1:{port}#{a.target}",
                 "openai": f"openai:http://127.0.0.1:{port}/v1#{a.target}#raw"}
        for name in paths:
            if name in specs:
                procs[name], socks[name] = serve(tmp, name, specs[name])
        wait_health(port, procs["llama-server"])
        infos = {name: wait_ready(socks[name], procs[name], 1800) for name in socks}
        clients = {}
        for name in socks:
            clients[name] = await Client.connect(socks[name])
            await clients[name].request("initialize", {"client": "bench", "protocol": 1, "position_encoding": "utf-32"})
        pos = positions(a.positions, a.n_prefix, a.n_suffix, a.seed)
        rows, opened = [], set()
        for i, p in enumerate(pos):
            order = paths[i % len(paths):] + paths[:i % len(paths)]
            truth = p["input_suffix"].split("\n")[0]
            p = {**p, "input_suffix": "\n" + p["input_suffix"].split("\n", 1)[1]}  # the cursor at the line's end
            for case in ("cold", "repeat"):
                for path in order:
                    if path == "direct":
                        ms, res = await asyncio.to_thread(direct, port, p, a.max_tokens)
                        text, n = res["content"], res.get("tokens_predicted")
                    else:
                        ms, res = await wire(clients[path], f"file:///bench/{path}/{p['file']}", p, a.max_tokens,
                                             opened)
                        text, n = res["text"], len(res["token_ids"])
                    rows.append({"path": path, "case": case, "file": p["file"], "ms": round(ms, 2), "tokens": n,
                                 "text": text, "truth": truth, **quality(text, truth)})
        for c in clients.values():
            await c.close()
    finally:
        for name, proc in procs.items():
            if name == "llama-server":
                proc.terminate()
                proc.wait(30)
            else:
                stop_daemon(proc)
    summary: dict = {}
    for case in ("cold", "repeat"):
        for path in paths:
            rs = [r for r in rows if r["case"] == case and r["path"] == path]
            summary[f"{case}_{path}_p50_ms"] = round(statistics.median(r["ms"] for r in rs), 1)
            summary[f"{case}_{path}_tokens_mean"] = round(statistics.mean(r["tokens"] or 0 for r in rs), 1)
        for path in paths[1:]:  # paired: each position's ratio to the in-process daemon, then the median
            pairs = [(r["ms"], w["ms"]) for r in rows for w in rows if r["case"] == w["case"] == case
                     and r["path"] == path and w["path"] == paths[0] and r["file"] == w["file"]]
            summary[f"{case}_{path}_over_{paths[0]}_paired_p50"] = round(statistics.median(x / y for x, y in pairs), 3)
    for path in paths:
        rs = [r for r in rows if r["case"] == "cold" and r["path"] == path]
        summary[f"{path}_line_exact"] = sum(r["line_exact"] for r in rs)
        summary[f"{path}_chars_matched_mean"] = round(statistics.mean(r["chars_matched"] for r in rs), 1)
    cold = {(r["path"], r["file"]): r["text"] for r in rows if r["case"] == "cold"}
    files = [p["file"] for p in pos]
    for x, y in (("llamacpp", "direct"), ("openai", "direct"), ("llamacpp", "openai"), ("local", "llamacpp")):
        if x in paths and y in paths:
            summary[f"same_text_{x}_vs_{y}"] = sum(cold[(x, f)] == cold[(y, f)] for f in files)
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "?")
    version = subprocess.run([a.server_bin, "--version"], capture_output=True, text=True).stderr.strip()
    out = {"command": " ".join(["python", "-m", "benchmarks.experiments", "remote_latency", *sys.argv[1:]]),
           "cpu": f"{cpu}, {os.cpu_count()} cores, shared with other agents", "gguf": Path(a.gguf).name,
           "llama_server": version.splitlines()[-1] if version else "?", "llama_server_threads": a.threads,
           "local": {k: infos["local"].get(k) for k in ("target", "device", "dtype", "quant")} if "local" in infos
           else None, "positions": len(pos), "max_tokens": a.max_tokens, "n_prefix": a.n_prefix,
           "n_suffix": a.n_suffix, "paths": paths, "summary": summary, "rows": rows}
    print(json.dumps(summary, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
