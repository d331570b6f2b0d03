"""Editors tell the truth (issue 38 items 5-7): a suggestion never writes typed text again, the LSP
answers every request (malformed ones with an error), and the daemon refuses an older version."""

from __future__ import annotations

import pytest

from completiond.core.prompt.stops import drop_repeated_head, repeated_head

# Real line heads (the text before the cursor on its line) and a completion that writes the line's
# last words again, with what the editor must get instead.
REPEATS = [
    ("    def ", "def make_error(self, msg):", "make_error(self, msg):"),
    ("def ", "def main():", "main():"),
    ("    # x = ", "x = compute()", "compute()"),
    ("# x = ", "x = 1", "1"),
    ("        return ", "return self.value", "self.value"),
    ("    result = ", "result = []", "[]"),
    ("class ", "class Parser:", "Parser:"),
    ("import ", "import os", "os"),
    ("from ", "from typing import Any", "typing import Any"),
    ("    for ", "for i in range(n):", "i in range(n):"),
    ("    if ", "if x is None:", "x is None:"),
    ("\tself.count = ", "self.count = 0", "0"),
    ("// total = ", "total = a + b;", "a + b;"),
    ("    async def ", "async def fetch(url):", "fetch(url):"),
    ("    async def ", "def fetch(url):", "fetch(url):"),
    ("    x = y = ", "y = 0", "0"),
    ("    yield ", "yield  item", "item"),
    ("    def ", "def", ""),
]

# Completions that only look like repeats: kept as they are.
KEEPS = [
    ("    def ", "make_error(self):"),
    ("    return ", "return_value"),  # a longer word, not the keyword again
    ("x = ", "x + 1"),  # uses the name, does not write `x =` again
    ("    ", "def f():"),  # indentation only: nothing typed to repeat
    ("    def", " make(self):"),  # no blank before the cursor
    ("long ", "long x = 0;"),  # C's `long long`
    ("    if ", "ifdef"),
    ("    x = ", "\n"),
    ("# ", "x = 1"),
    ("", "def f():"),
]


@pytest.mark.parametrize("head,text,want", REPEATS)
def test_a_repeat_of_the_line_head_is_dropped(head, text, want):
    assert drop_repeated_head(head, text) == want


@pytest.mark.parametrize("head,text", KEEPS)
def test_text_that_is_not_a_repeat_is_kept(head, text):
    assert drop_repeated_head(head, text) == text


@pytest.mark.parametrize("head,text,want", REPEATS)
def test_streamed_text_is_held_until_it_can_tell(head, text, want):
    """Token by token (here: character by character) the shown text is a prefix of the final one and
    never shows a repeat, even for a moment."""
    shown = ""
    for i in range(1, len(text) + 1):
        out = drop_repeated_head(head, text[:i], final=False)
        if out is None:
            continue
        assert out.startswith(shown) or not shown, (text[:i], shown, out)
        shown = out
        assert want.startswith(shown), (text[:i], shown)
    assert drop_repeated_head(head, text) == want


def test_undecided_while_the_text_could_still_become_a_repeat():
    assert repeated_head("    def ", "de", final=False) is None
    assert repeated_head("    def ", "def", final=False) is None
    assert repeated_head("    def ", "de", final=True) == 0  # `de...` may be a name: kept when final
    assert repeated_head("    def ", "x", final=False) == 0


# ---- the daemon's copy of a document ------------------------------------------------------------
def test_document_change_refuses_an_older_version():
    from completiond.service.documents import Document, DocumentError

    doc = Document("file:///a.py", "x = 1\n", 5)
    with pytest.raises(DocumentError, match="version 4 is older than the document's 5"):
        doc.apply([{"text": "y"}], 4)
    assert (doc.text, doc.version) == ("x = 1\n", 5)
    doc.apply([{"text": "x = 2\n"}], 5)  # the same version again: allowed (a client with no versions)
    doc.apply([{"text": "x = 3\n"}], 6)
    assert (doc.text, doc.version) == ("x = 3\n", 6)


# ---- the real completiond-lsp against a real daemon (tiny model) ----------------------------------
import asyncio  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from lsp_util import RawLsp, doc_item, position_params  # noqa: E402

URI = "file:///w/truth.py"
SRC = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    "


def options(sock, **kw) -> dict:
    return {"socket": str(sock), "autostart": False, "debounceMs": 0, "maxTokens": 8, **kw}


async def ready_lsp(sock, log_file: Path | None = None, **kw) -> RawLsp:
    """An LSP connected to the daemon at `sock`: the editor's edits from here reach it one by one."""
    lsp = await RawLsp.start(log_file=log_file)
    await lsp.initialize(options(sock, **kw))
    for _ in range(600):
        if any(n["method"] == "completiond/status" and n["params"]["state"] == "ready" for n in lsp.notifications):
            return lsp
        await asyncio.sleep(0.05)
    raise TimeoutError("the LSP never said ready")


MALFORMED = [
    position_params(URI, "x", 0),  # the issue's `line: "x"`
    position_params(URI, 0, None),
    {"textDocument": {"uri": URI}},
    {"textDocument": 5, "position": [], "context": "x"},
    [1, 2, 3],
    "params",
    None,
]


async def test_malformed_params_get_an_error_not_silence(daemon):
    lsp = await ready_lsp(daemon)
    try:
        lsp.notify("textDocument/didOpen", doc_item(URI, SRC))
        for params in MALFORMED:
            msg_id = lsp.request("textDocument/inlineCompletion", params)
            res = await lsp.answer(msg_id, 20)
            assert res.get("error", {}).get("code") == -32602, (params, res)
            assert "textDocument/inlineCompletion" in res["error"]["message"]
        res = await lsp.call("textDocument/codeAction", {"textDocument": {"uri": URI}, "range": "everything"}, 20)
        assert res["error"]["code"] == -32602
        # still serving
        res = await lsp.call("textDocument/inlineCompletion", position_params(URI, 5, 4), 60)
        assert "result" in res and lsp.alive()
    finally:
        await lsp.close()


async def test_unopened_document_names_did_open(daemon):
    lsp = await ready_lsp(daemon)
    try:
        res = await lsp.call("textDocument/inlineCompletion", position_params("file:///w/never.py", 0, 0), 20)
        assert res["error"]["code"] == -32602
        assert "textDocument/didOpen" in res["error"]["message"] and "document/open" not in \
            res["error"]["message"].replace("textDocument/didOpen", "")
    finally:
        await lsp.close()


async def test_a_document_over_the_limit_says_too_large(daemon):
    from completiond.service.protocol import MAX_DOCUMENT_CHARS

    lsp = await ready_lsp(daemon)
    try:
        big = "x = 1\n" * (MAX_DOCUMENT_CHARS // 6 + 1000)
        lsp.notify("textDocument/didOpen", doc_item(URI, big))
        res = await lsp.call("textDocument/inlineCompletion", position_params(URI, 3, 0), 60)
        message = res["error"]["message"]
        assert "too large" in message and "4.0 MiB" in message and "limit 4 MiB" in message, message
        shown = [n["params"]["message"] for n in lsp.notifications if n["method"] == "window/showMessage"]
        assert any("too large" in m for m in shown), shown
        # cut back under the limit: the daemon gets the whole text and completions work again
        lsp.notify("textDocument/didChange", {"textDocument": {"uri": URI, "version": 2},
                                              "contentChanges": [{"text": SRC}]})
        res = await lsp.call("textDocument/inlineCompletion", position_params(URI, 5, 4), 60)
        assert "result" in res, res
    finally:
        await lsp.close()


async def direct(sock, text: str, line: int, char: int) -> str:
    from completiond.service.client import Client

    rpc = await Client.connect(sock)
    try:
        await rpc.request("document/open", {"uri": URI, "text": text, "version": 1})
        res = await rpc.request("complete", {"uri": URI, "position": {"line": line, "character": char},
                                             "max_tokens": 8})
        return res["text"]
    finally:
        await rpc.close()


async def test_a_refused_edit_resends_the_whole_document(daemon, tmp_path):
    """An edit at an older version (an editor's bug) is refused by the daemon; the LSP sends its whole
    text again and says so, and completions come from the editor's text (not an empty answer)."""
    log = tmp_path / "lsp.log"
    # connected first: edits made before are sent whole on connecting, and none is refused
    lsp = await ready_lsp(daemon, log_file=log)
    try:
        lsp.notify("textDocument/didOpen", doc_item(URI, "x = 1\n", version=5))
        edited = SRC
        lsp.notify("textDocument/didChange", {"textDocument": {"uri": URI, "version": 3},
                                              "contentChanges": [{"text": edited}]})
        res = await lsp.call("textDocument/inlineCompletion", position_params(URI, 5, 4), 60)
        want = await direct(daemon, edited, 5, 4)
        items = res["result"]["items"]
        assert (items[0]["insertText"] if items else "") == want and want
        logged = [n["params"]["message"] for n in lsp.notifications if n["method"] == "window/logMessage"]
        assert any("refused an edit" in m and "whole document again" in m for m in logged), logged
        assert "version 3 is older" in log.read_text()
    finally:
        await lsp.close()


async def test_lsp_fuzz_every_request_answered(daemon, tmp_path):
    """A short run of benchmarks/lsp_fuzz.py's messages (the long one is the benchmark): malformed and
    out-of-order messages, cancels, unknown methods, documents over the limit; every request gets an
    answer, none of them an internal error, and the server still completes afterwards."""
    from lsp_util import fuzz_messages, run_fuzz

    lsp = await RawLsp.start(log_file=tmp_path / "lsp.log")
    await lsp.initialize(options(daemon, maxTokens=4))
    try:
        out = await run_fuzz(lsp, fuzz_messages(300, seed=7, huge_every=150), answer_timeout=240)
        assert out["unanswered"] == [] and out["answered"] == out["requests"] > 100, out
        assert "-32603" not in out["answers"] and out["server_alive"], out
        assert out["answers"].get("-32602", 0) > 20 and out["answers"].get("result", 0) > 5, out
        lsp.notify("textDocument/didOpen", doc_item("file:///after.py", SRC))
        res = await lsp.call("textDocument/inlineCompletion", position_params("file:///after.py", 5, 4), 120)
        assert "result" in res, res
    finally:
        await lsp.close()
