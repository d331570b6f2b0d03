"""Sockets and the byte stream: claiming the socket path, binding, reading frames off a connection.

Claiming comes before the slow model load: a lock file next to the socket decides which of two
`serve` on one path runs; a socket is only judged stale when connecting to it is refused (a busy
daemon is not stale); and a stopping daemon removes its socket only if the path still holds the
socket it bound.
"""

from __future__ import annotations

import asyncio
import fcntl
import ipaddress
import logging
import os
import shlex
import socket
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgpack

from ..paths import UnsafeDirError, private_dir, socket_path
from . import protocol as P
from .session import Session

log = logging.getLogger("completiond.daemon")
AUTH_TIMEOUT_S = 5.0  # a TCP peer has this long to send a valid initialize
MAX_PENDING_AUTH = 16  # unauthenticated TCP connections held at once (beyond it the oldest are dropped)
WAITING_GRACE_S = 0.2  # a new TCP connection has this long to have its initialize handled before it may be dropped
MAX_AUTH_BYTES = 256 * 1024  # bytes a TCP peer may send before it is authenticated


class StartError(Exception):
    """The daemon cannot start (live daemon on the socket, bad directory, bad TCP address)."""


# ---- the socket path ----------------------------------------------------------------------------
class SocketLock:
    """An exclusive flock on `<socket>.lock`, held for the daemon's life (the kernel drops it on exit)."""

    def __init__(self, sock: Path):
        self.sock = sock
        self.path = sock.with_name(sock.name + ".lock")
        self.fd: int | None = None

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise StartError(f"cannot open lock file {self.path}: {e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StartError(f"a daemon is already running (or starting) on {self.sock} "
                             f"(use `{stop_command(self.sock)}` first)") from None
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def claim(path: Path) -> SocketLock:
    """Make the private directory, take the path's lock, clear a stale socket; before any model loads."""
    d = path.parent
    try:  # our own directory is made private; another one must already be (the cache gets the same check)
        private_dir(d, "socket directory", tighten=d.name in ("completiond", f"completiond-{os.getuid()}"))
    except UnsafeDirError as e:
        raise StartError(str(e)) from None
    _socket_or_nothing(path)  # before the lock file appears next to, say, a user's regular file
    lock = SocketLock(path)
    lock.acquire()
    try:
        check_socket(path)
    except StartError:
        lock.release()
        raise
    return lock


def check_socket(path: Path) -> None:
    """Refuse a live daemon or a non-socket on `path`; remove a socket whose connections are refused."""
    if not _socket_or_nothing(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):  # nobody listens: left by a crashed daemon
        log.info("removing stale socket %s", path)
        path.unlink(missing_ok=True)
        return
    except OSError as e:  # a timeout or a full accept queue: alive but busy, or hung
        raise StartError(f"a daemon on {path} does not answer ({e.strerror or 'timed out'}); not removing its "
                         f"socket (stop that daemon or choose another --socket)") from None
    finally:
        probe.close()
    raise StartError(f"a daemon is already running on {path} (use `{stop_command(path)}` first)")


def stop_command(sock: Path) -> str:
    """The command that stops the daemon on `sock`, as a message prints it (it runs as printed)."""
    return "completiond stop" if Path(sock) == socket_path() else f"completiond stop --socket {shlex.quote(str(sock))}"


def _socket_or_nothing(path: Path) -> bool:
    """True if a socket sits at `path`, False if nothing does; StartError for anything else."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(st.st_mode):
        raise StartError(f"{path} exists and is not a socket: not replacing it (choose another --socket)")
    return True


def bind_unix(path: Path) -> tuple[socket.socket, tuple[int, int]]:
    """A listening 0600 socket at `path`, and its (device, inode) to recognise it at shutdown."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # created 0600: only this user may connect
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    st = os.lstat(path)
    sock.listen(64)
    sock.setblocking(False)
    return sock, (st.st_dev, st.st_ino)


def remove_own(path: Path, ident: tuple[int, int]) -> None:
    """Unlink `path` only if it is still the socket this daemon bound (not a newer daemon's)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if (st.st_dev, st.st_ino) == ident:
        path.unlink(missing_ok=True)
    else:
        log.warning("%s is no longer this daemon's socket: leaving it", path)


def parse_loopback(spec: str, flag: str = "--tcp") -> tuple[str, int]:
    """`FLAG HOST:PORT` with a loopback IP (--tcp, --http: the daemon serves one user, not a network)."""
    host, _, port = spec.rpartition(":")
    host = host.strip("[]")
    try:
        ip = ipaddress.ip_address(host)
        port_n = int(port)
    except ValueError:
        raise StartError(f"{flag} wants HOST:PORT with a loopback IP, got {spec!r}") from None
    if not ip.is_loopback:
        raise StartError(f"{flag} {host}: only loopback addresses (127.0.0.0/8, ::1) are allowed")
    if not 0 < port_n < 65536:
        raise StartError(f"{flag} port {port_n} out of range")
    return host, port_n


def parse_tcp(spec: str) -> tuple[str, int]:
    return parse_loopback(spec, "--tcp")


# ---- the byte stream ----------------------------------------------------------------------------
async def read_frames(reader: asyncio.StreamReader, session: Session,
                      dispatch: Callable[[Session, object], Awaitable[None]], max_frame_bytes: int,
                      auth_timeout: float = AUTH_TIMEOUT_S) -> None:
    """Decode frames and dispatch each in order until the peer closes or the stream cannot resync.

    Frames decoded before a malformed one are answered first. A peer that is not authenticated has
    `auth_timeout` seconds and MAX_AUTH_BYTES bytes to send a valid initialize.
    """
    unpacker = P.unpacker(max_frame_bytes)
    loop = asyncio.get_running_loop()
    auth_deadline = loop.time() + auth_timeout
    while not session.closed:
        if session.authed:
            data = await reader.read(65536)
        else:
            try:
                data = await asyncio.wait_for(reader.read(65536), max(0.0, auth_deadline - loop.time()))
            except asyncio.TimeoutError:
                return _fail(session, f"no valid initialize within {auth_timeout:g} s: closing")
        if not data:
            return
        session.received += len(data)
        try:
            unpacker.feed(data)
        except msgpack.BufferFull:
            return _fail(session, f"frame over {max_frame_bytes} bytes")
        while not session.closed:
            try:
                obj = next(unpacker)
            except StopIteration:  # the rest of a frame is still to come
                break
            except Exception as e:  # not msgpack, or nested too deep: the stream cannot be resynchronised
                return _fail(session, f"malformed frame: {P.describe(e)}")
            await dispatch(session, obj)
        if not session.authed and session.received > MAX_AUTH_BYTES:
            return _fail(session, f"over {MAX_AUTH_BYTES} bytes before initialize: closing")
        await drain(session.writer)


def _fail(session: Session, message: str) -> None:
    session.send(P.response(None, P.RpcError(P.INVALID_REQUEST, message)))
    session.closed = True


async def drain(writer: asyncio.StreamWriter) -> None:
    try:
        await writer.drain()
    except (ConnectionError, OSError, RuntimeError):
        pass
