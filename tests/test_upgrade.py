"""A first start's background upgrade (service/upgrade.py), on the real daemon over its socket.

Tiny random Qwen2 GGUFs stand in for the named pair (tests/upgrade_serve.py); the CPU "chose" the
larger one. `serve --target default` then serves the smaller at once, converts the larger in the
background (the real child-process converter, held back here by holding the cache's conversion lock,
as another process converting would) and switches between requests: requests before, during and
after the switch all answer, each greedy answer identical to plain (`ar`) decoding on the engine
that served it. `--no-upgrade` and a named target never switch; a failed conversion keeps the
smaller model and says why.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import tiny_gguf
from completiond.models import choice
from completiond.models.catalog import file_lock
from completiond.service.client import Client
from daemon_util import daemon_status, stop_daemon, wait_for_socket, wait_ready

LARGER, SMALLER = choice.MEASURED_PAIR
HERE = Path(__file__).parent
SRC = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"
POS = {"line": 8, "character": 14}


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("ggufs")
    return {SMALLER: str(tiny_gguf.write_qwen2_gguf(folder / "small.gguf", seed=1)),
            LARGER: str(tiny_gguf.write_qwen2_gguf(folder / "large.gguf", seed=2, layers=3))}


@pytest.fixture(scope="module")
def base_cache(tmp_path_factory, ggufs) -> Path:
    """A cache with the smaller model converted (what a first start's foreground load leaves): each
    test copies it, so every daemon starts with the larger model not converted."""
    import torch

    from completiond.models import loader as models

    cache = tmp_path_factory.mktemp("base-cache")
    old = os.environ.get("COMPLETIOND_CACHE")
    os.environ["COMPLETIOND_CACHE"] = str(cache)
    try:
        models.ensure_runtime(Path(ggufs[SMALLER]), models.runtime_dir(SMALLER), torch.float32, "none", progress=False)
    finally:
        if old is None:
            os.environ.pop("COMPLETIOND_CACHE")
        else:
            os.environ["COMPLETIOND_CACHE"] = old
    return cache


def serve(tmp_path: Path, base_cache: Path, ggufs: dict, *flags: str, target: str = "default",
          larger_form: str | None = "none", available_memory: int | None = None) -> tuple[subprocess.Popen, Path, Path]:
    """(process, socket, cache) of a real daemon with the tiny pair standing in; ready when it returns."""
    cache = tmp_path / "cache"
    shutil.copytree(base_cache, cache, dirs_exist_ok=True)
    sock = tmp_path / "d.sock"
    env = {**os.environ, "COMPLETIOND_CACHE": str(cache),
           "UPGRADE_TEST": json.dumps({"ggufs": ggufs, "larger_form": larger_form,
                                       "available_memory": available_memory})}
    cmd = [sys.executable, str(HERE / "upgrade_serve.py"), "serve", "--socket", str(sock), "--target", target,
           "--dtype", "float32", "--quick-prompt-ms", "-1", "--log-level", "INFO", *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "daemon.log", "wb"), env=env)
    wait_for_socket(sock, proc)
    wait_ready(sock, proc)
    return proc, sock, cache


async def connect(sock: Path, uri: str) -> Client:
    c = await Client.connect(sock)
    await c.request("initialize", {"client": "test", "protocol": 1, "workspace_roots": []})
    await c.request("document/open", {"uri": uri, "text": SRC, "version": 1, "language_id": "python"})
    return c


async def complete(c: Client, uri: str, mode: str) -> dict:
    return await c.request("complete", {"uri": uri, "position": POS, "max_tokens": 16, "mode": mode}, timeout=120)


async def until(sock: Path, phase: str, timeout: float = 240.0) -> list[dict]:
    """The upgrade entries status showed until its phase is `phase`."""
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        up = (await asyncio.to_thread(daemon_status, sock)).get("upgrade")
        seen.append(up)
        if up and up["phase"] == phase:
            return seen
        assert not up or up["phase"] != "failed", up
        await asyncio.sleep(0.1)
    raise TimeoutError(f"upgrade never reached {phase}: last {seen[-1]}")


async def test_serves_the_smaller_then_switches_losing_no_request(tmp_path, base_cache, ggufs):
    """The larger model's conversion waits on the cache's lock (held here, as another converting
    process would hold it) while the smaller one serves; released, it converts, loads and switches.
    Two clients keep asking all along: every answer comes, and equals `ar` on one of the engines
    (the smaller before, the larger after)."""
    from completiond.models import loader as models

    os.environ["COMPLETIOND_CACHE"] = str(tmp_path / "cache")  # where the daemon's cache will be
    try:
        folder = models.runtime_dir(LARGER)
    finally:
        os.environ.pop("COMPLETIOND_CACHE")
    holder = file_lock(folder.with_name(folder.name + ".lock"))
    holder.__enter__()  # before the daemon starts: its conversion must wait for us
    proc = None
    try:
        proc, sock, _ = serve(tmp_path, base_cache, ggufs)
        st = daemon_status(sock)
        assert st["target"] == f"{SMALLER}@none" and st["upgrade"]["model"] == f"{LARGER}@none"
        assert st["upgrade"]["phase"] == "converting" and "in the background" in st["default_reason"]
        c1, c2 = await connect(sock, "file:///w/a.py"), await connect(sock, "file:///w/b.py")
        small_ar = (await complete(c1, "file:///w/a.py", "ar"))["text"]
        assert (await complete(c1, "file:///w/a.py", "combined"))["text"] == small_ar
        assert small_ar.strip(), "the tiny model must say something for the comparison to mean anything"

        answers: list[tuple[float, str]] = []
        stop = asyncio.Event()

        async def keep_asking(c: Client, uri: str) -> None:
            while not stop.is_set():
                res = await complete(c, uri, "combined")
                assert not res["cancelled"]
                answers.append((time.monotonic(), res["text"]))

        askers = [asyncio.create_task(keep_asking(c, u)) for c, u in ((c1, "file:///w/a.py"), (c2, "file:///w/b.py"))]
        await asyncio.sleep(1.0)
        assert (await asyncio.to_thread(daemon_status, sock))["upgrade"]["phase"] == "converting"
        holder.__exit__(None, None, None)
        holder = None
        seen = await until(sock, "switched")
        switched_at = time.monotonic()
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.gather(*askers)

        st = daemon_status(sock)
        up = st["upgrade"]
        assert st["target"] == f"{LARGER}@none" and up["phase"] == "switched" and up["progress"] == 1.0
        assert up["previous"] == f"{SMALLER}@none" and up["released"] is True  # the old engine is gone
        assert st["default_reason"].startswith(f"{LARGER}@none: its passes measured fast enough here")
        phases = [u["phase"] for u in seen if u]
        assert phases[0] == "converting" and "loading" in phases and phases[-1] == "switched"
        assert phases == sorted(phases, key=["converting", "loading", "switched"].index)
        progress = [u["progress"] for u in seen if u and u["phase"] == "converting"]
        assert progress == sorted(progress)

        large_ar = (await complete(c1, "file:///w/a.py", "ar"))["text"]
        assert large_ar != small_ar  # two different models: the comparison below tells them apart
        assert (await complete(c2, "file:///w/b.py", "combined"))["text"] == large_ar
        assert {text for _, text in answers} <= {small_ar, large_ar}
        assert any(text == small_ar for _, text in answers)
        after = [text for t, text in answers if t > switched_at + 0.5]
        assert after and all(text == large_ar for text in after)
        await c1.close()
        await c2.close()
    finally:
        if holder is not None:
            holder.__exit__(None, None, None)
        if proc is not None:
            assert stop_daemon(proc) == 0


@pytest.mark.parametrize("flags, target", [(("--no-upgrade",), "default"), ((), SMALLER)])
async def test_no_upgrade_and_a_named_target_never_switch(tmp_path, base_cache, ggufs, flags, target):
    proc, sock, cache = serve(tmp_path, base_cache, ggufs, *flags, target=target)
    try:
        await asyncio.sleep(3.0)  # time an upgrade would have had to start
        st = daemon_status(sock)
        assert st["target"] == f"{SMALLER}@none"
        if target == "default":
            assert st["upgrade"]["phase"] == "off" and "--no-upgrade" in st["upgrade"]["why"]
            assert "--no-upgrade is set" in st["default_reason"]
            # the command converts the form this daemon loads: its --dtype float32, not the auto dtype
            assert f"`completiond convert {LARGER}@none --dtype float32`" in st["default_reason"]
            assert f"`completiond convert {LARGER}@none --dtype float32`" in st["upgrade"]["why"]
        else:
            assert "upgrade" not in st and st["default_reason"] is None
        assert not (cache / "runtime" / LARGER).exists()  # nothing converted
    finally:
        assert stop_daemon(proc) == 0


@pytest.mark.parametrize("case", ["damaged", "memory"])
async def test_a_failed_upgrade_keeps_the_smaller_serving_and_says_why(tmp_path, base_cache, ggufs, case):
    if case == "damaged":  # a GGUF the converter cannot read
        bad = tmp_path / "large.gguf"
        bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)
        ggufs, memory = {**ggufs, LARGER: str(bad)}, None
    else:
        memory = 200_000_000  # 0.2 GB "available": less than a conversion needs
    proc, sock, cache = serve(tmp_path, base_cache, ggufs, available_memory=memory)
    try:
        deadline = time.monotonic() + 120
        while (up := daemon_status(sock)["upgrade"])["phase"] not in ("failed", "switched"):
            assert time.monotonic() < deadline, up
            await asyncio.sleep(0.1)
        assert up["phase"] == "failed" and up["why"].endswith(f"{SMALLER}@none keeps serving")
        assert "\n" not in up["why"]
        if case == "memory":
            assert up["why"].startswith("not enough memory to convert large.gguf")
        else:
            assert "large.gguf" in up["why"]
        st = daemon_status(sock)
        assert st["target"] == f"{SMALLER}@none" and st["state"] == "ready"
        c = await connect(sock, "file:///w/a.py")
        assert (await complete(c, "file:///w/a.py", "combined"))["text"] == \
            (await complete(c, "file:///w/a.py", "ar"))["text"]
        await c.close()
        log = (tmp_path / "daemon.log").read_text()
        assert sum(f"upgrade to {LARGER}@none failed" in line for line in log.splitlines()) == 1
    finally:
        assert stop_daemon(proc) == 0


def test_complete_without_a_daemon_follows_the_same_choice(tmp_path, base_cache, ggufs):
    """`complete --no-daemon` serves the smaller model and says in one line that the larger default
    converts on the daemon's start (or now, with `completiond convert`), which runs as printed."""
    cache = tmp_path / "cache"
    shutil.copytree(base_cache, cache)
    src = tmp_path / "m.py"
    src.write_text(SRC)
    env = {**os.environ, "COMPLETIOND_CACHE": str(cache),
           "UPGRADE_TEST": json.dumps({"ggufs": ggufs, "larger_form": "none"})}
    out = subprocess.run([sys.executable, str(HERE / "upgrade_serve.py"), "complete", str(src), "--line", "9",
                          "--col", "15", "--no-daemon", "--dtype", "float32", "--max-tokens", "8", "--json"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["target"] == f"{SMALLER}@none" and "in the background" in res["default_reason"]
    lines = [ln for ln in out.stderr.splitlines() if LARGER in ln]
    assert len(lines) == 1 and lines[0].startswith(f"completiond: {SMALLER}@none answers while {LARGER}@none")
    command = lines[0].split("`")[3]
    assert command == f"completiond convert {LARGER}@none --dtype float32"  # the form this start loads
    from completiond import cli  # runs as printed: the convert subcommand takes that --dtype
    a = cli.build_parser().parse_args(command.split()[1:])
    assert (a.command, a.model, a.dtype) == ("convert", f"{LARGER}@none", "float32")
    assert not (cache / "runtime" / LARGER).exists()  # nothing converted by a completion


async def test_a_request_under_way_at_the_switch_ends_on_the_engine_it_began_on(tmp_path):
    """Daemon.switch in process: a long request running on the old engine when the switch comes is
    answered by that engine (its `ar` text, whole), and the next one by the new engine. (Whether the
    old engine is released is checked on the real daemon above: here in_process holds it.)"""
    import tiny
    from completiond.core.engine import Engine
    from daemon_util import in_process

    old, new = (Engine(tiny.loaded(tiny.qwen2_config(layers=n), seed=s, scale=4.0)) for n, s in ((2, 1), (3, 2)))
    new.index = None  # built with the daemon's index, as the upgrade's load builds it
    uri = "file:///w/long.py"
    async with in_process(tmp_path, old, warm=False) as (c, daemon):
        new.index = daemon.index
        await c.request("document/open", {"uri": uri, "text": SRC, "version": 1, "language_id": "python"})
        params = {"uri": uri, "position": POS, "max_tokens": 200, "multiline": True}
        old_ar = (await c.request("complete", {**params, "mode": "ar"}))["text"]
        gate = threading.Event()  # the old engine's thread waits here: the request stays queued on it
        daemon.scheduler.submit(lambda ctx: gate.wait(30))
        running = asyncio.ensure_future(c.request("complete", {**params, "mode": "combined"}))
        while len(daemon.scheduler.jobs) < 2:  # it reached the old engine's scheduler
            await asyncio.sleep(0.001)
        switching = asyncio.ensure_future(daemon.switch(new, {"target": "new"}))
        await asyncio.sleep(0.2)
        assert daemon.engine is new and not switching.done() and not running.done()
        gate.set()
        assert (await running)["text"] == old_ar  # the whole answer from the engine it was sent to
        await switching
        new_ar = (await c.request("complete", {**params, "mode": "ar"}))["text"]
        assert new_ar != old_ar and (await c.request("complete", {**params, "mode": "combined"}))["text"] == new_ar
        assert (await c.request("status", {}))["target"] == "new"
