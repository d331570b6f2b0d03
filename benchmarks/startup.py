"""Start-up cost of a converted model: daemon start -> `state: ready`, the daemon's RSS
when ready and after its first completion, the cache's size, a second `completiond complete` with
no daemon, and one answered by a running daemon.

    python -m benchmarks.startup [--target qwen2.5-coder-0.5b] [--cache DIR] [--repeat 3]
        [--baseline /work/main --baseline-cache ~/.cache/completiond] [--ready-only | --load-cpu-only]
        [--draft none --baseline-draft SPEC]

--draft: the daemons' and completions' --draft (default none); --baseline-draft: the baseline's
(default --draft); --quant: every daemon's and completion's. `--target qwen2.5-coder-1.5b --quant int4
--baseline . --draft default --baseline-draft qwen2.5-coder-0.5b` compares, in this checkout, a
default draft left unloaded because this machine measured it slower (docs/drafts.md "The gate")
with the same draft loaded.

--ready-only: only daemon starts -> `ready` (wall, the daemon's CPU seconds, RSS, load average).

Each command runs as a fresh process (real `completiond serve` / `completiond complete`, no mocks),
with COMPLETIOND_CACHE=--cache (converted first if needed: not timed). `--baseline CHECKOUT` runs
the same steps with another checkout's code (e.g. the float32-safetensors loader) side by side, in
the same run, so the ratio holds on a shared machine. Writes benchmarks/results/startup-<target>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FILE = ROOT / "completiond" / "paths.py"  # a short real file: the prompt's prefill stays small
LINE, COL = 14, 5


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def mem_mb(pid: int) -> dict:
    """VmRSS and its parts (anonymous, file-backed) of a process, MB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, val = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            out[key] = round(int(val.split()[0]) / 1024, 1)
    return out


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used (what contention inflates least)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)


def status(sock: Path, timeout: float = 5.0) -> dict:
    import msgpack

    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(str(sock))
        s.sendall(msgpack.packb([0, 1, "status", {}]))
        unpacker = msgpack.Unpacker(raw=False)
        while True:
            data = s.recv(1 << 16)
            if not data:
                raise ConnectionError("closed")
            unpacker.feed(data)
            for frame in unpacker:
                if frame[0] == 1 and frame[1] == 1:
                    return frame[3]


def env_for(code: Path, cache: Path) -> dict:
    return {**os.environ, "PYTHONPATH": f"{code}:{code / 'lsp'}", "COMPLETIOND_CACHE": str(cache),
            "TRANSFORMERS_VERBOSITY": "error"}


def daemon_start(code: Path, cache: Path, target: str, sock: Path, timeout: float = 600,
                 models: tuple[str, ...] = ("--draft", "none")) -> tuple[subprocess.Popen, dict]:
    """Start `serve` (`models`: the flags after --target, --draft and --quant); returns the process
    and {start_to_ready_s, phases, rss at ready}."""
    t0 = time.perf_counter()
    log = open(sock.with_name("serve.log"), "w+")
    proc = subprocess.Popen([sys.executable, "-m", "completiond", "serve", "--socket", str(sock), "--target", target,
                             *models, "--log-level", "INFO"], env=env_for(code, cache), cwd=code,
                            stdout=subprocess.DEVNULL, stderr=log)
    while time.perf_counter() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited: {sock.with_name('serve.log').read_text()[-2000:]}")
        try:
            st = status(sock)
        except OSError:
            time.sleep(0.02)
            continue
        if st.get("state") == "ready":
            ready = time.perf_counter() - t0
            log.seek(0)
            phases = [ln.split("start-up: ", 1)[1].strip() for ln in log if "start-up: " in ln]
            return proc, {"start_to_ready_s": round(ready, 2), "cpu_s_at_ready": cpu_s(proc.pid),
                          "loadavg_1min_at_ready": round(os.getloadavg()[0], 2), "rss_ready_mb": mem_mb(proc.pid),
                          "log": phases, "dtype": st.get("dtype"), "quant": st.get("quant"),
                          "target": st.get("target"), "draft": st.get("draft")}
        if st.get("state") == "failed":
            raise RuntimeError(f"daemon failed: {st.get('error')}")
        time.sleep(0.02)
    raise TimeoutError("daemon did not become ready")


def cli_complete(code: Path, cache: Path, target: str, extra: list[str],
                 models: tuple[str, ...] = ("--draft", "none")) -> dict:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "completiond", "complete", str(FILE), "--line", str(LINE), "--col",
                          str(COL), "--target", target, *models, "--max-tokens", "16", "--json", *extra],
                         env=env_for(code, cache), cwd=code, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    if out.returncode:
        raise RuntimeError(f"complete failed: {out.stderr[-2000:]}")
    res = json.loads(out.stdout)
    return {"wall_s": round(wall, 2), "ms_total": res["ms_total"], "prompt_tokens": res.get("prompt_tokens"),
            "text": res["text"], "via_daemon": "daemon" in res}


LOAD_CPU = """
import resource, sys, time
t0 = time.perf_counter()
from completiond.models.loader import load
lm = load(sys.argv[1], "target", "cpu", "auto", "auto")
from completiond.core.engine import Engine
Engine(lm, None).calibrate_cached()
from completiond.core.prompt import prepare_tokenizer
prepare_tokenizer(lm.tokenizer)
ru = resource.getrusage(resource.RUSAGE_SELF)
print(round(ru.ru_utime + ru.ru_stime, 2), round(time.perf_counter() - t0, 2), ru.ru_maxrss // 1024)
"""


def load_cpu(code: Path, cache: Path, target: str) -> dict:
    """CPU seconds (user + sys) of one process loading the target as a daemon does (imports, load,
    engine, prompt tables): what contention inflates least; and its wall time and peak RSS."""
    out = subprocess.run([sys.executable, "-c", LOAD_CPU, target], env=env_for(code, cache), cwd=code,
                         capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    cpu, wall, peak = out.stdout.split()[-3:]
    return {"cpu_s": float(cpu), "wall_s": float(wall), "peak_rss_mb": int(peak)}


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def one_run(code: Path, cache: Path, target: str, new_cli: bool, models: tuple[str, ...] = ("--draft", "none")) -> dict:
    """One daemon start (ready, RSS), two completions while it runs, then one with no daemon.
    new_cli: the CLI has --socket / --no-daemon (a baseline checkout may not: it always loads itself)."""
    with tempfile.TemporaryDirectory() as tmp:
        sock = Path(tmp) / "d.sock"
        proc, got = daemon_start(code, cache, target, sock, models=models)
        try:
            via = ["--socket", str(sock)] if new_cli else []
            first = cli_complete(code, cache, target, via, models)
            again = cli_complete(code, cache, target, via, models)
            got.update(rss_after_first_completion_mb=mem_mb(proc.pid), with_daemon=first, with_daemon_again=again)
            if new_cli:
                got.update(editor_open(sock, proc.pid))
        finally:
            proc.terminate()
            proc.wait(30)
    got["no_daemon"] = cli_complete(code, cache, target, ["--no-daemon"] if new_cli else [], models)
    return got


def editor_open(sock: Path, pid: int, settle_s: float = 5.0) -> dict:
    """What an editor adds: it opens a larger file (`document/open`: the daemon prefills it as a
    low-priority warm-up, the draft's cache too where one is loaded) and asks for a completion in
    it; the daemon's RSS and CPU seconds settle_s later (warm-ups done, weights in use resident)."""
    import asyncio

    from completiond.service import protocol as P
    from completiond.service.client import Client

    text = (ROOT / "completiond" / "core" / "engine.py").read_text()
    uri = "file:///startup/engine.py"

    async def run() -> float:
        c = await Client.connect(sock)
        try:
            await c.request("initialize", {"client": "startup", "protocol": P.PROTOCOL_VERSION}, timeout=30)
            cpu0 = cpu_s(pid)
            await c.request("document/open", {"uri": uri, "text": text, "version": 1, "language_id": "python"})
            await c.request("complete", {"uri": uri, "version": 1, "max_tokens": 16,
                                         "position": {"line": 200, "character": 0}}, timeout=600)
            await asyncio.sleep(settle_s)
            return cpu0
        finally:
            await c.close()

    cpu0 = asyncio.run(run())
    return {"rss_after_editor_open_mb": mem_mb(pid), "cpu_s_editor_open": round(cpu_s(pid) - cpu0, 2)}


def summary(runs: list[dict]) -> dict:
    med = lambda xs: round(statistics.median(xs), 2)  # noqa: E731
    return {
        "runs": runs,
        "median": {
            "start_to_ready_s": med([r["start_to_ready_s"] for r in runs]),
            "cpu_s_at_ready": med([r["cpu_s_at_ready"] for r in runs]),
            "rss_ready_mb": med([r["rss_ready_mb"]["VmRSS"] for r in runs]),
            "rss_after_first_completion_mb": med([r["rss_after_first_completion_mb"]["VmRSS"] for r in runs]),
            "complete_no_daemon_wall_s": med([r["no_daemon"]["wall_s"] for r in runs]),
            "complete_no_daemon_ms_total": med([r["no_daemon"]["ms_total"] for r in runs]),
            "complete_with_daemon_wall_s": med([r["with_daemon"]["wall_s"] for r in runs]),
            "complete_with_daemon_again_wall_s": med([r["with_daemon_again"]["wall_s"] for r in runs]),
            **({"rss_after_editor_open_mb": med([r["rss_after_editor_open_mb"]["VmRSS"] for r in runs]),
                "cpu_s_editor_open": med([r["cpu_s_editor_open"] for r in runs])}
               if all("rss_after_editor_open_mb" in r for r in runs) else {}),
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-0.5b")
    ap.add_argument("--cache", default=None, help="COMPLETIOND_CACHE (default: the user's)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baseline", default=None, help="another checkout to measure side by side")
    ap.add_argument("--baseline-cache", default=None, help="its COMPLETIOND_CACHE (default: --cache)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--draft", default="none", help="--draft of every daemon and completion")
    ap.add_argument("--quant", default="auto", help="--quant of every daemon and completion")
    ap.add_argument("--baseline-draft", default=None, help="the baseline's --draft (default: --draft)")
    ap.add_argument("--ready-only", action="store_true",
                    help="only daemon starts -> ready (wall, CPU seconds, RSS), interleaved with the baseline")
    ap.add_argument("--load-cpu-only", action="store_true",
                    help="only the CPU time of loading, in fresh processes, interleaved with the baseline")
    a = ap.parse_args()
    from completiond.paths import cache_root

    cache = Path(a.cache) if a.cache else cache_root()
    mine = ("--draft", a.draft, "--quant", a.quant)  # this checkout's model flags
    # convert (untimed) and make sure the kernel is built and the calibrations are cached
    if a.load_cpu_only:
        load_cpu(ROOT, cache, a.target)
    elif a.ready_only:
        with tempfile.TemporaryDirectory() as tmp:  # converts if needed, and writes the prompt tables
            proc, _ = daemon_start(ROOT, cache, a.target, Path(tmp) / "d.sock", models=mine)
            proc.terminate()
            proc.wait(30)
    else:
        cli_complete(ROOT, cache, a.target, ["--no-daemon"], mine)
    load = os.getloadavg()
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "cpu": cpu_name(), "cores": os.cpu_count(), "loadavg_at_start": [round(x, 2) for x in load],
        "target": a.target, "quant": a.quant, "file": f"{FILE.relative_to(ROOT)}:{LINE}:{COL}",
        "cache_runtime_bytes": du(cache / "runtime" / a.target),
        "cache_gguf_bytes": du(cache / "gguf"),
        "cache_files": sorted(f.name for f in (cache / "runtime" / a.target).glob("*")),
    }
    base = Path(a.baseline).resolve() if a.baseline else None
    drafts = {"this": a.draft, "baseline": a.baseline_draft or a.draft}
    result["drafts"] = drafts
    models = {key: ("--draft", d, "--quant", a.quant) for key, d in drafts.items()}
    bcache = Path(a.baseline_cache) if a.baseline_cache else cache
    if a.load_cpu_only:
        for key, code, c in (("this", ROOT, cache), ("baseline", base, bcache)):
            result[key] = {"load": []}
        for _ in range(a.repeat):
            result["this"]["load"].append(load_cpu(ROOT, cache, a.target))
            if base is not None:
                result["baseline"]["load"].append(load_cpu(base, bcache, a.target))
        result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        out = Path(a.out) if a.out else ROOT / "benchmarks" / "results" / f"startup-load-cpu-{a.target}.json"
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({k: result[k]["load"] for k in ("this", "baseline") if result[k]["load"]}, indent=1))
        return 0
    if a.ready_only:
        for key in ("this", "baseline"):
            result[key] = {"ready": []}
        for _ in range(a.repeat):
            for key, code, c in (("this", ROOT, cache), ("baseline", base, bcache)):
                if code is None:
                    continue
                with tempfile.TemporaryDirectory() as tmp:
                    proc, got = daemon_start(code, c, a.target, Path(tmp) / "d.sock", models=models[key])
                    proc.terminate()
                    proc.wait(30)
                result[key]["ready"].append(got)
        result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        out = Path(a.out) if a.out else ROOT / "benchmarks" / "results" / f"startup-ready-only-{a.target}.json"
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({k: [(r["start_to_ready_s"], r["cpu_s_at_ready"], r["loadavg_1min_at_ready"])
                              for r in result[k]["ready"]] for k in ("this", "baseline")}, indent=1))
        return 0
    this, other = [], []
    for _ in range(a.repeat):  # interleaved: both see the same machine load
        this.append(one_run(ROOT, cache, a.target, True, models["this"]))
        if base is not None:  # another checkout's CLI may lack --socket / --no-daemon
            other.append(one_run(base, bcache, a.target, base == ROOT, models["baseline"]))
    result["this"] = summary(this)
    if base is not None:
        result["baseline"] = {"checkout": str(base), "cache": str(bcache),
                              "cache_model_bytes": du(bcache / "models" / a.target), **summary(other)}
    result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    out = Path(a.out) if a.out else ROOT / "benchmarks" / "results" / f"startup-{a.target}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"this": result["this"]["median"], "baseline": result.get("baseline", {}).get("median"),
                      "cache_runtime_mb": round(result["cache_runtime_bytes"] / 1e6), "out": str(out)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
