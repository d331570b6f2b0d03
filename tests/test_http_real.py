"""`/infill` on the real default model (Qwen2.5-Coder-0.5B): llama.vim's request gets the completion
the daemon's own protocol gives for the same buffer and cursor, and a sensible one."""

import asyncio
import json
import subprocess
import sys

import pytest

from completiond.service.client import Client
from daemon_util import stop_daemon, wait_for_socket, wait_ready
from test_http import call, doc_of, fixture, free_port

pytestmark = pytest.mark.real_model


async def test_llama_vim_infill_on_the_default_model(tmp_path):
    port, sock = free_port(), tmp_path / "d.sock"
    proc = subprocess.Popen([sys.executable, "-m", "completiond", "serve", "--socket", str(sock), "--device", "cpu",
                             "--http", f"127.0.0.1:{port}", "--token-file", str(tmp_path / "token"),
                             "--log-level", "WARNING"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        await asyncio.to_thread(wait_for_socket, sock, proc)
        await asyncio.to_thread(wait_ready, sock, proc, 900)
        srv = {"port": port, "token": (tmp_path / "token").read_text().strip()}
        req = fixture("llama_vim_fim")
        req.update(n_predict=16, t_max_predict_ms=60_000)  # no time cut: the whole text compares
        status, out = await asyncio.to_thread(call, srv, "POST", "/infill", req, timeout=600)
        assert status == 200, out
        text, cursor = doc_of(req)
        c = await Client.connect(sock)
        try:
            await c.request("initialize", {"client": "t", "protocol": 1, "position_encoding": "utf-32"})
            await c.request("document/open", {"uri": "file:///utils.py", "text": text, "version": 1})
            line = text[:cursor].count("\n")
            wire = await c.request("complete", {"uri": "file:///utils.py", "max_tokens": 16, "position": {
                "line": line, "character": cursor - text.rfind("\n", 0, cursor) - 1}}, timeout=600)
        finally:
            await c.close()
        print(json.dumps({"infill": out["content"], "wire": wire["text"], "timings": {
            k: v for k, v in out.items() if k.startswith("timings/")}}))
        assert out["content"].strip() and out["content"] == wire["text"]  # greedy: the same engine, the same text
        assert out["timings/predicted_n"] > 0 and out["tokens_cached"] > out["timings/predicted_n"]
        # typed on: `total = sum(` in a mean() of `values` -- the same document, and a sensible answer
        req["prompt"] += "sum("
        status, more = await asyncio.to_thread(call, srv, "POST", "/infill", req, timeout=600)
        print(json.dumps({"typed_on": more["content"]}))
        assert status == 200 and "values)" in more["content"]  # the 0.5B: "(v - m) ** 2 for v in values) / n"
    finally:
        assert stop_daemon(proc) == 0
