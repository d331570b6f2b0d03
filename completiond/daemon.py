"""`completiond serve`: one resident engine shared by every editor on the machine.

The event loop only reads frames, keeps documents and writes answers; model work runs on a single
worker thread (one forward pass at a time) and is cancellable between passes. A new `complete` for
a document cancels the older one (latest wins); a client that disconnects has its work cancelled.
Malformed input gets an error answer (or, when the byte stream cannot be resynchronised, that
connection is closed); the daemon itself keeps serving.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import numpy as np

from . import __version__
from . import protocol as P
from .documents import Document, DocumentError
from .engine import MODES, Engine, Request, Result
from .index import continuations
from .prompt import PositionError, build_prompt, offset_at
from .rewrite import finish, rewrite_prompt
from .verify import Sampling
from .workspace import WorkspaceWatcher

log = logging.getLogger("completiond.daemon")
ENCODINGS = ("utf-16", "utf-8", "utf-32")


class StartError(Exception):
    """The daemon cannot start (live daemon on the socket, bad directory, bad TCP address)."""


@dataclass
class Job:
    msgid: int
    uri: str
    cancel: threading.Event = field(default_factory=threading.Event)


@dataclass
class Conn:
    id: int
    writer: asyncio.StreamWriter
    authed: bool
    encoding: str = "utf-16"
    name: str = ""
    docs: dict[str, Document] = field(default_factory=dict)
    jobs: dict[int, Job] = field(default_factory=dict)
    latest: dict[str, Job] = field(default_factory=dict)
    closed: bool = False

    def send(self, data: bytes) -> None:
        if not self.closed:
            try:
                self.writer.write(data)
            except (ConnectionError, RuntimeError, OSError):
                self.closed = True


class Daemon:
    def __init__(self, engine: Engine, info: dict, token: str | None = None, default_mode: str = "combined",
                 max_frame_bytes: int = P.MAX_FRAME_BYTES):
        self.engine = engine
        self.info = info  # target, draft, device, dtype
        self.token = token
        self.default_mode = default_mode
        self.max_frame_bytes = max_frame_bytes
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self.watcher = WorkspaceWatcher(engine.index, engine.target.tokenizer)
        self.conns: dict[int, Conn] = {}
        self._next_conn = 0
        self.served = 0
        self.started = time.time()
        self.stopping = asyncio.Event()
        self.servers: list[asyncio.AbstractServer] = []
        self.methods = {
            "initialize": self.initialize, "document/open": self.doc_open, "document/change": self.doc_change,
            "document/close": self.doc_close, "complete": self.complete, "rewrite": self.rewrite,
            "cancel": self.cancel, "status": self.status, "shutdown": self.shutdown,
            "debug/lookup": self.lookup,
        }

    # ---- connections --------------------------------------------------------------------------
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, authed: bool) -> None:
        self._next_conn += 1
        conn = Conn(self._next_conn, writer, authed)
        self.conns[conn.id] = conn
        unpacker = P.unpacker(self.max_frame_bytes)
        try:
            while not conn.closed and (data := await reader.read(65536)):
                try:
                    unpacker.feed(data)
                    objs = list(unpacker)
                except msgpack.BufferFull:
                    conn.send(P.response(None, P.RpcError(P.INVALID_REQUEST,
                                                          f"frame over {self.max_frame_bytes} bytes")))
                    break
                except Exception as e:  # not msgpack, or invalid UTF-8: the stream cannot be resynchronised
                    conn.send(P.response(None, P.RpcError(P.INVALID_REQUEST, f"malformed frame: {e}")))
                    break
                for obj in objs:
                    await self.dispatch(conn, obj)
                await _drain(writer)
        except (ConnectionError, OSError, asyncio.CancelledError):  # cancelled: the daemon is stopping
            pass
        finally:
            self.drop(conn)
            try:
                writer.close()
            except (ConnectionError, OSError, RuntimeError):
                pass

    def drop(self, conn: Conn) -> None:
        """A client went away: cancel its work and forget its documents."""
        conn.closed = True
        for job in conn.jobs.values():
            job.cancel.set()
        for uri in conn.docs:
            self.engine.index.close(_index_key(conn, uri))
        self.conns.pop(conn.id, None)

    async def dispatch(self, conn: Conn, obj) -> None:
        try:
            frame = P.parse_frame(obj)
        except P.RpcError as e:
            conn.send(P.response(P.request_id(obj), e))
            return
        handler = self.methods.get(frame.method)
        if frame.kind == P.NOTIFICATION:
            if handler is not None and frame.method.startswith("document/") and conn.authed:
                try:
                    await handler(conn, frame.params, None)
                except P.RpcError as e:
                    log.info("notification %s rejected: %s", frame.method, e.message)
            return
        if handler is None:
            conn.send(P.response(frame.msgid, P.RpcError(P.METHOD_NOT_FOUND, f"unknown method {frame.method!r}")))
            return
        if not conn.authed and frame.method != "initialize":
            conn.send(P.response(frame.msgid, P.RpcError(P.INVALID_REQUEST, "initialize with the token first")))
            return
        if frame.method in ("complete", "rewrite"):
            asyncio.create_task(self._answer(conn, frame, handler))  # long: don't block this connection
        else:
            await self._answer(conn, frame, handler)

    async def _answer(self, conn: Conn, frame: P.Frame, handler) -> None:
        try:
            result = await handler(conn, frame.params, frame.msgid)
            conn.send(P.response(frame.msgid, None, result))
        except P.RpcError as e:
            conn.send(P.response(frame.msgid, e))
        except Exception as e:  # a bug must cost one request, not the daemon
            log.exception("%s failed", frame.method)
            conn.send(P.response(frame.msgid, P.RpcError(P.INTERNAL_ERROR, f"{type(e).__name__}: {e}")))
        await _drain(conn.writer)

    # ---- methods ------------------------------------------------------------------------------
    async def initialize(self, conn: Conn, params: dict, msgid) -> dict:
        if not conn.authed:
            token = P.get(params, "token", str, default="")
            if not (self.token and hmac.compare_digest(token.encode(), self.token.encode())):
                conn.closed = True
                raise P.RpcError(P.INVALID_REQUEST, "bad or missing token")
            conn.authed = True
        version = P.get(params, "protocol", int, default=P.PROTOCOL_VERSION)
        if version != P.PROTOCOL_VERSION:
            raise P.RpcError(P.INVALID_PARAMS, f"protocol {version} not supported (this daemon speaks "
                                               f"{P.PROTOCOL_VERSION})")
        conn.name = P.get(params, "client", str, default="")
        conn.encoding = P.get(params, "position_encoding", str, default="utf-16", check=lambda e: e in ENCODINGS)
        roots = P.get(params, "workspace_roots", list, default=[])
        for root in roots:
            if not isinstance(root, str):
                raise P.RpcError(P.INVALID_PARAMS, "workspace_roots must be a list of paths")
        for root in roots:
            path = Path(root[7:] if root.startswith("file://") else root)
            if path.is_dir():
                await asyncio.to_thread(self.watcher.add_root, path)
        return {"protocol": P.PROTOCOL_VERSION, "server_version": __version__, "position_encoding": conn.encoding,
                **{k: self.info[k] for k in ("target", "draft", "device")}}

    async def doc_open(self, conn: Conn, params: dict, msgid) -> None:
        uri = P.get(params, "uri", str)
        text = P.get(params, "text", str)
        version = P.get(params, "version", int, default=0)
        if len(text) > 4 * 1024 * 1024:
            raise P.RpcError(P.INVALID_PARAMS, "document too large (over 4M characters)")
        conn.docs[uri] = Document(uri, text, version, P.get(params, "language_id", str, default=""))
        return None

    async def doc_change(self, conn: Conn, params: dict, msgid) -> None:
        doc = self._doc(conn, params)
        changes = P.get(params, "changes", list)
        version = P.get(params, "version", int, default=doc.version + 1)
        try:
            doc.apply(changes, version, conn.encoding)
        except DocumentError as e:
            raise P.RpcError(P.INVALID_PARAMS, str(e)) from None
        return None

    async def doc_close(self, conn: Conn, params: dict, msgid) -> None:
        uri = P.get(params, "uri", str)
        if conn.docs.pop(uri, None) is None:
            raise P.RpcError(P.INVALID_PARAMS, f"document not open: {uri}")
        self.engine.index.close(_index_key(conn, uri))
        return None

    async def complete(self, conn: Conn, params: dict, msgid: int) -> dict:
        doc = self._doc(conn, params)
        line, char = P.position(params)
        mode = P.get(params, "mode", str, default=self.default_mode, check=lambda m: m in MODES)
        if mode == "draft" and self.engine.draft is None:
            raise P.RpcError(P.INVALID_PARAMS, "mode 'draft' needs a draft model; this daemon has none")
        max_tokens = P.get(params, "max_tokens", int, default=64, check=lambda n: 1 <= n <= 2048)
        temperature = P.get(params, "temperature", float, default=0.0, check=lambda t: 0 <= t <= 10)
        top_p = P.get(params, "top_p", float, default=1.0, check=lambda p: 0 < p <= 1)
        seed = P.get(params, "seed", int, default=None)
        multiline = P.get(params, "multiline", bool, default=True)
        deadline = P.get(params, "deadline_ms", (int, float), default=None, check=lambda d: d > 0)
        reuse = P.get(params, "reuse_prefix", bool, default=True)
        self._check_version(doc, params)
        try:
            offset = offset_at(doc.text, line, char, conn.encoding)
        except PositionError as e:
            raise P.RpcError(P.INVALID_PARAMS, f"position out of range: {e}") from None
        text = doc.text
        tok = self.engine.target.tokenizer

        def make() -> Request:
            prompt = build_prompt(tok, text, offset, multiline=multiline)
            return Request(prompt=prompt.ids, mode=mode, max_tokens=max_tokens, seed=seed, stops=prompt.stops,
                           sampling=Sampling(temperature, top_p), deadline_ms=deadline, reuse_prefix=reuse)

        res = await self._run(conn, msgid, doc.uri, make, "complete/partial")
        return _result(res)

    async def rewrite(self, conn: Conn, params: dict, msgid: int) -> dict:
        doc = self._doc(conn, params)
        rng = P.get(params, "range", dict)
        instruction = P.get(params, "instruction", str, check=lambda s: 0 < len(s) <= 4000)
        self._check_version(doc, params)
        try:
            start = offset_at(doc.text, *P.position(rng, "start"), conn.encoding)
            end = offset_at(doc.text, *P.position(rng, "end"), conn.encoding)
        except PositionError as e:
            raise P.RpcError(P.INVALID_PARAMS, f"range out of document: {e}") from None
        if end < start:
            raise P.RpcError(P.INVALID_PARAMS, "range ends before it starts")
        text, lang = doc.text, doc.language_id
        tok = self.engine.target.tokenizer
        n_sel = len(tok.encode(text[start:end], add_special_tokens=False))
        max_tokens = P.get(params, "max_tokens", int, default=min(2048, 2 * n_sel + 64),
                           check=lambda n: 1 <= n <= 4096)
        mode = P.get(params, "mode", str, default=self.default_mode, check=lambda m: m in MODES)

        def make() -> Request:
            ids, stops = rewrite_prompt(tok, text, start, end, instruction, lang)
            return Request(prompt=ids, mode=mode, max_tokens=max_tokens, stops=stops)

        res = await self._run(conn, msgid, doc.uri, make, "rewrite/partial")
        out = _result(res)
        out["text"] = finish(res.text, text[start:end])
        return out

    async def cancel(self, conn: Conn, params: dict, msgid) -> None:
        target = P.get(params, "id", int)
        job = conn.jobs.get(target)
        if job is None:
            raise P.RpcError(P.INVALID_PARAMS, f"no request {target} in flight")
        job.cancel.set()
        return None

    async def status(self, conn: Conn, params: dict, msgid) -> dict:
        st = self.engine.stats
        return {
            **self.info, "server_version": __version__, "pid": os.getpid(),
            "uptime_s": round(time.time() - self.started, 1), "clients": len(self.conns),
            "documents": sum(len(c.docs) for c in self.conns.values()),
            "indexed_files": self.engine.index.n_files, "workspace_roots": [str(r) for r in self.watcher.roots],
            "index_idle": self.watcher.idle, "requests_served": self.served,
            "mean_accepted": round(st["accepted"] / st["passes"], 4) if st["passes"] else 0.0,
        }

    async def lookup(self, conn: Conn, params: dict, msgid) -> dict:
        """What prompt lookup would propose at a position (texts), for debugging and tests."""
        doc = self._doc(conn, params)
        try:
            offset = offset_at(doc.text, *P.position(params), conn.encoding)
        except PositionError as e:
            raise P.RpcError(P.INVALID_PARAMS, f"position out of range: {e}") from None
        max_len = P.get(params, "max_len", int, default=16, check=lambda n: 1 <= n <= 256)
        text, tok = doc.text, self.engine.target.tokenizer

        def work() -> list[str]:
            ids = build_prompt(tok, text, offset).ids
            found = continuations(np.asarray(ids), self.engine.index.segments(), max_len, 8)
            return [tok.decode(c) for c, _ in found]

        return {"candidates": await asyncio.get_running_loop().run_in_executor(self.executor, work)}

    async def shutdown(self, conn: Conn, params: dict, msgid) -> None:
        asyncio.get_running_loop().call_later(0.05, self.stopping.set)
        return None

    # ---- helpers ------------------------------------------------------------------------------
    def _doc(self, conn: Conn, params: dict) -> Document:
        uri = P.get(params, "uri", str)
        doc = conn.docs.get(uri)
        if doc is None:
            raise P.RpcError(P.INVALID_PARAMS, f"unknown document {uri!r}: send document/open first")
        return doc

    @staticmethod
    def _check_version(doc: Document, params: dict) -> None:
        version = P.get(params, "version", int, default=None)
        if version is not None and version != doc.version:
            raise P.RpcError(P.INVALID_PARAMS, f"document is at version {doc.version}, request names {version}")

    async def _run(self, conn: Conn, msgid: int, uri: str, make, partial: str) -> Result:
        """Run one request on the engine thread; stream partial text; latest request per document wins."""
        loop = asyncio.get_running_loop()
        if (old := conn.latest.get(uri)) is not None:
            old.cancel.set()
        job = Job(msgid, uri)
        conn.jobs[msgid] = job
        conn.latest[uri] = job
        snapshot = [(_index_key(conn, d.uri), d) for d in conn.docs.values() if d.indexed_version != d.version]
        tok = self.engine.target.tokenizer

        def on_step(step) -> None:
            if step.text and not job.cancel.is_set():
                loop.call_soon_threadsafe(conn.send, P.notification(partial, {"id": msgid, "text": step.text}))

        def work() -> Result:
            for key, d in snapshot:  # open buffers feed prompt lookup; tokenized here, off the loop
                text, version = d.text, d.version
                self.engine.index.set_open(key, tok.encode(text, add_special_tokens=False))
                d.indexed_version = version
            req = make()
            req.cancel = job.cancel
            return self.engine.complete(req, on_step)

        try:
            res = await loop.run_in_executor(self.executor, work)
        finally:
            conn.jobs.pop(msgid, None)
            if conn.latest.get(uri) is job:
                del conn.latest[uri]
        self.served += 1
        return res

    # ---- lifecycle ----------------------------------------------------------------------------
    async def serve(self, sock_path: Path | None, tcp: tuple[str, int] | None = None) -> None:
        if sock_path is not None:
            listener = bind_unix(sock_path)
            self.servers.append(await asyncio.start_unix_server(
                lambda r, w: self.handle(r, w, authed=True), sock=listener))
        if tcp is not None:
            self.servers.append(await asyncio.start_server(
                lambda r, w: self.handle(r, w, authed=False), host=tcp[0], port=tcp[1]))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        log.info("serving on %s%s", sock_path, f" and tcp {tcp[0]}:{tcp[1]}" if tcp else "")
        try:
            await self.stopping.wait()
        finally:
            for srv in self.servers:
                srv.close()
            for conn in list(self.conns.values()):
                self.drop(conn)
                conn.writer.close()
            self.watcher.stop()
            self.executor.shutdown(wait=True, cancel_futures=True)
            if sock_path is not None:
                try:
                    sock_path.unlink()
                except FileNotFoundError:
                    pass


def _index_key(conn: Conn, uri: str) -> str:
    return f"{uri}#client{conn.id}"


def _result(res: Result) -> dict:
    return {"text": res.text, "tokens": res.tokens, "token_ids": res.token_ids, "target_passes": res.target_passes,
            "mean_accepted": round(res.mean_accepted, 4), "ms_first_token": round(res.ms_first_token, 2),
            "ms_total": round(res.ms_total, 2), "cancelled": res.cancelled, "stopped_by": res.stopped_by,
            "mode": res.mode, "prompt_tokens": res.prompt_tokens, "reused_tokens": res.reused_tokens}


async def _drain(writer: asyncio.StreamWriter) -> None:
    try:
        await writer.drain()
    except (ConnectionError, OSError, RuntimeError):
        pass


# ---- socket set-up ------------------------------------------------------------------------------
def check_socket(path: Path) -> None:
    """Refuse a live daemon on `path`; remove a stale socket left by a crashed one."""
    d = path.parent
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = d.stat()
    if st.st_uid != os.getuid():
        raise StartError(f"socket directory {d} belongs to another user")
    if st.st_mode & 0o077 and d.name in ("completiond", f"completiond-{os.getuid()}"):
        os.chmod(d, 0o700)  # our own directory: keep it private
    if not (path.exists() or path.is_symlink()):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError, socket.timeout, OSError):
        log.info("removing stale socket %s", path)
        path.unlink(missing_ok=True)
        return
    finally:
        probe.close()
    raise StartError(f"a daemon is already running on {path} (use `completiond stop` first)")


def bind_unix(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # created 0600: only this user may connect
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(64)
    sock.setblocking(False)
    return sock


def parse_tcp(spec: str) -> tuple[str, int]:
    import ipaddress

    host, _, port = spec.rpartition(":")
    host = host.strip("[]")
    try:
        ip = ipaddress.ip_address(host)
        port_n = int(port)
    except ValueError:
        raise StartError(f"--tcp wants HOST:PORT with a loopback IP, got {spec!r}") from None
    if not ip.is_loopback:
        raise StartError(f"--tcp {host}: only loopback addresses (127.0.0.0/8, ::1) are allowed")
    if not 0 < port_n < 65536:
        raise StartError(f"--tcp port {port_n} out of range")
    return host, port_n
