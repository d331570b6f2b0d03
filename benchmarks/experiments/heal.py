"""Pass costs that heal on a real model: a daemon started from a table measured under load
reaches the quiet table.

1. In this process, the target is loaded as the daemon loads it and its pass costs are measured
   (QUICK_SIZES, the daemon's first-start calibration) while busy loops keep every core busy: the
   table a daemon would cache after a first start in a bad minute. It goes into a temporary
   calibration cache (the models are linked from the real cache), with the load it was measured under.
2. A quiet table: the same calibration with no busy loop, before and after the daemon's run.
3. A real `completiond serve` starts from the loaded table (COMPLETIOND_RECALIBRATE=0: the start-up
   re-measure would otherwise replace it when the machine is quiet, and this measures the estimator)
   and serves --completions completions at positions sampled from a repository; its `status`
   table is read every --every completions.
   A second daemon, started from the quiet table (before), serves the same completions alternately
   (one request each, in turn, so both see the same load): what a real pass costs in a daemon right
   now, which a calibration loop underprices (no prompt context, logits, the step's Python).
4. Per size the daemon ran at least --min-passes times: its estimate over the span of the honest
   prices (the quiet tables before and after, and the reference daemon's estimate of that size;
   1.0 inside the span, else over the nearer end), and whether trees above 2 nodes were chosen
   (passes minus probes) after the last checkpoint.

    python -m benchmarks.experiments heal --target qwen2.5-coder-0.5b --completions 100 \\
        --json benchmarks/results/heal-qwen2.5-coder-0.5b.json

Time-based: the machine this ran on may be shared; the JSON says what its load average was.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from completiond.bench.repo import read_text_file, resolve_repo, sample_positions  # noqa: E402
from completiond.core.speculation import budget as B  # noqa: E402
from completiond.core.speculation import calibration as C
from completiond.models.device import loadavg  # noqa: E402
from completiond.paths import cache_root  # noqa: E402


def busy_loops(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def temp_cache(real: Path, tmp: Path) -> Path:
    """A cache dir with the real one's models and kernels (linked) and its kernel choices (copied),
    but no pass-cost table."""
    cache = tmp / "cache"
    (cache / "calibration").mkdir(parents=True)
    for name in ("runtime", "models", "gguf", "kernels", "prompt-tables"):
        if (real / name).exists():
            (cache / name).symlink_to(real / name)
    for f in (real / "calibration").glob("*-*.json"):  # bf16-..., int8-kernel-...: not pass costs
        shutil.copy(f, cache / "calibration" / f.name)
    return cache


def calibrate(engine, rounds: int) -> dict[int, float]:
    return {n: round(ms, 2) for n, ms in engine.calibrate(B.QUICK_SIZES, rounds=rounds, origin="measured").items()}


async def status(sock: Path) -> dict:
    from completiond.service.client import Client

    c = await Client.connect(sock)
    try:
        return await c.request("status", {})
    finally:
        await c.close()


async def run(socks: list[Path], positions, completions: int, every: int, max_tokens: int
              ) -> tuple[list[list[dict]], list[float]]:
    """completions on each daemon, one request each in turn; per daemon its table every `every`
    completions; the first daemon's completion times."""
    from completiond.service.client import Client

    clients = [await Client.connect(s) for s in socks]
    for c in clients:
        await c.request("initialize", {"client": "heal-bench", "protocol": 1})

    async def checkpoint(k: int) -> list[dict]:
        return [{"completions": k, "loadavg": loadavg(), "table": (await c.request("status", {}))["pass_costs"]}
                for c in clients]

    checkpoints = [[cp] for cp in await checkpoint(0)]
    ms = []
    for k in range(completions):
        pos = positions[k % len(positions)]
        doc, _ = pos.document(read_text_file(pos.file) or "")
        uri = f"file:///heal/{k % len(positions)}/{pos.file.name}"
        for i, c in enumerate(clients):
            await c.request("document/open", {"uri": uri, "text": doc, "version": k, "language_id": "python"})
            t0 = time.perf_counter()
            await c.request("complete", {"uri": uri, "position": {"line": pos.line, "character": pos.col},
                                         "max_tokens": max_tokens})
            if i == 0:
                ms.append((time.perf_counter() - t0) * 1000)
            await c.request("document/close", {"uri": uri})
        if (k + 1) % every == 0 or k + 1 == completions:
            for per, cp in zip(checkpoints, await checkpoint(k + 1)):
                per.append(cp)
            print(f"{k + 1} completions: " + ", ".join(
                f"{n}: {e['ms']} ({e['source']}, {e['passes']})" for n, e in checkpoints[0][-1]["table"]["sizes"].items()),
                file=sys.stderr, flush=True)
    for c in clients:
        await c.close()
    return checkpoints, ms


def ratios(table: dict, before: dict[int, float], after: dict[int, float], min_passes: int,
           reference: dict | None = None) -> dict[str, float]:
    """Per size the daemon ran at least min_passes times: its estimate over the span of the honest
    prices (the quiet tables, and the reference daemon's estimate where it ran that size as often):
    1.0 inside the span, else over the nearer end."""
    out = {}
    for n, e in table["sizes"].items():
        if e["passes"] < min_passes:
            continue
        refs = [B._interpolate(sorted(t.items()), int(n)) for t in (before, after)]
        r = (reference or {}).get("sizes", {}).get(n)
        if r and r["passes"] >= min_passes:
            refs.append(r["ms"])
        lo, hi = min(refs), max(refs)
        out[n] = round(e["ms"] / hi if e["ms"] > hi else e["ms"] / lo if e["ms"] < lo else 1.0, 3)
    return out


def start_daemon(cache: Path, target: str, draft: str, tmp: Path, name: str) -> tuple[subprocess.Popen, Path]:
    sock = tmp / f"{name}.sock"
    env = {**os.environ, "COMPLETIOND_CACHE": str(cache), "COMPLETIOND_RECALIBRATE": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "completiond", "serve", "--socket", str(sock), "--target", target,
                             "--draft", draft, "--log-level", "WARNING"], env=env,
                            stdout=subprocess.DEVNULL, stderr=open(tmp / f"{name}.log", "wb"))
    return proc, sock


def wait_ready(proc: subprocess.Popen, sock: Path, log: Path) -> dict:
    deadline = time.time() + 900
    while True:
        if proc.poll() is not None or time.time() > deadline:
            raise SystemExit(f"the daemon did not start: {log.read_text()[-2000:]}")
        try:
            st = asyncio.run(status(sock))
            if st["state"] == "ready":
                return st
        except (OSError, ConnectionError):
            pass
        time.sleep(0.5)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-0.5b")
    ap.add_argument("--draft", default="default")
    ap.add_argument("--repo", default=str(ROOT / "completiond"), help="where completion positions are sampled")
    ap.add_argument("--completions", type=int, default=100)
    ap.add_argument("--every", type=int, default=25, help="read the daemon's table every N completions")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=6, help="rounds of each quiet calibration")
    ap.add_argument("--min-passes", type=int, default=B.WINDOW // 2, help="a size counts as used from this many passes")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout`: the daemon and busy loops are stopped too

    import torch

    from completiond.core.engine import Engine
    from completiond.models.loader import load

    real_cache = cache_root()
    tmp = Path(tempfile.mkdtemp(prefix="heal-"))
    cache = temp_cache(real_cache, tmp)
    target = load(a.target, "target", "auto", "auto", "auto")  # from the real cache, as the daemon will
    os.environ["COMPLETIOND_CACHE"] = str(cache)
    engine = Engine(target, None)
    path = C.calibration_path(target)
    print(f"threads {torch.get_num_threads()}, table {path}", file=sys.stderr)

    quiet_before = calibrate(engine, a.rounds)
    loops = busy_loops(os.cpu_count() or 2)
    try:
        time.sleep(1.0)
        loaded = calibrate(engine, 3)  # what a first start measures, in a bad minute
        loaded_meta = dict(engine.budget.table)
    finally:
        for p in loops:
            p.kill()
            p.wait()
    C.save_costs(path, loaded, loaded_meta)
    print(f"quiet {quiet_before}\nloaded {loaded} (others busy {loaded_meta['others_busy']})", file=sys.stderr)
    ref_cache = temp_cache(real_cache, tmp / "reference")
    C.save_costs(ref_cache / "calibration" / path.name, quiet_before,
                 {"measured_at": time.time(), "loadavg": loadavg(), "others_busy": 0.0})

    root, label = resolve_repo(a.repo)
    positions = sample_positions(root, min(a.completions, 50), "both", seed=0)
    procs = []
    try:
        for name, c in (("healed", cache), ("reference", ref_cache)):
            procs.append(start_daemon(c, a.target, a.draft, tmp, name))
        st = [wait_ready(p, sock, tmp / f"{name}.log") for (p, sock), name in zip(procs, ("healed", "reference"))][0]
        per_daemon, ms = asyncio.run(run([sock for _, sock in procs], positions, a.completions, a.every, a.max_tokens))
        checkpoints, ref_checkpoints = per_daemon
        info = {k: st.get(k) for k in ("target", "draft", "device", "dtype", "quant", "backend")}
    finally:
        for p, _ in procs:
            p.terminate()
            p.wait(timeout=60)
    quiet_after = calibrate(engine, a.rounds)

    first, last = checkpoints[0]["table"], checkpoints[-1]["table"]
    ref_last = ref_checkpoints[-1]["table"]
    end_ratios = ratios(last, quiet_before, quiet_after, a.min_passes, ref_last)
    prev = checkpoints[-2]["table"]["sizes"] if len(checkpoints) > 1 else {}
    chosen_last = {n: (e["passes"] - e["probes"]) - (prev.get(n, {}).get("passes", 0) - prev.get(n, {}).get("probes", 0))
                   for n, e in last["sizes"].items()}
    result = {
        "command": "python " + " ".join(sys.argv), "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()} cores, threads {torch.get_num_threads()}, shared with other work",
        "cpu": C.cpu_key(), **info, "repo": label, "completions": a.completions, "max_tokens": a.max_tokens,
        "loaded_table": {str(k): v for k, v in loaded.items()}, "loaded_meta": loaded_meta,
        "quiet_before": {str(k): v for k, v in quiet_before.items()},
        "quiet_after": {str(k): v for k, v in quiet_after.items()},
        "start_source": {n: e["source"] for n, e in first["sizes"].items()},
        "checkpoints": [{"completions": c["completions"], "loadavg": c["loadavg"],
                         "ms": {n: e["ms"] for n, e in c["table"]["sizes"].items()},
                         "passes": {n: e["passes"] for n, e in c["table"]["sizes"].items()},
                         "probes": {n: e["probes"] for n, e in c["table"]["sizes"].items()},
                         "ratio_vs_honest": ratios(c["table"], quiet_before, quiet_after, a.min_passes, r["table"])}
                        for c, r in zip(checkpoints, ref_checkpoints)],
        "reference_checkpoints": [{"completions": r["completions"],
                                   "ms": {n: e["ms"] for n, e in r["table"]["sizes"].items()},
                                   "passes": {n: e["passes"] for n, e in r["table"]["sizes"].items()}}
                                  for r in ref_checkpoints],
        "end_table": last,
        "reference_end_table": ref_last,
        "end_ratio_vs_honest": end_ratios,
        "max_end_ratio": max((max(r, 1 / r) for r in end_ratios.values()), default=None),
        "within_1_3x": all(1 / 1.3 <= r <= 1.3 for r in end_ratios.values()),
        "chosen_above_2_since_last_checkpoint": sum(v for n, v in chosen_last.items() if int(n) > 2),
        "p50_completion_ms": sorted(ms)[len(ms) // 2] if ms else None,
    }
    text = json.dumps(result, indent=2)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(text + "\n")
    print(json.dumps({k: result[k] for k in ("loaded_table", "quiet_before", "quiet_after", "end_ratio_vs_honest",
                                             "max_end_ratio", "within_1_3x", "chosen_above_2_since_last_checkpoint")},
                     indent=1))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
