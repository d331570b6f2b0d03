"""Start and stop a real `completiond serve` process for tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path


def start_daemon(sock: Path, target: Path, *extra: str, env: dict | None = None, wait: bool = True,
                 log: Path | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "completiond", "serve", "--socket", str(sock), "--target", str(target),
           "--draft", "self:1", "--dtype", "float32", "--log-level", "WARNING", *extra]
    out = open(log, "wb") if log else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT if log else subprocess.PIPE,
                            env={**os.environ, **(env or {})})
    if wait:
        wait_for_socket(sock, proc)
    return proc


def wait_for_socket(sock: Path, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """Until the daemon accepts connections (a stale socket file may exist before it binds)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(sock))
            return
        except OSError:
            pass
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise RuntimeError(f"daemon exited with {proc.returncode}: {err[-2000:]}")
        time.sleep(0.05)
    raise TimeoutError("daemon did not create its socket")


def stop_daemon(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()
