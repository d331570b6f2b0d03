"""`completiond serve | status | stop`."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import sys
import time
from pathlib import Path

from . import protocol as P


def add_parsers(sub, model_flags) -> None:
    s = sub.add_parser("serve", help="run the daemon: resident models behind a Unix socket")
    s.add_argument("--socket", default=None, help="socket path (default: $COMPLETIOND_SOCKET or the per-user one)")
    s.add_argument("--tcp", default=None, metavar="127.0.0.1:PORT", help="also listen on loopback TCP (needs a token)")
    s.add_argument("--token-file", default=None, help="file holding the TCP token (created 0600 if missing)")
    s.add_argument("--mode", default="combined", choices=["ar", "pld", "draft", "combined"], help="default mode")
    s.add_argument("--workspace", action="append", default=[], help="index this directory (repeatable)")
    s.add_argument("--log-level", default="INFO")
    model_flags(s)
    s.set_defaults(func=cmd_serve)
    for name, fn, text in (("status", cmd_status, "print the running daemon's status"),
                           ("stop", cmd_stop, "stop the running daemon")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--socket", default=None)
        p.set_defaults(func=fn)


def _sock(a) -> Path:
    return Path(a.socket) if a.socket else P.socket_path()


def read_token(path: Path) -> str:
    if path.exists():
        token = path.read_text().strip()
        if not token:
            raise ValueError(f"token file {path} is empty")
        return token
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def cmd_serve(a: argparse.Namespace) -> int:
    from .cli import UsageError
    from .daemon import Daemon, StartError, check_socket, parse_tcp
    from .engine import Engine
    from .models import ModelError, load, load_draft

    logging.basicConfig(level=a.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    sock = _sock(a)
    try:
        tcp = parse_tcp(a.tcp) if a.tcp else None
        if tcp and not a.token_file:
            raise StartError("--tcp needs --token-file (clients send that token in initialize)")
        token = read_token(Path(a.token_file)) if tcp else None
        check_socket(sock)  # before the slow model load: refuse early if a daemon is alive
        target = load(a.target, "target", a.device, a.dtype)
        draft = load_draft(a.draft, target)
    except (StartError, ModelError, ValueError, OSError) as e:
        raise UsageError(str(e)) from None
    engine = Engine(target, draft)
    engine.calibrate()
    info = {"target": target.name, "draft": draft.name if draft else None, "device": str(target.device),
            "dtype": str(target.dtype).replace("torch.", ""), "socket": str(sock)}

    async def main() -> None:
        daemon = Daemon(engine, info, token=token, default_mode=a.mode)
        for root in a.workspace:
            daemon.watcher.add_root(Path(root))
        await daemon.serve(sock, tcp)

    try:
        asyncio.run(main())
    except StartError as e:
        raise UsageError(str(e)) from None
    return 0


async def _call(sock: Path, method: str, timeout: float = 10.0):
    from .client import Client

    client = await Client.connect(sock)
    try:
        return await client.request(method, {}, timeout=timeout)
    finally:
        await client.close()


def cmd_status(a: argparse.Namespace) -> int:
    sock = _sock(a)
    try:
        st = asyncio.run(_call(sock, "status"))
    except (FileNotFoundError, ConnectionRefusedError):
        print(f"completiond: no daemon running on {sock}", file=sys.stderr)
        return 1
    print(json.dumps(st, indent=2))
    return 0


def cmd_stop(a: argparse.Namespace) -> int:
    sock = _sock(a)
    try:
        asyncio.run(_call(sock, "shutdown"))
    except (FileNotFoundError, ConnectionRefusedError):
        print(f"completiond: no daemon running on {sock}", file=sys.stderr)
        return 1
    deadline = time.time() + 15
    while sock.exists() and time.time() < deadline:
        time.sleep(0.05)
    print("completiond: daemon stopped" if not sock.exists() else "completiond: daemon did not stop in 15 s",
          file=sys.stderr)
    return 0 if not sock.exists() else 1
