"""The socket path (issue 13 point 7): what `serve` may delete, who wins a race, a hung daemon."""

import os
import socket
import subprocess
import sys

import pytest

from completiond.service.transport import SocketLock, StartError, check_socket
from daemon_util import start_daemon, stop_daemon, wait_for_socket


def serve(sock, target, *extra) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "completiond", "serve", "--socket", str(sock), "--target", str(target), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_socket_path_at_a_regular_file_is_refused_and_kept(tmp_path, tiny_dir):
    victim = tmp_path / "notes.txt"
    victim.write_text("precious\n")
    res = serve(victim, tiny_dir)
    assert res.returncode == 2 and "not a socket" in one_line(res.stderr)
    assert victim.read_text() == "precious\n" and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_second_serve_loses_before_loading_any_model(tmp_path):
    """While another serve holds the path's lock, a serve with a target that does not exist says
    'already running': the lock is taken before the model load would have failed."""
    sock = tmp_path / "d.sock"
    held = SocketLock(sock)
    held.acquire()
    try:
        res = serve(sock, tmp_path / "no-such-model")
    finally:
        held.release()
    assert res.returncode == 2 and "already running" in one_line(res.stderr)
    res = serve(sock, tmp_path / "no-such-model")  # lock free: now it gets as far as the model
    assert res.returncode == 2 and "already running" not in res.stderr


def test_busy_daemon_is_not_stale(tmp_path):
    """A listener whose accept queue is full does not answer in time: its socket must stay."""
    sock = tmp_path / "d.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(sock))
    listener.listen(0)
    fillers = []
    try:
        while True:  # fill the accept queue (nobody accepts)
            s = socket.socket(socket.AF_UNIX)
            s.setblocking(False)
            try:
                s.connect(str(sock))
            except (BlockingIOError, OSError):
                s.close()
                break
            fillers.append(s)
            assert len(fillers) < 1000
        with pytest.raises(StartError, match="does not answer"):
            check_socket(sock)
        assert sock.exists()
    finally:
        for s in fillers:
            s.close()
        listener.close()


def test_status_of_a_hung_daemon_is_one_line(tmp_path):
    sock = tmp_path / "d.sock"
    listener = socket.socket(socket.AF_UNIX)  # accepts into its queue, never answers
    listener.bind(str(sock))
    listener.listen(8)
    try:
        res = subprocess.run([sys.executable, "-m", "completiond", "status", "--socket", str(sock), "--timeout", "1"],
                             capture_output=True, text=True, timeout=120)
    finally:
        listener.close()
    assert res.returncode == 1 and "did not answer" in one_line(res.stderr)


def test_two_serves_at_once_and_a_stopping_daemon_leaves_a_newer_socket(tmp_path, tiny_dir):
    sock = tmp_path / "d.sock"
    a = start_daemon(sock, tiny_dir, wait=False)
    b = start_daemon(sock, tiny_dir, wait=False)
    try:
        # exactly one exits, with one line; the other serves
        while a.poll() is None and b.poll() is None:
            try:
                b.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
        loser, winner = (a, b) if a.poll() is not None else (b, a)
        assert loser.wait() == 2 and "already running" in one_line(loser.stderr.read().decode())
        wait_for_socket(sock, winner)
        # a newer daemon took the path (the old socket was removed under the running one)
        sock.unlink()
        newer = socket.socket(socket.AF_UNIX)
        newer.bind(str(sock))
        newer.listen(1)
        ino = os.stat(sock).st_ino
        assert stop_daemon(winner) == 0
        assert sock.exists() and os.stat(sock).st_ino == ino  # the stopping daemon left it alone
        newer.close()
    finally:
        stop_daemon(a)
        stop_daemon(b)
