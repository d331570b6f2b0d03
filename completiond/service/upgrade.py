"""A first start's background upgrade: serve the smaller default now, switch to the larger once converted.

Where this CPU chose the larger target as `--target default` (models/choice.py) but its weights form
is not in the cache yet, the daemon starts on the smaller one at once and, once that serves:

1. checks this machine's free memory and disk for the conversion (one line and no upgrade when short);
2. converts the larger target's GGUF in the background: the existing child-process converter
   (models/convert.py) at the lowest CPU priority, one conversion at a time through the cache's lock
   (another process converting the same form is waited for, and its result taken);
3. loads it (and its draft) off the event loop, calibrates it, and checks there is memory for it;
4. swaps engines between the scheduler's jobs (Daemon.switch: no request lost; the old engine's
   cached sequences dropped, open documents warmed again; the old engine freed).

`status` says where it is: `upgrade = {model, phase, progress, why, ...}` with phase converting /
loading / switched / failed (and off with --no-upgrade). A failure leaves the smaller model serving.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..core.engine_like import EngineLike

log = logging.getLogger("completiond.upgrade")

Phase = Callable[..., None]  # phase(name, progress=None): what the load is doing now


class Steps:
    """How one upgrade to `model` (NAME@FORM; `why` it is this CPU's default) is done, from the serve
    command's flags (daemon_cli.py builds it): `room()` the line saying what the conversion lacks
    (None: enough), `convert(on_progress)` the conversion (ModelError on failure), `load(phase)` the
    new (engine, info), `stop()` ends a conversion under way."""

    def __init__(self, model: str, why: str, room: Callable[[], str | None],
                 convert: Callable[[Callable[[float], None]], None],
                 load: Callable[[Phase], "tuple[EngineLike, dict]"], stop: Callable[[], None] = lambda: None):
        self.model, self.why = model, why
        self.room, self.convert, self.load, self.stop = room, convert, load, stop


def waiting_status(model: str, why: str) -> dict:
    """`status`'s upgrade entry from the first load until the conversion starts."""
    return {"model": model, "phase": "converting", "progress": 0.0, "s": 0.0,
            "why": f"{model} is this CPU's default ({why}); it converts in the background once the smaller "
                   "model serves"}


def off_status(model: str, why: str, command: str | None = None) -> dict:
    """--no-upgrade: what the default would be, and that this daemon stays on the smaller model;
    `command`: the one that converts it (default `completiond convert MODEL`)."""
    command = command or f"completiond convert {model}"
    return {"model": model, "phase": "off", "progress": None,
            "why": f"--no-upgrade: {model} is this CPU's default ({why}) but this daemon does not convert it "
                   f"or switch to it; `{command}` converts it, and the next start serves it"}


class Switching(Protocol):
    """The daemon (daemon.Daemon) as the upgrade sees it: daemon.py imports this module, so the type is
    named here and nothing of daemon.py is imported (no import circle, type-only ones included)."""
    ready: asyncio.Event
    stopping: asyncio.Event
    error: str | None
    info: dict

    async def switch(self, engine: EngineLike, info: dict) -> bool: ...


class Upgrade:
    """The background upgrade of `daemon`, once its first load is in: `steps()` says how (None where
    the first load found nothing to upgrade to)."""

    def __init__(self, daemon: Switching, steps: Callable[[], Steps | None]):
        self.d = daemon
        self._steps = steps
        self.steps: Steps | None = None
        self.model = ""
        self.started = time.time()

    def _set(self, phase: str, progress: float | None, note: str, **extra: Any) -> None:
        """`status`'s upgrade entry. Replaced whole (the key stays): a status being built meanwhile
        on the event loop reads one version or the other."""
        self.d.info["upgrade"] = {"model": self.model, "phase": phase,
                                  "progress": None if progress is None else round(progress, 3),
                                  "why": note, "s": round(time.time() - self.started, 1), **extra}

    async def run(self) -> None:
        d = self.d
        await d.ready.wait()
        self.steps = self._steps()
        if d.error or d.stopping.is_set() or self.steps is None:
            return
        steps, self.model = self.steps, self.steps.model
        serving = d.info.get("target")
        self.started = time.time()
        try:
            if (short := await _in_thread(steps.room)) is not None:
                raise UpgradeError(short)
            self._set("converting", 0.0, f"converting {self.model} in the background at the lowest CPU priority; "
                                         f"{serving} serves meanwhile")
            t0 = time.time()
            await _in_thread(steps.convert, self._converted)
            converted_s = time.time() - t0
            self._set("loading", 1.0, f"loading {self.model} ({serving} serves meanwhile)")
            engine, info = await _in_thread(steps.load, self._loading)
            if d.stopping.is_set():
                return
            self._set("loading", 1.0, f"switching to {self.model} between requests")
            released = await d.switch(engine, info)
            del engine
            self._set("switched", 1.0, f"{self.model} serves since {time.strftime('%H:%M:%S')} (converted in "
                                       f"{converted_s:.0f} s, in the background): "
                                       f"{info.get('default_reason') or steps.why}",
                      previous=serving, released=released)
            log.info("upgrade: %s serves now (converted in %.0f s); %s was released: %s", self.model, converted_s,
                     serving, released)
        except Exception as e:  # ModelError, UpgradeError, OSError...: one line, and the smaller keeps serving
            if d.stopping.is_set():
                return
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            self._set("failed", d.info["upgrade"].get("progress"), f"{why}; {serving} keeps serving")
            log.warning("upgrade to %s failed: %s; %s keeps serving", self.model, why, serving)

    def stop(self) -> None:
        """The daemon stops: end a conversion under way (its child process)."""
        if self.steps is not None:
            self.steps.stop()

    def _converted(self, fraction: float) -> None:  # the conversion's thread
        self._set("converting", fraction, self.d.info["upgrade"]["why"])

    def _loading(self, name: str, progress: float | None = None) -> None:  # the load's thread
        self._set("loading", 1.0, f"loading {self.model}: {name}")


class UpgradeError(Exception):
    """The machine lacks what the upgrade needs: its message is one line for the user."""


async def _in_thread(fn: Callable, *args) -> Any:
    """`fn(*args)` on a daemon thread of its own (a conversion waiting for another process's lock
    must not hold up the daemon's exit, as a thread of asyncio's executor would)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    def run() -> None:
        value, error = None, None
        try:
            value = fn(*args)
        except BaseException as e:  # noqa: BLE001 (handed to the awaiting task)
            error = e
        try:
            loop.call_soon_threadsafe(_settle, done, value, error)
        except RuntimeError:  # the loop closed meanwhile: the daemon has stopped
            pass

    threading.Thread(target=run, name="upgrade", daemon=True).start()
    return await done


def _settle(fut: asyncio.Future, value: Any, error: BaseException | None) -> None:
    if fut.cancelled():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)
