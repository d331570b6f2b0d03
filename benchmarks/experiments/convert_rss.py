"""Peak memory of a first start's GGUF conversion, the streaming converter against the transformers
path it replaced, and the daemon's memory after a converting start against a converted one.

    flock /work/wt/CONVERT.lock python -m benchmarks.experiments convert_rss --target qwen2.5-coder-0.5b \
        [--quant int8] [--dtype float32] [--old] [--daemon] [--json benchmarks/results/convert-rss.json]

Each conversion runs as its own process under `/usr/bin/time -v` (its "Maximum resident set size")
into a scratch cache (--cache, the assembled GGUF hard-linked into it): the new one is
`python -m completiond.models.convert` (what a start runs in its child process), the old one
(--old) tests/tiny_gguf.convert_with_transformers (transformers de-quantizes the whole GGUF into a
float32 checkpoint, loads it in the dtype, quantizes, saves). Both write their files' sha256: the
JSON says whether they are the same bytes. --daemon: `completiond serve` on an empty scratch cache
(it converts and calibrates; the phases and progress its `status` reported are recorded) and again
on the converted one: RSS once ready. --calibrated (after --daemon): the runtime form removed, a
start that converts with its calibration cached, then a converted start: what converting itself
leaves in the daemon. Results are merged into --json under the target and form.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.startup import cpu_name, mem_mb, status

ROOT = Path(__file__).resolve().parents[2]

OLD = """
import json, torch
from pathlib import Path
from tiny_gguf import convert_with_transformers  # tests/ is on PYTHONPATH (see below)
print('digests ' + json.dumps(convert_with_transformers(Path({gguf!r}), Path({out!r}), torch.{dtype}, {scheme!r})))
"""


def timed(cmd: list[str], env: dict) -> dict:
    """Run cmd under /usr/bin/time -v: peak RSS (MB), wall seconds, the digests it printed."""
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-v", *cmd], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode:
        raise RuntimeError(f"{cmd[:4]} failed ({p.returncode}): {p.stderr[-3000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr).group(1))
    cpu = sum(float(re.search(rf"{k} time \(seconds\): ([\d.]+)", p.stderr).group(1)) for k in ("User", "System"))
    digests = next(json.loads(ln[8:]) for ln in p.stdout.splitlines() if ln.startswith("digests "))
    return {"peak_rss_mb": round(rss / 1024, 1), "peak_rss_gb": round(rss * 1024 / 1e9, 2), "wall_s": round(wall, 1),
            "cpu_s": round(cpu, 1), "loadavg_1min_after": round(os.getloadavg()[0], 1), "digests": digests}


def serve(cache: Path, target: str, quant: str, dtype: str, env: dict) -> dict:
    """`completiond serve` until ready: the phases (and progress) status reported, RSS at ready."""
    sock = cache / "d.sock"
    log = open(cache / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "completiond", "serve", "--socket", str(sock), "--target", target,
                             "--draft", "none", "--quant", quant, "--dtype", dtype], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=log)
    t0, seen = time.perf_counter(), []
    try:
        while time.perf_counter() - t0 < 1200:
            if proc.poll() is not None:
                raise RuntimeError(f"serve exited: {(cache / 'serve.log').read_text()[-2000:]}")
            try:
                st = status(sock)
            except OSError:
                time.sleep(0.2)
                continue
            shown = (st.get("phase"), st.get("progress"))
            if st.get("state") == "loading" and (not seen or seen[-1] != list(shown)):
                seen.append(list(shown))
            if st.get("state") == "ready":
                time.sleep(2)  # the weights' move into huge pages settles
                return {"ready_s": round(time.perf_counter() - t0, 1), "rss_ready_mb": mem_mb(proc.pid),
                        "status_seen": seen[:3] + (["..."] if len(seen) > 6 else []) + seen[-3:] if len(seen) > 6
                        else seen, "status_updates": len(seen)}
            time.sleep(0.5)
        raise TimeoutError("the daemon did not become ready")
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-0.5b")
    ap.add_argument("--quant", default="int8")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--cache", default="/tmp/b68cache")
    ap.add_argument("--old", action="store_true", help="also convert with the transformers path")
    ap.add_argument("--no-new", action="store_true", help="skip the streaming conversion (kept from an earlier run)")
    ap.add_argument("--daemon", action="store_true", help="also compare a first start with a converted one")
    ap.add_argument("--calibrated", action="store_true",
                    help="after --daemon: a converting start whose calibration is cached against a converted one")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "convert-rss.json"))
    a = ap.parse_args()
    from completiond.models.loader import named_gguf

    gguf = named_gguf(a.target)
    cache = Path(a.cache)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'lsp'}", "TRANSFORMERS_VERBOSITY": "error",
           "COMPLETIOND_CACHE": str(cache)}
    out: dict = {"target": a.target, "quant": a.quant, "dtype": a.dtype, "gguf_bytes": gguf.stat().st_size,
                 "cpu": cpu_name(), "cores": os.cpu_count(), "mem_total_gb": round(
                     os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2 ** 30, 1),
                 "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    path = Path(a.json)
    runs = json.loads(path.read_text()) if path.exists() else {}
    key = f"{a.target}@{a.quant}-{a.dtype}"
    out = {**runs.get(key, {}), **out}
    out["commands"] = out.get("commands", []) + ["flock /work/wt/CONVERT.lock nice -n 5 python " + " ".join(sys.argv)]

    def save() -> None:  # after each step: a long run stopped midway keeps what it measured
        if "old" in out and "new" in out:  # the latest of each (they may come from separate runs)
            out["same_bytes"] = out["old"]["digests"] == out["new"]["digests"]
            out["peak_rss_ratio_new_over_old"] = round(out["new"]["peak_rss_mb"] / out["old"]["peak_rss_mb"], 3)
        runs[key] = out
        path.write_text(json.dumps(runs, indent=1) + "\n")

    with tempfile.TemporaryDirectory(dir=cache.parent) as scratch:
        if not a.no_new:
            new_dir = Path(scratch) / "new"
            out["new"] = timed([sys.executable, "-m", "completiond.models.convert", str(gguf), str(new_dir), a.dtype,
                                a.quant], env)
            out["new_command"] = f"python -m completiond.models.convert {gguf.name} DIR {a.dtype} {a.quant}"
            print("new", {k: v for k, v in out["new"].items() if k != "digests"}, flush=True)
            shutil.rmtree(new_dir)
            save()
        if a.old:
            old_dir = Path(scratch) / "old"
            old_dir.mkdir()
            code = OLD.format(gguf=str(gguf), out=str(old_dir), dtype=a.dtype, scheme=a.quant)
            out["old"] = timed([sys.executable, "-c", code], {**env, "PYTHONPATH": f"{env['PYTHONPATH']}:{ROOT / 'tests'}"})
            save()
            print("old", {k: v for k, v in out["old"].items() if k != "digests"}, "same bytes:", out["same_bytes"],
                  flush=True)
            shutil.rmtree(old_dir)
            save()
    if a.daemon and not a.calibrated:  # an empty cache but for the assembled GGUF (hard-linked) and the kernels
        shutil.rmtree(cache, ignore_errors=True)
        (cache / "gguf").mkdir(parents=True, mode=0o700)
        cache.chmod(0o700)
        for f in gguf.parent.glob(f"{gguf.stem}.*"):
            if f.suffix in (".gguf", ".verified"):
                os.link(f, cache / "gguf" / f.name)
        built = Path.home() / ".cache" / "completiond" / "kernels"  # not what is measured: not rebuilt
        if built.is_dir():
            shutil.copytree(built, cache / "kernels")
        first = serve(cache, a.target, a.quant, a.dtype, env)  # converts and calibrates
        again = serve(cache, a.target, a.quant, a.dtype, env)
        out["daemon"] = {"first_start": first, "converted_start": again,
                         "rss_ratio_first_over_converted": round(
                             first["rss_ready_mb"]["VmRSS"] / again["rss_ready_mb"]["VmRSS"], 3)}
        print("daemon", json.dumps(out["daemon"]), flush=True)
        save()
    if a.calibrated:  # the cache of a --daemon run without its runtime form: converts, calibration cached
        shutil.rmtree(cache / "runtime")
        converting = serve(cache, a.target, a.quant, a.dtype, env)
        converted = serve(cache, a.target, a.quant, a.dtype, env)
        out["daemon_calibrated"] = {"converting_start": converting, "converted_start": converted,
                                    "rss_ratio_converting_over_converted": round(
                                        converting["rss_ready_mb"]["VmRSS"] / converted["rss_ready_mb"]["VmRSS"], 3)}
        print("daemon_calibrated", json.dumps(out["daemon_calibrated"]), flush=True)
        save()


if __name__ == "__main__":
    main()
