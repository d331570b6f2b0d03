"""RSS of a daemon that switched to the larger default in the background, against a start from the
converted cache (docs/conversion.md "The larger default converts in the background").

    python -m benchmarks.experiments upgrade_rss [--out benchmarks/results/upgrade-rss.json] [--settle 40]

Needs the real cache ($COMPLETIOND_CACHE or ~/.cache/completiond) with both Qwen targets converted
(qwen2.5-coder-0.5b@int8, qwen2.5-coder-1.5b@int4) and this CPU's choice of the 1.5B as the default.
A scratch cache links the GGUFs, the calibration and the 0.5B's runtime form; the 1.5B's is absent
when `completiond serve` starts (its conversion lock held here, as another converting process would
hold it), so the 0.5B serves and the upgrade waits; the 1.5B's converted form is then linked in and
the lock released: the upgrade finds it intact (no conversion runs here: tests/test_upgrade.py runs
a real one on tiny models, docs/conversion.md measures the 1.5B's), loads it and switches. Then a
fresh daemon starts from the same, now converted, scratch cache. RSS (VmRSS) of each after three
completions, and again `--settle` seconds later (the weights' move into 2 MB pages runs meanwhile).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from completiond.daemon_cli import wait_ready
from completiond.models.catalog import file_lock
from completiond.paths import cache_root
from completiond.service.client import Client

ROOT = Path(__file__).resolve().parents[2]

LARGER, SMALLER = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
SRC = (ROOT / "completiond" / "service" / "upgrade.py").read_text()


def cpu() -> str:
    info = {}
    for line in open("/proc/cpuinfo"):
        k, _, v = line.partition(":")
        info.setdefault(k.strip(), v.strip())
    flags = [f for f in ("avx512_vnni", "avx512_bf16", "amx_tile") if f in info.get("flags", "").split()]
    return (f"{os.cpu_count()}-core {info.get('model name')} (family {info.get('cpu family')} model "
            f"{info.get('model')}; {', '.join(flags) or 'no AVX512-VNNI'})")


def rss_mb(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024)
    return -1


async def ask(sock: Path, n: int = 3) -> list[float]:
    c = await Client.connect(sock)
    await c.request("initialize", {"client": "upgrade_rss", "protocol": 1, "workspace_roots": []})
    await c.request("document/open", {"uri": "file:///w/u.py", "text": SRC, "version": 1, "language_id": "python"})
    ms = []
    for i in range(n):
        r = await c.request("complete", {"uri": "file:///w/u.py", "position": {"line": 60 + i, "character": 0},
                                         "max_tokens": 24}, timeout=600)
        ms.append(round(r["ms_total"], 1))
    await c.close()
    return ms


def start(sock: Path, env: dict, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "completiond", "serve", "--socket", str(sock)],
                            stdout=subprocess.DEVNULL, stderr=open(log, "wb"), env=env)
    asyncio.run(wait_ready(sock, proc, 900))
    return proc


def daemon_status(sock: Path) -> dict:
    async def ask_status() -> dict:
        c = await Client.connect(sock)
        try:
            return await c.request("status", {}, timeout=60)
        finally:
            await c.close()

    return asyncio.run(ask_status())


def stop_daemon(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(60)


def scratch_cache(real: Path, at: Path) -> None:
    """Links of the real cache's GGUFs, kernels and the 0.5B's runtime form; a copy of its calibration."""
    (at / "gguf").mkdir(parents=True)
    (at / "runtime").mkdir()
    shutil.copytree(real / "calibration", at / "calibration")
    for name in ("kernels", "prompt-tables"):
        if (real / name).exists():
            (at / name).symlink_to(real / name)
    for f in (real / "gguf").iterdir():
        if f.suffix in (".gguf", ".verified"):
            (at / "gguf" / f.name).symlink_to(f)
    (at / "runtime" / SMALLER).symlink_to(real / "runtime" / SMALLER)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "upgrade-rss.json"))
    ap.add_argument("--settle", type=float, default=40.0)
    a = ap.parse_args()
    real = cache_root()
    with tempfile.TemporaryDirectory() as tmp:
        cache, sock = Path(tmp) / "cache", Path(tmp) / "d.sock"
        scratch_cache(real, cache)
        env = {**os.environ, "COMPLETIOND_CACHE": str(cache)}
        folder = cache / "runtime" / LARGER
        res: dict = {"command": " ".join(["python -m benchmarks.experiments upgrade_rss", *sys.argv[1:]]),
                     "cpu": cpu(), "load_average": [round(x, 1) for x in os.getloadavg()]}
        lock = file_lock(folder.with_name(folder.name + ".lock"))
        lock.__enter__()
        try:
            t0 = time.time()
            proc = start(sock, env, Path(tmp) / "upgrade.log")
            st = daemon_status(sock)
            res["first"] = {"target": st["target"], "upgrade": st.get("upgrade"), "ready_s": round(time.time() - t0, 1),
                            "ms": asyncio.run(ask(sock)), "rss_mb": rss_mb(proc.pid)}
            folder.symlink_to(real / "runtime" / LARGER)
        finally:
            lock.__exit__(None, None, None)
        t1 = time.time()
        while (up := daemon_status(sock)["upgrade"])["phase"] not in ("switched", "failed"):
            time.sleep(0.5)
        res["switch"] = {"upgrade": up, "s": round(time.time() - t1, 1)}
        res["switched"] = {"target": daemon_status(sock)["target"], "ms": asyncio.run(ask(sock)),
                           "rss_mb": rss_mb(proc.pid)}
        time.sleep(a.settle)
        res["switched"].update(rss_mb_settled=rss_mb(proc.pid), weights=daemon_status(sock)["weights"])
        stop_daemon(proc)
        t2 = time.time()
        proc = start(sock, env, Path(tmp) / "converted.log")
        res["converted_start"] = {"target": daemon_status(sock)["target"], "ready_s": round(time.time() - t2, 1),
                                  "ms": asyncio.run(ask(sock)), "rss_mb": rss_mb(proc.pid)}
        time.sleep(a.settle)
        res["converted_start"].update(rss_mb_settled=rss_mb(proc.pid), weights=daemon_status(sock)["weights"])
        stop_daemon(proc)
    res["ratio_settled"] = round(res["switched"]["rss_mb_settled"] / res["converted_start"]["rss_mb_settled"], 3)
    res["ratio_at_first_completions"] = round(res["switched"]["rss_mb"] / res["converted_start"]["rss_mb"], 3)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: res[k] for k in ("ratio_settled", "ratio_at_first_completions")}))


if __name__ == "__main__":
    main()
