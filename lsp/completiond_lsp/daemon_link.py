"""The LSP server's connection to `completiond serve`: connect or start it, re-sync after a restart."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from completiond.service import protocol as P
from completiond.service.client import Client, DaemonError
from completiond.paths import cache_root, socket_path

log = logging.getLogger("completiond.lsp")
INITIALIZE_TIMEOUT = 60.0  # s: how long the handshake with a daemon whose socket is up may take
STATUS_TIMEOUT = 2.0  # s: a loading daemon's status; the editor's message keeps counting meanwhile



def daemon_log(socket: Path) -> Path:
    """The log of the daemon serving `socket`: named after the socket, so two daemons (another
    socket, a test's) never write into one file. The default socket's is `logs/daemon.log`."""
    sock = Path(socket)
    if sock == socket_path():
        return cache_root() / "logs" / "daemon.log"
    digest = hashlib.sha256(str(sock.resolve()).encode()).hexdigest()[:10]
    return cache_root() / "logs" / f"daemon-{sock.stem}-{digest}.log"

# what the editor is told of a ready daemon's models (its status fields)
READY_KEYS = ("target", "draft", "device", "state", "quant", "default_reason", "upgrade")
UPGRADE_POLL_S = 1.0  # s: how often a background upgrade's progress is asked for


def _upgrading(info: dict) -> bool:
    """The daemon converts or loads the larger default in the background (service/upgrade.py)."""
    up = info.get("upgrade")
    return isinstance(up, dict) and up.get("phase") in ("converting", "loading")


def ready_message(info: dict) -> str:
    """The status message of a ready daemon: the model that answers, and a background upgrade's
    phase and progress while one runs (or why it failed)."""
    line = f"completiond: ready: {info.get('target')} on {info.get('device')}"
    up = info.get("upgrade")
    if not isinstance(up, dict):
        return line
    pct = up.get("progress")
    if up.get("phase") == "converting":
        done = f" {pct * 100:.0f} %" if isinstance(pct, (int, float)) else ""
        return f"{line}; converting {up.get('model')} in the background{done}"
    if up.get("phase") == "loading":
        return f"{line}; loading {up.get('model')} in the background"
    if up.get("phase") == "failed":
        return f"{line}; upgrade to {up.get('model')} failed"
    return line


class DaemonUnavailable(Exception):
    pass


class DaemonLink:
    """One connection to the daemon, re-established on demand (after a daemon restart, say).

    `documents()` returns the open documents as `document/open` params, so that a fresh connection
    starts with the same view of the editor as the old one had.
    """

    def __init__(self, documents: Callable[[], list[P.DocumentOpen]],
                 on_status: Callable[[str, str, dict], None]):
        self.documents = documents
        self.on_status = on_status
        self.client: Client | None = None
        self.info: dict = {}
        self.socket: Path = socket_path()
        self.autostart = True
        self.roots: list[str] = []
        self.encoding = "utf-16"
        self.serve_args: list[str] = []  # --target/--draft/... for an autostarted daemon
        self.start_timeout = 300.0
        self._lock = asyncio.Lock()
        self._watch: asyncio.Task | None = None  # follows a loading daemon until it is ready
        self._upgrade: asyncio.Task | None = None  # follows a background upgrade until it is done
        self._proc: subprocess.Popen | None = None
        self._tasks: set[asyncio.Task] = set()
        self._closing = False  # set on shutdown: a closed connection is then no lost daemon

    def serve_command(self) -> str:
        """The `completiond serve` that starts the daemon this server would (its socket, target, draft,
        dtype, device), as a message prints it: it runs as printed."""
        sock = [] if self.socket == socket_path() else ["--socket", str(self.socket)]
        return shlex.join(["completiond", "serve", *sock, *self.serve_args])

    @property
    def connected(self) -> bool:
        return self.client is not None and not self.client.closed.is_set()

    async def get(self) -> Client:
        if self.connected and not self._lock.locked():  # locked: still re-sending the documents
            return self.client
        async with self._lock:
            if not self.connected:
                await self._connect()
            return self.client

    async def _connect(self) -> None:
        try:
            client = await Client.connect(self.socket)
        except (FileNotFoundError, ConnectionRefusedError):
            if not self.autostart:
                self.on_status("error", f"no daemon on {self.socket} and autostart is off", {})
                raise DaemonUnavailable(f"no completiond daemon on {self.socket} (autostart is off)") from None
            client = await self._start()
        init = P.Initialize(client="completiond-lsp", workspace_roots=tuple(self.roots),
                            position_encoding=self.encoding)
        try:
            self.info = await client.request("initialize", init.to_wire(), timeout=INITIALIZE_TIMEOUT)
            # From here an editor's open/change goes straight to this connection: one that arrived while
            # the documents below are sent would otherwise be lost (the daemon's copy left behind).
            self.client = client
            for doc in self.documents():
                await client.notify("document/open", doc.to_wire())
        except (DaemonError, asyncio.TimeoutError, ConnectionError, OSError) as e:
            self.client = None
            # close it: a half-made connection would stay open on the daemon, holding its documents
            await client.close()
            why = f"no answer within {INITIALIZE_TIMEOUT:.0f} s" if isinstance(e, asyncio.TimeoutError) else str(e)
            self.on_status("error", f"completiond daemon: initialize failed: {why}", {})
            raise DaemonUnavailable(f"initialize with the daemon on {self.socket} failed: {why}") from None
        self._watch_closed(client)
        if self.info.get("state") == "loading":  # its socket is up before its models: requests wait for them
            self.on_status("loading", f"completiond: loading {self.info.get('target')}", self.info)
            self._watch = asyncio.create_task(self._until_loaded(client))
        else:
            self._ready(self.info)

    def _ready(self, info: dict) -> None:
        self.on_status("ready", ready_message(info), info)
        if _upgrading(info) and self.client is not None and (self._upgrade is None or self._upgrade.done()):
            self._upgrade = asyncio.create_task(self._follow_upgrade(self.client))

    async def _follow_upgrade(self, client: Client) -> None:
        """While the daemon converts and loads the larger default in the background (its status'
        `upgrade`): pass its phase and progress on each second, then the model that serves."""
        while not client.closed.is_set():
            await asyncio.sleep(UPGRADE_POLL_S)
            try:
                st = await client.request("status", {}, timeout=STATUS_TIMEOUT)
            except asyncio.TimeoutError:
                continue
            except (DaemonError, ConnectionError, OSError):
                return  # a closed connection is _watch_closed's to report
            if client is not self.client:
                return
            if st.get("upgrade") != self.info.get("upgrade") or st.get("target") != self.info.get("target"):
                self.info.update({k: st[k] for k in READY_KEYS if k in st})
                self.on_status("ready", ready_message(self.info), self.info)
            if not _upgrading(st):
                return

    def _watch_closed(self, client: Client) -> None:
        """Notice a lost daemon at once (`completiond stop`, a crash): say so, and start or reconnect
        to a new one now rather than on the next keystroke, showing its progress again."""
        async def watch() -> None:
            await client.closed.wait()
            if self.client is not client or self._closing:
                return  # replaced, or this server is shutting down
            self.client = None
            why = f" ({client.close_reason})" if client.close_reason else ""
            if not self.autostart:
                self.on_status("error", f"completiond: daemon stopped{why}; autostart is off: run "
                                        f"`{self.serve_command()}`", {})
                return
            self.on_status("restarting", f"completiond: daemon stopped{why} — restarting", {})
            await asyncio.sleep(0.2)  # let a stopping daemon release its socket
            try:
                await self.get()
            except (DaemonUnavailable, OSError, DaemonError, asyncio.TimeoutError) as e:
                log.warning("restarting the daemon failed: %s", e)

        task = asyncio.create_task(watch())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _until_loaded(self, client: Client) -> None:
        """While the daemon loads its models: ask its status each half second and pass its phase on
        (with the seconds counted here, so that the message moves even while a busy daemon is slow
        to answer), then the loaded model once it is ready, or why it failed."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        last: dict = dict(self.info)
        seen_at = t0  # when `last` came: the daemon's uptime then, plus the time since, is its age now
        while not client.closed.is_set():
            try:
                st = await client.request("status", {}, timeout=STATUS_TIMEOUT)
            except asyncio.TimeoutError:
                st = None  # busy (a conversion holding the interpreter): keep counting, ask again
            except (DaemonError, ConnectionError, OSError):
                return  # a closed connection is _watch_closed's to report
            if st is not None and st.get("state") == "ready":
                self.info.update({k: st[k] for k in READY_KEYS if k in st})
                self._ready(self.info)
                return
            if st is not None and st.get("state") == "failed":
                self.on_status("error", f"completiond daemon: models failed to load: {st.get('error')}", st)
                return
            if st is not None:
                last, seen_at = st, loop.time()
            phase = last.get("phase", "loading")
            elapsed = float(last.get("uptime_s") or 0) + loop.time() - seen_at
            pct = last.get("progress")
            detail = f"{pct:.0f} %, " if isinstance(pct, (int, float)) else ""
            self.on_status("loading", f"completiond: {phase} ({detail}{elapsed:.0f} s)",
                           {**last, "phase": phase, "elapsed_s": round(elapsed, 1)})
            await asyncio.sleep(0.5)

    async def _start(self) -> Client:
        """Start a daemon in its own session (it outlives this editor) and wait for its socket."""
        log_file = daemon_log(self.socket)
        log_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "completiond", "serve", "--socket", str(self.socket), *self.serve_args]
        self.on_status("loading", f"completiond: starting the daemon (log: {log_file})",
                       {"phase": "starting", "elapsed_s": 0.0})
        log.info("starting daemon: %s", " ".join(cmd))
        with open(log_file, "ab") as out:
            self._proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True, env=os.environ.copy())
        t0 = asyncio.get_running_loop().time()
        deadline = t0 + self.start_timeout
        shown = 0
        while asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
            waited = asyncio.get_running_loop().time() - t0
            if int(waited) > shown:  # Python imports before the socket is up: count them
                shown = int(waited)
                self.on_status("loading", f"completiond: starting the daemon ({shown} s)",
                               {"phase": "starting", "elapsed_s": float(shown)})
            try:
                return await Client.connect(self.socket)
            except (FileNotFoundError, ConnectionRefusedError):
                pass
            code = self._proc.poll()
            if code is not None:
                tail = log_file.read_text(errors="replace").strip().splitlines()[-1:] or [""]
                if "already running" in tail[0]:  # another editor started one meanwhile
                    continue
                self.on_status("error", f"completiond daemon exited ({code}): {tail[0]}", {})
                raise DaemonUnavailable(f"daemon exited with {code}: {tail[0]} (log: {log_file})")
        self.on_status("error", "completiond daemon did not start in time", {})
        raise DaemonUnavailable(f"daemon did not open {self.socket} within {self.start_timeout:.0f} s")

    def send(self, message: tuple[str, dict], on_error: Callable[[DaemonError], None] | None) -> None:
        """Send a document update as a request if connected (a later reconnect re-sends every
        document); the daemon's refusal goes to `on_error` (a notification's would be lost)."""
        if not self.connected:
            return
        try:
            _, fut = self.client.send_request(*message)
        except (ConnectionError, OSError, RuntimeError):
            return

        def done(f: asyncio.Future) -> None:
            if f.cancelled():
                return
            e = f.exception()
            if isinstance(e, DaemonError) and on_error is not None:
                on_error(e)

        fut.add_done_callback(done)

    async def notify(self, method: str, params: dict) -> None:
        """Forward a document notification if connected (a later reconnect re-sends every document)."""
        if self.connected:
            try:
                await self.client.notify(method, params)
            except (ConnectionError, OSError):
                pass
