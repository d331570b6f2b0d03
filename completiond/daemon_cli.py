"""`completiond serve | status | stop`."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from .files import read_secret
from .service import protocol as P
from .flags import model_flags
from .paths import socket_path

log = logging.getLogger("completiond.serve")


def add_parsers(sub) -> None:
    s = sub.add_parser("serve", help="run the daemon: resident models behind a Unix socket")
    s.add_argument("--socket", default=None, help="socket path (default: $COMPLETIOND_SOCKET or the per-user one)")
    s.add_argument("--tcp", default=None, metavar="127.0.0.1:PORT", help="also listen on loopback TCP (needs a token)")
    s.add_argument("--http", default=None, metavar="127.0.0.1:PORT",
                   help="also serve llama.cpp's /infill and OpenAI's /v1/completions over loopback HTTP "
                        "(needs a token: clients send 'Authorization: Bearer <token>')")
    s.add_argument("--token-file", default=None,
                   help="file holding the TCP / HTTP token (created 0600 if missing)")
    s.add_argument("--mode", default="combined", choices=list(P.MODES), help="default mode")
    s.add_argument("--workspace", action="append", default=[],
                   help="index this directory (repeatable); the only roots a TCP client may use")
    s.add_argument("--auth-timeout", type=float, default=5.0, metavar="S",
                   help="seconds a TCP client has to send initialize with the token")
    s.add_argument("--no-warm", dest="warm", action="store_false",
                   help="do not prefill a document's prompt while idle (after open and when typing pauses)")
    s.add_argument("--quick-prompt-ms", type=float, default=P.QUICK_PROMPT_MS, metavar="MS",
                   help="answer from a short prompt around the cursor while the full prompt still lacks more "
                        "than MS of prefill (the warm-up fills it meanwhile); -1: always the full prompt")
    s.add_argument("--repo-context", action="store_true",
                   help="show the model the other open buffers and the workspace modules the file imports, in "
                        "Qwen's repository format (off: on 64 bench positions it cost the 0.5B exact lines)")
    s.add_argument("--remote-timeout", type=float, default=30.0, metavar="S",
                   help="with --target openai:URL / llamacpp:URL: seconds a server may go without sending a whole "
                        "event (a byte at a time does not count) before the request fails")
    s.add_argument("--remote-deadline", type=float, default=120.0, metavar="S",
                   help="with a remote --target: seconds one answer may stream in all (then it ends with what came)")
    s.add_argument("--remote-token-file", default=None, metavar="F",
                   help="with a remote --target: the server's API key / token, sent as 'Authorization: Bearer'")
    s.add_argument("--no-upgrade", dest="upgrade", action="store_false",
                   help="with --target default: where this CPU's default is the larger model but its weights are not "
                        "converted yet, keep serving the smaller one (default: convert the larger in the background "
                        "and switch to it between requests)")
    s.add_argument("--log-level", default="INFO")
    model_flags(s)
    s.set_defaults(func=cmd_serve)
    for name, fn, text in (("status", cmd_status, "print the running daemon's status"),
                           ("stop", cmd_stop, "stop the running daemon")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--socket", default=None)
        p.add_argument("--timeout", type=float, default=10.0, metavar="S", help="seconds to wait for an answer")
        p.set_defaults(func=fn)


def _sock(a) -> Path:
    return Path(a.socket) if a.socket else socket_path()


def read_token(path: Path) -> str:
    """The TCP / HTTP token (--token-file), created 0600 if missing; a file that is not a regular
    file, another user's, readable by others or over MAX_SECRET_BYTES is refused (files.read_secret)."""
    try:
        return read_secret(path, "token file")
    except FileNotFoundError:
        pass
    token = secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:  # made meanwhile, a dangling symlink, a missing folder
        raise ValueError(f"token file {path}: cannot create it: {e.strerror}") from None
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def read_remote_token(path: Path) -> str:
    """--remote-token-file: the same rules as --token-file (files.read_secret), but never created."""
    try:
        return read_secret(path, "remote token file")
    except FileNotFoundError:
        raise ValueError(f"remote token file {path} does not exist") from None


def cmd_serve(a: argparse.Namespace) -> int:
    from .flags import UsageError
    from .service.daemon import Daemon
    from .core.remote import RemoteError, is_remote, parse_remote
    from .service.http import parse_http
    from .service.transport import StartError, claim, parse_tcp

    logging.basicConfig(level=a.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    sock = _sock(a)
    try:
        tcp = parse_tcp(a.tcp) if a.tcp else None
        if tcp and not a.token_file:
            raise StartError("--tcp needs --token-file (clients send that token in initialize)")
        http = parse_http(a.http) if a.http else None
        if http and not a.token_file:
            raise StartError("--http needs --token-file (clients send that token as 'Authorization: Bearer')")
        token = read_token(Path(a.token_file)) if tcp or http else None
        for root in a.workspace:
            if not Path(root).is_dir():
                raise StartError(f"--workspace {root}: not a directory")
        if is_remote(a.target):
            parse_remote(a.target)  # a malformed spec stops here, before the socket
        elif "@" in a.target:  # NAME@FORM: an unknown form stops here too (models' package imports torch)
            from .models.catalog import ModelError, split_form

            try:
                split_form(a.target)
            except ModelError as e:
                raise StartError(f"--target {e}") from None
        remote_token = read_remote_token(Path(a.remote_token_file)) if a.remote_token_file else None
        lock = claim(sock)  # before the slow model load: a second `serve` on this path stops here
    except (StartError, RemoteError, ValueError, OSError) as e:
        raise UsageError(str(e)) from None

    def load_models(index, phase) -> tuple[Engine, dict]:
        """On a loader thread, after the socket is up: `status` meanwhile reports each phase."""
        engine, info = _load_paused(index, phase)
        if a.target == "default" and engine.target.device.type == "cpu":
            _pending_upgrade(engine, info)
        return engine, info

    def _load_paused(index, phase) -> tuple[Engine, dict]:
        from .gc_pause import paused_gc

        with paused_gc():
            return _load_models(index, phase)

    upgrade_steps = None  # the background upgrade's steps, where `serve --target default` has one

    def _pending_upgrade(engine, info: dict) -> None:
        """The first load served the smaller target because the larger default is not converted:
        status says so, and (unless --no-upgrade) the daemon upgrades in the background."""
        nonlocal upgrade_steps
        from .models.choice import MEASURED_PAIR
        from .models.loader import pending_for
        from .service import upgrade

        if engine.target.name != MEASURED_PAIR[1] or (p := pending_for(a.device, a.dtype, a.quant)) is None:
            return
        served = info["target"]
        if not a.upgrade:
            info["default_reason"] = (f"{served} serves while {p.spelled}, this CPU's default ({p.why}), is not "
                                      f"converted yet and --no-upgrade is set: `{p.convert_command}` "
                                      "converts it, and the next start serves it")
            info["upgrade"] = upgrade.off_status(p.spelled, p.why, p.convert_command)
            return
        info["default_reason"] = (f"{served} serves while {p.spelled}, this CPU's default ({p.why}), converts in the "
                                  "background: this daemon switches to it between requests once it is ready "
                                  "(status: upgrade)")
        upgrade_steps = _upgrade_steps(p)
        info["upgrade"] = upgrade.waiting_status(p.spelled, p.why)

    def _upgrade_steps(p):
        """Convert, check and load `p` (choice.Unconverted), the larger default, for service/upgrade.py."""
        from .models import convert as conv, runtime
        from .models.device import pick_device, pick_dtype
        from .models.loader import converted, ensure_runtime, named_gguf, runtime_dir
        from .models.convert import available_memory
        from .service.upgrade import Steps, UpgradeError

        dev = pick_device(a.device)
        dt = pick_dtype(a.dtype, dev)
        folder = runtime_dir(p.name)

        def room() -> str | None:
            if converted(p.name, dt, p.form):  # converted meanwhile (`completiond convert`)
                return None
            return conv.room_for(named_gguf(p.name), folder, dt, p.form)

        def convert(on_progress) -> None:
            with conv.low_priority():  # the child converts at the lowest CPU priority
                ensure_runtime(named_gguf(p.name), folder, dt, p.form, progress=False,
                                      on_progress=on_progress)

        def load(phase):
            weights = folder / runtime.weights_file(dt, p.form)
            need, free = weights.stat().st_size, available_memory()
            if free < need:  # its weights become resident next to the smaller model's for a moment
                raise UpgradeError(f"not enough memory to load {p.spelled} next to {daemon.info.get('target')}: "
                                   f"it needs {need / 1e9:.1f} GB available, {free / 1e9:.1f} GB is (close other "
                                   "programs, or restart the daemon to serve it alone)")
            with conv.low_priority():  # a draft it needs converted: in the background too
                engine, info = _load_paused(daemon.index, phase)
            if engine.target.name != p.name:
                raise UpgradeError(f"the default changed meanwhile: {info['target']} loaded, not {p.spelled}")
            probe = "def f(x):\n    return {'a': [1, 2]}  # é\n"
            old = daemon.engine.target.tokenizer
            if engine.target.tokenizer.encode(probe) != old.encode(probe):
                raise UpgradeError(f"{p.spelled} tokenizes differently from {daemon.info.get('target')}: "
                                   "restart the daemon to serve it")
            return engine, info

        return Steps(p.spelled, p.why, room, convert, load, conv.stop_background)

    def _load_models(index, phase) -> tuple[Engine, dict]:
        t0 = time.perf_counter()
        phase("importing torch")
        from .core.remote import load_remote

        if is_remote(a.target):  # the model runs on a server: only its tokenizer is loaded here
            phase(f"loading the tokenizer for {a.target}")
            try:
                engine = load_remote(a.target, index, a.remote_timeout, remote_token, a.remote_deadline)
            except RemoteError as e:
                raise RuntimeError(str(e)) from None
            return engine, {**P.model_info(engine.target, None), "draft": None}
        from .core.engine import Engine, draft_for
        from .models.loader import conversion_progress, draft_label, load
        from .core.prompt import prepare_tokenizer
        from .models.device import trim_heap

        if a.target == "default":  # the first start on a CPU measures which target runs fast enough here
            from .models.choice import cpu_default
            from .models.device import pick_device

            if pick_device(a.device).type == "cpu":
                phase("choosing the default target (this CPU's pass costs, measured once)")
                cpu_default()
        # a first start converts the GGUFs (a minute or more): status says "converting X int4", progress 43
        with conversion_progress(lambda what, f: phase(f"converting {what}", round(100 * f, 1))):
            phase(f"loading target {a.target}")
            target = load(a.target, "target", a.device, a.dtype, a.quant)
            log.info("start-up: target %s (%s, %s, quant %s) loaded in %.1f s", target.name, target.device,
                     str(target.dtype).replace("torch.", ""), target.meta.get("quant", "none"), time.perf_counter() - t0)
            phase(f"loading draft {a.draft}")
            draft, unloaded = draft_for(a.draft, target)
        engine = Engine(target, draft, index=index, backend=a.backend)
        phase("calibrating")
        t1 = time.perf_counter()
        how = engine.calibrate_cached()  # cached per machine/model: seconds, not minutes
        prepare_tokenizer(target.tokenizer)  # not in the first completion
        trim_heap()  # the load's temporaries, and weights the lean forward fused, back to the system
        log.info("start-up: calibration %s in %.1f s (%s backend)", how, time.perf_counter() - t1,
                 engine.runner.backend)
        return engine, {**P.model_info(target, draft), "draft": draft_label(a.draft, draft, target, unloaded)}

    # what initialize and status say before the models are in
    info = {"target": a.target, "draft": a.draft, "device": a.device, "state": "loading", "socket": str(sock)}
    daemon = None

    async def main() -> None:
        nonlocal daemon
        daemon = Daemon(load_models, info, token=token, default_mode=a.mode,
                        roots=[Path(r) for r in a.workspace], auth_timeout=a.auth_timeout, warm=a.warm,
                        quick_prompt_ms=a.quick_prompt_ms, repo_context=a.repo_context)
        if a.target == "default" and a.upgrade:
            from .service.upgrade import Upgrade

            daemon.upgrade = Upgrade(daemon, lambda: upgrade_steps)
        if http:
            from .service.http import start_http
            await start_http(daemon, *http, token)
        await daemon.serve(sock, tcp)

    try:
        asyncio.run(main())
    except (StartError, OSError) as e:  # OSError: the TCP port is taken
        raise UsageError(str(e)) from None
    finally:
        lock.release()
    if daemon is not None and daemon.error:
        raise UsageError(daemon.error)
    return 0


async def _call(sock: Path, method: str, timeout: float):
    from .service.client import Client

    async def call():
        client = await Client.connect(sock)
        try:
            return await client.request(method, {})
        finally:
            await client.close()

    return await asyncio.wait_for(call(), timeout)  # connecting may hang too (a full accept queue)


def _ask(a: argparse.Namespace, method: str) -> tuple[bool, object]:
    """(True, the daemon's answer), or (False, None) after one line on stderr (no daemon, or it does not answer)."""
    sock = _sock(a)
    try:
        return True, asyncio.run(_call(sock, method, a.timeout))
    except (FileNotFoundError, ConnectionRefusedError):
        print(f"completiond: no daemon running on {sock}", file=sys.stderr)
    except (TimeoutError, asyncio.TimeoutError):
        print(f"completiond: the daemon on {sock} did not answer within {a.timeout:g} s (busy or hung)",
              file=sys.stderr)
    except (ConnectionError, OSError) as e:
        print(f"completiond: cannot talk to the daemon on {sock}: {e}", file=sys.stderr)
    return False, None


async def wait_ready(sock: Path, proc: subprocess.Popen | None = None, timeout: float = 900.0,
                     poll_s: float = 0.2) -> dict:
    """Until the daemon on `sock` says `state: ready`; its status then. What every tool that starts a
    daemon waits for: the socket is up (and `status` answers, with `state: loading` and no
    `scheduler`) long before the models are in. RuntimeError when loading failed or `proc` exited,
    TimeoutError after `timeout` s."""
    from .service.client import Client, DaemonError

    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the daemon on {sock} exited with status {proc.returncode} before it was ready")
        st = None
        try:
            c = await asyncio.wait_for(Client.connect(sock), 30)
            try:
                st = await c.request("status", {}, timeout=30)
            finally:
                await c.close()
        except (OSError, ConnectionError, DaemonError, asyncio.TimeoutError):  # not bound yet, or busy
            pass
        if st and st.get("state") == "ready":
            return st
        if st and st.get("state") == "failed":
            raise RuntimeError(f"the daemon on {sock} failed to load: {st.get('error')}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the daemon on {sock} was not ready within {timeout:g} s"
                               + (f" ({st.get('phase')})" if st else ""))
        await asyncio.sleep(poll_s)


def cmd_status(a: argparse.Namespace) -> int:
    ok, st = _ask(a, "status")
    if ok:
        print(json.dumps(st, indent=2))
    return 0 if ok else 1


def cmd_stop(a: argparse.Namespace) -> int:
    sock = _sock(a)
    ok, _ = _ask(a, "shutdown")
    if not ok:
        return 1
    deadline = time.time() + 15
    while sock.exists() and time.time() < deadline:
        time.sleep(0.05)
    print("completiond: daemon stopped" if not sock.exists() else "completiond: daemon did not stop in 15 s",
          file=sys.stderr)
    return 0 if not sock.exists() else 1
