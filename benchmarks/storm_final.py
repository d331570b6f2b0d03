"""What the final request of a keystroke storm spends its time on (issue 13): the soak's storm text,
4 bursts of 2 s at ~200 Hz against a real daemon (serve defaults, --draft none); after each burst,
ms from the last keystroke to the answer, and the answer's own fields (prompt tokens, how many were
already cached, passes, ms to its first token). One run, printed.

    python benchmarks/storm_final.py
"""
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from soak import SOURCE, TYPED, connect, wait_ready  # noqa: E402


async def main():
    tmp = Path(tempfile.mkdtemp()); sock = tmp / "d.sock"
    proc = subprocess.Popen([sys.executable, "-m", "completiond", "serve", "--socket", str(sock), "--draft", "none", "--log-level", "WARNING"], cwd=ROOT)
    try:
        await wait_ready(sock, proc, 600)
        c = await connect(sock)
        uri = "file:///soak/storm.py"
        text = SOURCE + "\n\ndef soak(values, weights):\n    total = 0\n    for i, value in enumerate(values):\n"
        await c.request("document/open", {"uri": uri, "text": text, "version": 1})
        line, col, version, typed = text.count("\n"), 0, 1, 0
        await c.request("complete", {"uri": uri, "version": 1, "max_tokens": 8, "position": {"line": line, "character": 0}}, timeout=600)
        for rnd in range(4):
            t_end = time.perf_counter() + 2.0; last = None
            while time.perf_counter() < t_end:
                ch = TYPED[typed % len(TYPED)]; typed += 1; version += 1
                await c.notify("document/change", {"uri": uri, "version": version, "changes": [{"range": {"start": {"line": line, "character": col}, "end": {"line": line, "character": col}}, "text": ch}]})
                line, col = (line + 1, 0) if ch == "\n" else (line, col + 1)
                _, last = c.send_request("complete", {"uri": uri, "version": version, "max_tokens": 8, "position": {"line": line, "character": col}})
                t_last = time.perf_counter()
                await asyncio.sleep(0.005)
            res = await asyncio.wait_for(last, 120)
            print(round((time.perf_counter() - t_last) * 1000), {k: res.get(k) for k in ("prompt_tokens", "reused_tokens", "served_tokens", "target_passes", "ms_first_token", "ms_total", "text")}, flush=True)
        await c.close()
    finally:
        proc.terminate(); proc.wait()


asyncio.run(main())
