"""A remote target (`--target openai:URL#model`, `llamacpp:URL#model`) against a second completiond's
`--http`: the same completion as the server gives its own editors; a server that is down, answers
500 or never answers becomes a clear error for that request, and the daemon serves on."""

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from completiond.core.remote import RemoteError, parse_remote
from completiond.service.client import Client, DaemonError
from daemon_util import start_daemon, stop_daemon
from test_http import free_port

DOC = "def area(r):\n    return \n\n\nprint(area(2))\n"
CURSOR = {"line": 1, "character": 11}


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_dir):
    """The team's server: a completiond with --http on the tiny model."""
    tmp = tmp_path_factory.mktemp("remote-server")
    port = free_port()
    proc = start_daemon(tmp / "d.sock", tiny_dir, "--http", f"127.0.0.1:{port}", "--token-file", str(tmp / "token"))
    yield {"port": port, "token_file": tmp / "token", "sock": tmp / "d.sock"}
    assert stop_daemon(proc) == 0


def remote_daemon(tmp, tiny_dir, spec: str, *extra: str):
    """A laptop's daemon whose target is `spec` (its tokenizer: the tiny model's)."""
    return start_daemon(tmp / "laptop.sock", tiny_dir, "--target", spec, *extra)


async def complete(sock, text: str = DOC, uri: str = "file:///a.py", timeout: float = 120) -> dict:
    c = await Client.connect(sock)
    try:
        await c.request("initialize", {"client": "t", "protocol": 1})
        await c.request("document/open", {"uri": uri, "text": text, "version": 1})
        partials = []
        c.on("complete/partial", lambda p: partials.append(p["text"]))
        res = await c.request("complete", {"uri": uri, "position": CURSOR, "max_tokens": 12}, timeout=timeout)
        return {**res, "partials": partials}
    finally:
        await c.close()


@pytest.mark.parametrize("kind", ["openai", "llamacpp"])
async def test_remote_target_gives_the_servers_completion(server, tmp_path, tiny_dir, kind):
    base = f"http://127.0.0.1:{server['port']}" + ("/v1" if kind == "openai" else "")
    proc = remote_daemon(tmp_path, tiny_dir, f"{kind}:{base}#{tiny_dir}", "--remote-token-file",
                         str(server["token_file"]))
    try:
        local = await complete(server["sock"])  # what the server's own editors get
        remote = await complete(tmp_path / "laptop.sock")
        assert remote["text"] == local["text"] and remote["text"]
        assert "".join(remote["partials"]) == remote["text"]  # streamed as it came from the server
        assert remote["target_passes"] == 0  # no model ran on the laptop
        c = await Client.connect(tmp_path / "laptop.sock")
        st = await c.request("status", {})
        await c.close()
        assert st["target"].startswith(f"{kind}:") and st["device"] == "remote"
    finally:
        assert stop_daemon(proc) == 0


class _Failing(BaseHTTPRequestHandler):
    mode = "500"

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.server.mode == "hang":
            time.sleep(30)
            return
        body = json.dumps({"error": {"code": 500, "message": "CUDA out of memory", "type": "server_error"}}).encode()
        self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def failing_server(mode: str) -> ThreadingHTTPServer:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    srv.mode = mode
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def failing_target(failure: str) -> tuple[str, str, ThreadingHTTPServer | None]:
    """(URL, words the error must carry, server or None) for a remote target that is "down" (a port
    nobody listens on), answers "500", or is "silent"."""
    if failure == "down":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return f"http://127.0.0.1:{s.getsockname()[1]}/v1", "is down (connection refused)", None
    srv = failing_server("500" if failure == "500" else "hang")
    words = "answered 500: CUDA out of memory" if failure == "500" else "did not answer within 2 s"
    return f"http://127.0.0.1:{srv.server_port}/v1", words, srv


async def test_server_down_500_and_silent_are_errors_not_hangs(tmp_path, tiny_dir):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        down = s.getsockname()[1]
    err500, hang = failing_server("500"), failing_server("hang")
    cases = [(f"openai:http://127.0.0.1:{down}/v1", "is down (connection refused)"),
             (f"openai:http://127.0.0.1:{err500.server_port}/v1", "answered 500: CUDA out of memory"),
             (f"llamacpp:http://127.0.0.1:{hang.server_port}", "did not answer within 2 s")]
    try:
        for i, (url, words) in enumerate(cases):
            d = tmp_path / str(i)
            d.mkdir()
            proc = remote_daemon(d, tiny_dir, f"{url}#{tiny_dir}", "--remote-timeout", "2")
            try:
                t0 = time.monotonic()
                with pytest.raises(DaemonError) as e:
                    await complete(d / "laptop.sock", timeout=60)
                assert words in e.value.message and url.split(":", 1)[1] in e.value.message
                assert time.monotonic() - t0 < 30
                c = await Client.connect(d / "laptop.sock")  # and the daemon serves on
                assert (await c.request("status", {}))["state"] == "ready"
                await c.close()
            finally:
                assert stop_daemon(proc) == 0
    finally:
        err500.shutdown()
        hang.shutdown()


def test_remote_spec_is_checked():
    assert parse_remote("openai:http://h:1/v1#m").url == "http://h:1/v1"
    assert parse_remote("llamacpp:https://h:8012/").url == "https://h:8012"
    assert parse_remote("openai:http://h:1/v1#m#raw").raw and not parse_remote("openai:http://h:1/v1#m").raw
    assert parse_remote("openai:http://h:1/v1##raw").model == "default"
    for bad in ("openai:ftp://h/x", "openai:http://", "vllm:http://h:1", "openai:http://h:1/v1#m#fast",
                "llamacpp:http://h:1#m#raw"):
        with pytest.raises(RemoteError):
            parse_remote(bad)


def test_raw_fim_prompts_are_read_as_vllm_takes_them():
    from completiond.service.http_api import openai_ask, raw_fim

    assert raw_fim("<|repo_name|>r\n<|file_sep|>a.py\n<|fim_prefix|>def f(x):\n    <|fim_suffix|>\n\nf(1)"
                   "<|fim_middle|>ret") == ("def f(x):\n    ret", "\n\nf(1)")
    assert raw_fim("<fim_prefix>a<fim_suffix>c<fim_middle>b") == ("ab", "c")
    assert raw_fim("<|fim_prefix|>a<|fim_middle|>b<|fim_suffix|>c") is None  # not prefix-suffix-middle
    assert raw_fim("def f(): <|fim_prefix|>") is None
    ask, _ = openai_ask({"prompt": "<|fim_prefix|>x = <|fim_suffix|>\ny = 2<|fim_middle|>"})
    assert (ask.text, ask.cursor) == ("x = \ny = 2", 4)
    ask, _ = openai_ask({"prompt": "<|fim_prefix|>x", "suffix": "\n"})  # a suffix given: the prompt is text
    assert (ask.text, ask.cursor) == ("<|fim_prefix|>x\n", 15)


class _Recorder(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802
        self.server.bodies.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0)))))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(b'data: {"choices": [{"text": "42", "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n')

    def log_message(self, *a):
        pass


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    """A tiny Qwen2 with Qwen2.5-Coder's FIM tokens (the Gemma-style tiny model has none)."""
    import tiny

    return tiny.save(tmp_path_factory.mktemp("tiny-qwen"), tiny.qwen2_config(), seed=3, scale=4.0)


async def test_raw_fim_target_sends_fim_tokens_and_gets_the_servers_completion(tmp_path, qwen_dir):
    """`openai:URL#model#raw` (vLLM's way: FIM tokens in the prompt, no suffix) against a completiond
    --http on a FIM model: the body has the FIM prompt and no suffix, and the completion is the one
    the `suffix` form and the server's own editors get."""
    rec = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    rec.bodies, rec.daemon_threads = [], True
    threading.Thread(target=rec.serve_forever, daemon=True).start()
    (tmp_path / "r").mkdir()
    proc = remote_daemon(tmp_path / "r", qwen_dir, f"openai:http://127.0.0.1:{rec.server_port}/v1#{qwen_dir}#raw")
    try:
        res = await complete(tmp_path / "r" / "laptop.sock")
        assert res["text"] == "42"
        body = rec.bodies[-1]
        assert "suffix" not in body and body["model"] == str(qwen_dir)
        p = body["prompt"]
        assert p.index("<|fim_prefix|>") < p.index("<|fim_suffix|>") < p.index("<|fim_middle|>")
        assert "def area(r):\n    return" in p and "print(area(2))" in p
    finally:
        assert stop_daemon(proc) == 0
        rec.shutdown()

    port = free_port()
    srv = start_daemon(tmp_path / "s.sock", qwen_dir, "--http", f"127.0.0.1:{port}", "--token-file",
                       str(tmp_path / "token"))
    try:
        got = {"server": (await complete(tmp_path / "s.sock"))["text"]}
        for form in ("suffix", "raw"):
            d = tmp_path / form
            d.mkdir()
            spec = f"openai:http://127.0.0.1:{port}/v1#{qwen_dir}" + ("#raw" if form == "raw" else "")
            proc = remote_daemon(d, qwen_dir, spec, "--remote-token-file", str(tmp_path / "token"))
            try:
                got[form] = (await complete(d / "laptop.sock"))["text"]
            finally:
                assert stop_daemon(proc) == 0
        assert got["raw"] == got["suffix"] == got["server"] and got["server"], got
    finally:
        assert stop_daemon(srv) == 0
