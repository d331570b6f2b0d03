"""A suggestion never writes typed words again, on the real default model (issue 38 item 5): the
0.5B answered `    def ` inside a class with `def make_error(…` (shown as `def def make_error`) and
`# x = ` with `x = …`. Here the daemon's answers and its streamed text at such line heads."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from completiond.core.prompt.stops import repeated_head
from completiond.service.client import Client
from daemon_util import stop_daemon, wait_for_socket, wait_ready

pytestmark = pytest.mark.real_model

CLASS = '''import json


class ApiError(Exception):
    """An error from the API, with its HTTP status."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message

    def to_dict(self):
        return {"status": self.status, "message": self.message}

'''
# (document before the cursor's line, the line head): the cursor sits at the end of the head
HEADS = [
    (CLASS, "    def "),
    (CLASS, "    # x = "),
    (CLASS + "    def from_response(self, response):\n", "        status = "),
    ("import os\n\n", "def "),
    ("import os\n\n\ndef main():\n", "    return "),
    ("# Parse the command line.\n", "# x = "),
]


async def ask(sock: Path) -> list[tuple[str, str, str]]:
    c = await Client.connect(sock)
    out = []
    try:
        await c.request("initialize", {"client": "test", "protocol": 1, "workspace_roots": []})
        for i, (before, head) in enumerate(HEADS):
            uri = f"file:///w/repeat{i}.py"
            text = before + head
            await c.request("document/open", {"uri": uri, "text": text, "version": 1, "language_id": "python"})
            streamed: list[str] = []
            unsubscribe = c.on("complete/partial", lambda p: streamed.append(p["text"]))
            line = text.count("\n")
            res = await asyncio.wait_for(c.request("complete", {
                "uri": uri, "position": {"line": line, "character": len(head)}, "max_tokens": 16,
                "mode": "ar", "multiline": False}), 600)
            unsubscribe()
            out.append((head, res["text"], "".join(streamed)))
    finally:
        await c.close()
    return out


def test_no_suggestion_repeats_the_line_head(tmp_path):
    sock = tmp_path / "d.sock"
    proc = subprocess.Popen([sys.executable, "-m", "completiond", "serve", "--socket", str(sock), "--device", "cpu",
                             "--log-level", "WARNING"], stdout=open(tmp_path / "serve.log", "wb"),
                            stderr=subprocess.STDOUT)
    try:
        wait_for_socket(sock, proc, 900)
        wait_ready(sock, proc, 1800)
        answers = asyncio.run(ask(sock))
    finally:
        stop_daemon(proc)
    for head, text, streamed in answers:
        assert repeated_head(head, text) == 0, (head, text)
        assert repeated_head(head, streamed) == 0 and text.startswith(streamed), (head, text, streamed)
    # the model wrote something at most of these heads (an empty answer repeats nothing, but says nothing)
    assert sum(1 for _, text, _ in answers if text.strip()) >= len(HEADS) // 2, answers
