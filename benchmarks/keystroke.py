"""Keystroke latency, side by side in one run: the same lines typed character by
character (120 ms/char) through real `completiond serve` daemons, one per code version, one after
the other on this machine; time from each keystroke to its first streamed token, and after the
last keystroke of each line (what a user waits for when they pause). With --accept the user then
accepts the suggestion and the editor asks again (ms to that first token). Each run also reports
the daemon's CPU time per keystroke and the stale work `status` counted (cancelled passes, warm-ups).

    python -m benchmarks.keystroke --repo pypi:toolz==1.0.0 --lines 8 --baseline /tmp/old-checkout \\
        --json benchmarks/results/keystroke-toolz.json --plot benchmarks/results/keystroke-toolz.png

--baseline is a checkout of an older completiond (its package dir is put first on PYTHONPATH of
that daemon); the current one is this checkout. Both use the serve defaults (CPU: the 0.5B, int8).
--cold adds a run of the current daemon in which typing starts as soon as the file is open;
--no-quick a run of the current daemon (cursor sent) with the quick prompt switched off.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from completiond.bench.replay import _type_line  # noqa: E402
from completiond.bench.repo import read_text_file, resolve_repo, sample_positions  # noqa: E402
from completiond.service.client import Client  # noqa: E402
from completiond.models.device import cpu_name  # noqa: E402


def p(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)), 1) if xs else None


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def type_lines(sock: Path, positions, pause_s: float, max_tokens: int, cursor: bool, accept: bool,
                     pid: int) -> dict:
    client = await Client.connect(sock)
    await client.request("initialize", {"client": "keystroke-bench", "protocol": 1})
    table_start = (await client.request("status", {})).get("pass_costs")  # the pass-cost table it starts with
    ttft, final, accepted, served, requests, first_answer, lanes, served_ms = [], [], [], 0, 0, [], [], []
    accept_served = accept_passes = 0
    first_detail: list[dict] = []  # per file: which keystroke answered first, what the pause had warmed
    cpu0 = cpu_s(pid)
    for i, pos in enumerate(positions):
        r = await _type_line(client, f"file:///bench/{i}/{pos.file.name}", pos, read_text_file(pos.file) or "",
                             True, max_tokens, pause_s, cursor, accept)
        ttft += r["ttft"]
        final += r["final"]
        served += r.get("served", 0)
        first_answer += [r["first_answer_ms"]] if "first_answer_ms" in r else []
        first_detail += [{"ms": round(r["first_answer_ms"], 1), **r["first_answer"]}] if "first_answer" in r else []
        lanes += r.get("lanes", [])
        served_ms += r.get("served_ms", [])
        requests += r["requests"]
        if "after_accept_ms" in r:
            accepted.append(r["after_accept_ms"])
            accept_served += r["after_accept_served"]
            accept_passes += r["after_accept_passes"]
    cpu = cpu_s(pid) - cpu0
    status = await client.request("status", {})
    stale = status.get("stale")  # older daemons: None
    await client.close()
    out = {"p50_first_token_ms": p(ttft, 50), "p95_first_token_ms": p(ttft, 95),
           "p50_final_keystroke_ms": p(final, 50), "p95_final_keystroke_ms": p(final, 95),
           "final_keystroke_ms": [round(x, 1) for x in final], "requests": requests,
           "answered_with_tokens": len(ttft), "served_from_memory": served,
           "daemon_cpu_s": round(cpu, 1), "cpu_ms_per_keystroke": round(cpu * 1000 / max(requests, 1), 1),
           "stale_work": stale, "pass_cost_ms": status.get("pass_cost_ms"),
           # the tree budget's table at the start and the end (per size: ms, source, passes, probes)
           "pass_costs_start": table_start, "pass_costs": status.get("pass_costs"),
           # from a line's first keystroke to the first ghost text in that file (typing starts --pause s
           # after opening it): the cold-file wait
           "p50_first_answer_ms": p(first_answer, 50), "p95_first_answer_ms": p(first_answer, 95),
           "first_answer_ms": [round(x, 1) for x in first_answer], "first_answer_detail": first_detail,
           "answers_by_prompt_lane": {k: lanes.count(k) for k in sorted(set(lanes))},
           # typed through a suggestion: the daemon's ms from the request to the served text
           "p50_served_daemon_ms": p(served_ms, 50), "p95_served_daemon_ms": p(served_ms, 95)}
    if accept:
        out.update({"p50_after_accept_ms": p(accepted, 50), "p95_after_accept_ms": p(accepted, 95),
                    "after_accept_ms": [round(x, 1) for x in accepted], "after_accept_served": accept_served,
                    "after_accept_passes": accept_passes})
    return out


def run_daemon(pythonpath: str | None, positions, a, cursor: bool = False, pause: float | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        sock = Path(tmp) / "d.sock"
        env = os.environ.copy()
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        proc = subprocess.Popen([sys.executable, "-m", "completiond", "serve", "--socket", str(sock),
                                 "--log-level", "WARNING", *a.serve_arg], env=env, cwd=tmp,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.time() + 900
            while True:  # until the models are in: a request answers (older daemons bind late)
                try:
                    asyncio.run(asyncio.wait_for(ready(sock), 600))
                    break
                except (OSError, ConnectionError, asyncio.TimeoutError):
                    if proc.poll() is not None or time.time() > deadline:
                        raise RuntimeError("the daemon did not start")
                    time.sleep(0.5)
            return asyncio.run(type_lines(sock, positions, a.pause if pause is None else pause, a.max_tokens,
                                          cursor, a.accept, proc.pid))
        finally:
            proc.terminate()
            proc.wait(timeout=60)


async def ready(sock: Path) -> None:
    c = await Client.connect(sock)
    try:
        await c.request("initialize", {"client": "keystroke-bench", "protocol": 1})
        await c.request("document/open", {"uri": "file:///probe.py", "text": "x = 1\n", "version": 0})
        await c.request("complete", {"uri": "file:///probe.py", "position": {"line": 1, "character": 0},
                                     "max_tokens": 1})
    finally:
        await c.close()


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["runs"])
    fig, ax = plt.subplots(figsize=(7, 4))
    keys = ["p50_first_token_ms", "p50_final_keystroke_ms", "p95_final_keystroke_ms", "p50_after_accept_ms"]
    w = 0.2
    for j, k in enumerate(keys):
        ax.bar([i + j * w for i in range(len(names))], [result["runs"][n].get(k) or 0 for n in names], w, label=k)
    ax.set_xticks([i + 1.5 * w for i in range(len(names))], names, fontsize=8)
    ax.set_ylabel("ms")
    ax.set_title(f"keystroke -> first token, {result['repo']} ({result['cpu']})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", default="pypi:toolz==1.0.0")
    ap.add_argument("--lines", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pause", type=float, default=3.0, help="seconds between opening a file and typing")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--baseline", default=None, help="an older checkout to compare with")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra `serve` argument (repeatable)")
    ap.add_argument("--cursor", action="store_true",
                    help="also run the current daemon with the editor's cursor sent after opening (document/cursor)")
    ap.add_argument("--accept", action="store_true", help="accept each line's last suggestion and ask again")
    ap.add_argument("--cold", action="store_true", help="also a run that types as soon as the file is open")
    ap.add_argument("--no-quick", action="store_true",
                    help="also run the current daemon (with the cursor) without the quick prompt")
    ap.add_argument("--cursor-only", action="store_true", help="only the run with the cursor sent")
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    a = ap.parse_args()
    root, label = resolve_repo(a.repo)
    positions = [x for x in sample_positions(root, a.lines * 3, "line-start", a.seed) if len(x.reference) >= 8][:a.lines]
    runs = {}
    if a.baseline:
        runs["baseline"] = run_daemon(str(Path(a.baseline).resolve()), positions, a)
    if not a.cursor_only:
        runs["current"] = run_daemon(str(ROOT), positions, a)
    if a.cursor or a.cursor_only:
        runs["current+cursor"] = run_daemon(str(ROOT), positions, a, cursor=True)
    if a.cold:
        runs["current, typing at once"] = run_daemon(str(ROOT), positions, a, cursor=a.cursor, pause=0.0)
    if a.no_quick:  # the same daemon with the quick prompt switched off (every completion the full prompt)
        a.serve_arg = [*a.serve_arg, "--quick-prompt-ms=-1"]
        runs["current+cursor, no quick prompt"] = run_daemon(str(ROOT), positions, a, cursor=True)
    result = {"date": datetime.date.today().isoformat(), "command": " ".join(["python"] + sys.argv),
              "repo": label, "cpu": cpu_name(), "load_average": os.getloadavg(), "lines": len(positions),
              "typed_chars": sum(len(x.reference) for x in positions), "pause_after_open_s": a.pause,
              "runs": runs}
    print(json.dumps(result, indent=2))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    if a.plot:
        plot(result, Path(a.plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
