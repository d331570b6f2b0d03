"""Fuzz the real `completiond-lsp`: thousands of malformed and out-of-order LSP messages
through its stdio, against a real `completiond serve`; every request must be answered (result or
error), the server must stay up and still complete afterwards.

    python -m benchmarks.lsp_fuzz [--target qwen2.5-coder-0.5b] [--messages 2000] [--seed 38]

Messages (tests/lsp_util.fuzz_messages): document opens, valid / out-of-range / backwards / older-
version / malformed edits, closes of unopened documents, inline completions at good and bad positions
and with mutated params, `$/cancelRequest` interleaved with them, unknown methods, code actions and
rewrite commands with junk arguments, junk settings, a second `initialize`, bodies that are no JSON,
and a document over the daemon's 4 MiB limit every `--huge-every` messages. Writes
benchmarks/results/lsp_fuzz-<model>.json (CPU named; the machine may have been shared).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from tests.daemon_util import wait_for_socket, wait_ready  # noqa: E402
from tests.lsp_util import RawLsp, doc_item, fuzz_messages, position_params, run_fuzz  # noqa: E402


async def fuzz(sock: Path, a: argparse.Namespace, log_file: Path) -> dict:
    lsp = await RawLsp.start(log_file=log_file, env={"PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(ROOT / "lsp"), os.environ.get("PYTHONPATH", "")])})
    await lsp.initialize({"socket": str(sock), "autostart": False, "debounceMs": 0, "maxTokens": a.max_tokens})
    t0 = time.perf_counter()
    out = await run_fuzz(lsp, fuzz_messages(a.messages, seed=a.seed, huge_every=a.huge_every),
                         answer_timeout=a.answer_timeout)
    out["fuzz_wall_s"] = round(time.perf_counter() - t0, 1)
    # afterwards: a clean document still completes
    t = time.perf_counter()
    lsp.notify("textDocument/didOpen", doc_item("file:///after.py", "def mean(xs):\n    return "))
    res = await lsp.call("textDocument/inlineCompletion", position_params("file:///after.py", 1, 11), 300)
    out["after"] = {"ok": "result" in res, "ms": round((time.perf_counter() - t) * 1000, 1),
                    "text": (res.get("result") or {}).get("items", [{}])[0].get("insertText") if "result" in res
                    else res.get("error")}
    out["internal_errors"] = out["answers"].get("-32603", 0)
    out["lsp_exit"] = await lsp.close()
    return out


def main(a: argparse.Namespace) -> dict:
    from completiond.models.device import cpu_name

    tmp = Path(tempfile.mkdtemp(prefix="completiond-lsp-fuzz-"))
    sock = tmp / "d.sock"
    cmd = [sys.executable, "-m", "completiond", "serve", "--socket", str(sock), "--target", a.target,
           "--log-level", "WARNING", *shlex.split(a.serve_args)]
    log = open(tmp / "daemon.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    out: dict = {"target": a.target, "messages": a.messages, "seed": a.seed, "cpu": cpu_name(),
                 "cpu_count": os.cpu_count(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "command": " ".join(["python", *sys.argv])}
    try:
        wait_for_socket(sock, proc, 900)
        wait_ready(sock, proc, 1800)
        out.update(asyncio.run(fuzz(sock, a, tmp / "lsp.log")))
        out["daemon_alive"] = proc.poll() is None
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
        out["daemon_alive"] = proc.poll() is None
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)
        log.close()
        out["daemon_exit"] = proc.returncode
    out["ok"] = bool(not out.get("error") and out.get("answered") == out.get("requests") and out.get("server_alive")
                     and out.get("daemon_alive") and out.get("internal_errors") == 0 and out.get("after", {}).get("ok"))
    if out["ok"]:
        shutil.rmtree(tmp, ignore_errors=True)  # the logs stay only when something went wrong
    else:
        out["logs"] = str(tmp)
    return out


def cli() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-0.5b")
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=38)
    ap.add_argument("--huge-every", type=int, default=400, help="a document over 4 MiB every N messages (0: none)")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--answer-timeout", type=float, default=900.0, help="s after the last message")
    ap.add_argument("--serve-args", default="", help="more `completiond serve` arguments, one string: "
                                                     "--serve-args='--device cpu'")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    out = main(a)
    model = re.sub(r"[^\w.-]+", "_", Path(a.target).name)
    path = Path(a.out) if a.out else ROOT / "benchmarks" / "results" / f"lsp_fuzz-{model}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out.get(k) for k in ("ok", "messages", "requests", "answered", "answers", "internal_errors",
                                              "server_alive", "daemon_alive", "fuzz_wall_s", "answer_s", "after")},
                     indent=1))
    print(f"wrote {path}")
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(cli())
