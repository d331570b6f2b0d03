"""`serve --http`: llama.cpp's /infill as llama.vim and llama.vscode send it (tests/http_fixtures),
OpenAI's /v1/completions through the `openai` client, the token and loopback rules, bad input.

One real daemon on the tiny model; greedy completions through HTTP must equal the wire's `complete`
for the same text and cursor (same engine, lossless), and a request that continues the last one
(the user typed on) must reuse the warm cache like an editor's.
"""

import asyncio
import copy
import http.client
import json
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from completiond.service.client import Client
from completiond.service.http import Ask, client_cut, parse_http, pick_fields, StartError
from daemon_util import daemon_status, start_daemon, stop_daemon

FIXTURES = Path(__file__).parent / "http_fixtures"


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def srv(tmp_path_factory, tiny_dir):
    tmp = tmp_path_factory.mktemp("http")
    port, token_file = free_port(), tmp / "token"
    proc = start_daemon(tmp / "d.sock", tiny_dir, "--http", f"127.0.0.1:{port}", "--token-file", str(token_file))
    yield {"port": port, "token": token_file.read_text().strip(), "sock": tmp / "d.sock", "proc": proc}
    assert stop_daemon(proc) == 0


def call(srv, method: str, path: str, body=None, token: str | None = "", raw: bytes | None = None,
         timeout: float = 120) -> tuple[int, dict | list | str]:
    conn = http.client.HTTPConnection("127.0.0.1", srv["port"], timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token or srv['token']}"
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    conn.request(method, path, body=data, headers=headers)
    r = conn.getresponse()
    text = r.read().decode()
    conn.close()
    try:
        return r.status, json.loads(text)
    except ValueError:
        return r.status, text


def sse(srv, path: str, body: dict) -> list[str]:
    """The `data:` payloads of a streamed answer, in order."""
    conn = http.client.HTTPConnection("127.0.0.1", srv["port"], timeout=120)
    conn.request("POST", path, body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {srv['token']}"})
    r = conn.getresponse()
    assert r.status == 200 and r.getheader("Content-Type") == "text/event-stream"
    events = [line[len("data: "):] for line in r.read().decode().split("\n") if line.startswith("data: ")]
    conn.close()
    return events


async def wire_complete(srv, text: str, cursor: int, max_tokens: int) -> str:
    """The same completion through the daemon's own protocol (a separate session and document)."""
    return (await wire_result(srv, text, cursor, max_tokens))["text"]


async def wire_result(srv, text: str, cursor: int, max_tokens: int, n: int = 1, reuse_prefix: bool = True) -> dict:
    """`complete`'s whole result (with `n`: its alternatives) through the daemon's own protocol."""
    c = await Client.connect(srv["sock"])
    try:
        await c.request("initialize", {"client": "t", "protocol": 1, "workspace_roots": [],
                                       "position_encoding": "utf-32"})
        uri = f"file:///wire{time.monotonic_ns()}.py"
        await c.request("document/open", {"uri": uri, "text": text, "version": 1})
        line = text[:cursor].count("\n")
        char = cursor - (text.rfind("\n", 0, cursor) + 1)
        res = await c.request("complete", {"uri": uri, "position": {"line": line, "character": char},
                                           "max_tokens": max_tokens, "n": n,
                                           "reuse_prefix": reuse_prefix}, timeout=120)
        return res
    finally:
        await c.close()


def doc_of(req: dict) -> tuple[str, int]:
    return req["input_prefix"] + req["prompt"] + req["input_suffix"], len(req["input_prefix"]) + len(req["prompt"])


def alive(srv) -> None:
    assert srv["proc"].poll() is None
    assert call(srv, "GET", "/health", token=None) == (200, {"status": "ok"})


# ---- llama.cpp /infill ---------------------------------------------------------------------------
async def test_llama_vim_request_gets_the_wire_completion_with_its_response_fields(srv):
    req = fixture("llama_vim_fim")
    status, out = await asyncio.to_thread(call, srv, "POST", "/infill", req)
    assert status == 200
    assert set(out) == set(req["response_fields"])  # flat "timings/prompt_n" keys, as llama.cpp answers
    assert out["timings/predicted_n"] > 0 and out["truncated"] is False and out["tokens_cached"] > 0
    text, cursor = doc_of(req)
    wire = await wire_complete(srv, text, cursor, req["n_predict"])
    cut = client_cut(Ask(text, cursor, 128, None, 1.0, 0, None, req["stop"], n_indent=req["n_indent"]), wire)[0]
    # t_max_predict_ms (250) may end it earlier, after a line: a prefix of the same text
    assert out["content"] and wire[:cut].startswith(out["content"])


async def test_llama_vscode_request_gets_n_cmpl_answers_and_the_wire_completion(srv):
    req = fixture("llama_vscode_fim")
    req["t_max_predict_ms"] = 60_000  # no time cut: the whole text compares
    status, out = await asyncio.to_thread(call, srv, "POST", "/infill", req)
    assert status == 200 and isinstance(out, list) and len(out) == req["n_cmpl"]
    assert [o["index"] for o in out] == [0, 1, 2] and all(o["stop"] is True for o in out)
    t = out[0]["timings"]
    assert {"prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms",
            "predicted_per_second"} <= set(t) and t["predicted_n"] == out[0]["tokens_predicted"] > 0
    text, cursor = doc_of(req)
    wire = await wire_complete(srv, text, cursor, req["n_predict"])
    cut = client_cut(Ask(text, cursor, 128, None, 1.0, 0, None, [], n_indent=req["n_indent"]), wire)[0]
    assert out[0]["content"] == wire[:cut] and out[0]["content"]  # greedy: one text, three times


@pytest.mark.skipif(not shutil.which("curl"), reason="no curl")
def test_llama_vims_curl_command_line(srv):
    """The request through curl with llama.vim's own arguments (body on stdin: `--data @-`)."""
    req = fixture("llama_vim_fim")
    cmd = ["curl", "--silent", "--no-buffer", "--request", "POST", "--url", f"http://127.0.0.1:{srv['port']}/infill",
           "--header", "Content-Type: application/json", "--data", "@-",
           "--header", f"Authorization: Bearer {srv['token']}"]
    r = subprocess.run(cmd, input=json.dumps(req), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0
    out = json.loads(r.stdout)  # llama.vim checks '^\s*{' and '"content"\s*:"' before json_decode
    assert re.match(r"^\s*\{", r.stdout) and re.search(r'"content"\s*:"', r.stdout)
    assert out["content"] and "timings/predicted_ms" in out


def test_context_updates_answer_at_once(srv):
    for name in ("llama_vim_ring_update", "llama_vscode_prepare"):
        req = fixture(name)
        t0 = time.monotonic()
        status, out = call(srv, "POST", "/infill", req)
        assert status == 200 and time.monotonic() - t0 < 5
        assert out == {} if name == "llama_vim_ring_update" else out["content"] == ""  # response_fields [""]: {}


def test_typing_on_reuses_the_documents_cache(srv):
    """The second request is the first with one more character typed: it is matched to the same
    synthetic document and served from the warm cache / typed-through memory, not prefilled anew."""
    req = fixture("llama_vim_fim")
    req.update(t_max_predict_ms=60_000, n_predict=12, response_fields=None, input_extra=[])
    req["input_prefix"] = "# typed-on test\n" + req["input_prefix"]
    status, first = call(srv, "POST", "/infill", req)
    assert status == 200 and first["content"]
    typed = copy.deepcopy(req)
    typed["prompt"] += first["content"][0]
    status, second = call(srv, "POST", "/infill", typed)
    assert status == 200
    assert second["completiond"]["document"] == first["completiond"]["document"]  # matched, not opened anew
    assert second["timings"]["cache_n"] > 0.8 * first["tokens_evaluated"] or second["completiond"]["served_tokens"] > 0
    assert second["timings"]["prompt_n"] < first["timings"]["prompt_n"]
    other = copy.deepcopy(req)
    other.update(input_prefix="class Unrelated:\n" * 8, prompt="    x = ", input_suffix="\n")
    status, third = call(srv, "POST", "/infill", other)
    assert status == 200 and third["completiond"]["document"] != first["completiond"]["document"]


def test_streamed_infill_is_llama_cpp_sse_and_equals_the_whole_answer(srv):
    req = fixture("llama_vscode_fim")
    req.update(n_cmpl=1, n_predict=16, t_max_predict_ms=60_000)
    req["input_prefix"] = "# stream test\n" + req["input_prefix"]
    status, whole = call(srv, "POST", "/infill", req)
    assert status == 200
    events = [json.loads(e) for e in sse(srv, "/infill", {**req, "stream": True})]
    assert events[-1]["stop"] is True and "timings" in events[-1] and events[-1]["content"] == ""
    assert all(e["stop"] is False for e in events[:-1]) and len(events) >= 2
    assert "".join(e["content"] for e in events) == whole["content"]


def test_client_stop_strings_end_the_text(srv):
    req = fixture("llama_vscode_fim")
    req.update(n_cmpl=1, n_predict=24, t_max_predict_ms=60_000)
    req["input_prefix"] = "# stop test\n" + req["input_prefix"]
    _, whole = call(srv, "POST", "/infill", req)
    word = whole["content"][3:5]
    assert len(word) == 2
    _, cut = call(srv, "POST", "/infill", {**req, "stop": [word]})
    assert cut["content"] == whole["content"][:whole["content"].index(word)]
    assert cut["stop_type"] == "word" and cut["stopping_word"] == word


# ---- OpenAI /v1/completions -------------------------------------------------------------------------
def openai_client(srv, token=None):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"http://127.0.0.1:{srv['port']}/v1", api_key=token or srv["token"],
                         max_retries=0, timeout=120)


async def test_openai_client_fim_with_suffix_streaming_and_not(srv):
    client = openai_client(srv)
    prompt = "def area(r):\n    return "
    suffix = "\n\n\nprint(area(2))\n"
    res = await asyncio.to_thread(client.completions.create, model="any", prompt=prompt, suffix=suffix,
                                  max_tokens=10, temperature=0)
    assert res.object == "text_completion" and len(res.choices) == 1 and res.choices[0].text
    assert res.choices[0].finish_reason in ("stop", "length")
    assert res.usage.completion_tokens > 0 and res.usage.prompt_tokens > 0
    wire = await wire_complete(srv, prompt + suffix, len(prompt), 10)
    assert res.choices[0].text == wire

    def stream() -> tuple[str, list]:
        chunks = list(client.completions.create(model="any", prompt=prompt, suffix=suffix, max_tokens=10,
                                                stream=True, stream_options={"include_usage": True}))
        return "".join(c.choices[0].text for c in chunks if c.choices), chunks

    text, chunks = await asyncio.to_thread(stream)
    assert text == wire and chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].usage.completion_tokens > 0


def test_openai_n_stop_and_echo(srv):
    client = openai_client(srv)
    prompt = "x = [1, 2, 3]\nfor v in x:\n    "
    res = client.completions.create(model="m", prompt=prompt, max_tokens=8, n=2)
    assert [c.index for c in res.choices] == [0, 1]
    text = client.completions.create(model="m", prompt=prompt, max_tokens=8).choices[0].text
    assert res.choices[0].text == text  # greedy first, the n=1 text
    assert len(text) >= 3
    stopped = client.completions.create(model="m", prompt=prompt, max_tokens=8, stop=[text[2]])
    assert stopped.choices[0].text == text[:text.index(text[2])] and stopped.choices[0].finish_reason == "stop"
    echoed = client.completions.create(model="m", prompt=prompt, max_tokens=8, echo=True)
    assert echoed.choices[0].text == prompt + text
    sampled = client.completions.create(model="m", prompt=prompt, max_tokens=8, temperature=0.9, n=2, seed=3)
    assert len(sampled.choices) == 2


GREEDY_N_PROMPTS = ["x = [1, 2, 3]\nfor v in x:\n    ", "def area(r):\n    return ",
                    "import os\n\n\ndef main():\n    path = ", "class Point:\n    def __init__(self, x, y):\n        "]


def same_branches(got: list[str], want: list[str]) -> bool:
    """The same suggestions in the same order: the greedy one exactly; each alternative the same
    greedy branch, which ends where the pass-cost budget cut it (core/alternatives.py: a few passes
    past the main one, whose count follows the tree sizes the timing picked), so one of the two
    texts starts with the other."""
    return len(got) == len(want) and got[0] == want[0] and all(
        g.startswith(w) or w.startswith(g) for g, w in zip(got[1:], want[1:]))


async def test_greedy_n_answers_the_daemons_distinct_alternatives_greedy_first(srv):
    """Greedy `n` / `n_cmpl` > 1: the daemon's alternatives (same passes) as distinct choices, the
    n=1 text first, n entries (the greedy one repeated past the distinct ones). Before: n copies.
    Each prompt is asked with n first: a repeat is served from the typed-through memory (no pass,
    no alternatives); the wire's `reuse_prefix: false` computes the reference afresh."""
    client = openai_client(srv)
    distinct = 0
    for i, prompt in enumerate(GREEDY_N_PROMPTS):
        prompt = f"# greedy n, {i}\n" + prompt  # a text no other test asked (the memory knows those)
        res = await asyncio.to_thread(client.completions.create, model="m", prompt=prompt, max_tokens=8, n=4)
        texts = [c.text for c in res.choices]
        one = await asyncio.to_thread(client.completions.create, model="m", prompt=prompt, max_tokens=8)
        assert [c.index for c in res.choices] == [0, 1, 2, 3] and texts[0] == one.choices[0].text
        wire = await wire_result(srv, prompt, len(prompt), 8, n=3, reuse_prefix=False)
        alts = [a["text"] for a in wire["alternatives"]]
        assert wire["text"] == texts[0] and same_branches(texts, [texts[0], *alts] + [texts[0]] * (3 - len(alts)))
        k = 1 + len(alts)
        assert len(set(texts[:k])) == k  # the first k are distinct, the rest repeat the greedy one
        assert res.usage.completion_tokens > one.usage.completion_tokens or k == 1
        distinct += k > 1
        # llama.cpp's /infill with n_cmpl: a list of the same kind (another text: no memory hit)
        prefix = "# infill\n" + prompt
        status, out = await asyncio.to_thread(call, srv, "POST", "/infill", {
            "input_prefix": prefix, "input_suffix": "\n", "n_predict": 8, "n_cmpl": 3, "samplers": []})
        wire = await wire_result(srv, prefix + "\n", len(prefix), 8, n=3, reuse_prefix=False)
        want = [wire["text"], *[a["text"] for a in wire["alternatives"]]]
        assert status == 200 and [o["index"] for o in out] == [0, 1, 2]
        assert same_branches([o["content"] for o in out], want + [want[0]] * (3 - len(want)))
        assert len(set(o["content"] for o in out[:len(want)])) == len(want)
    assert distinct >= len(GREEDY_N_PROMPTS) // 2  # the tiny model has runners-up at most prompts


# ---- the rules: token, loopback, bad input; the daemon lives on ---------------------------------
def test_token_missing_or_wrong_is_401(srv):
    openai = pytest.importorskip("openai")
    body = fixture("llama_vim_fim")
    for token in (None, "wrong"):
        status, out = call(srv, "POST", "/infill", body, token=token)
        assert status == 401 and out["error"]["type"] == "authentication_error"
        assert call(srv, "POST", "/v1/completions", {"prompt": "x"}, token=token)[0] == 401
    assert call(srv, "GET", "/v1/models", token="wrong")[0] == 401
    with pytest.raises(openai.AuthenticationError):
        openai_client(srv, token="wrong").completions.create(model="m", prompt="x = ", max_tokens=2)
    alive(srv)


def test_bad_requests_get_400_with_a_reason_and_the_daemon_lives(srv):
    status, out = call(srv, "POST", "/infill", raw=b'{"input_prefix": "x", ')
    assert status == 400 and "not valid JSON" in out["error"]["message"]
    assert call(srv, "POST", "/infill", raw=b"[1, 2]")[1]["error"]["message"] == "request body must be a JSON object"
    assert "UTF-8" in call(srv, "POST", "/infill", raw=b'{"prompt": "\xff"}')[1]["error"]["message"]
    for extra in ({}, {"filename": "ok"}, {"filename": 123}, {"filename": 123, "text": "abc"},
                  {"filename": 123, "text": 456}):  # llama.cpp's own refusals (tools/server test_infill.py)
        status, out = call(srv, "POST", "/infill", {"input_extra": [extra], "input_prefix": "a", "prompt": "b"})
        assert status == 400 and "input_extra[0]" in out["error"]["message"]
    for body, word in (({"input_prefix": 3}, "input_prefix"), ({"n_predict": "5"}, "n_predict"),
                       ({"top_p": 2}, "top_p"), ({"stream": "yes"}, "stream"), ({"stop": [1]}, "stop")):
        status, out = call(srv, "POST", "/infill", body)
        assert status == 400 and word in out["error"]["message"], out
    status, out = call(srv, "POST", "/v1/completions", {"prompt": [[1, 2, 3]]})
    assert status == 400 and "prompt" in out["error"]["message"]
    assert call(srv, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 0})[0] == 400
    assert call(srv, "GET", "/nope")[0] == 404
    assert call(srv, "GET", "/infill")[0] == 405
    alive(srv)


def raw_exchange(srv, data: bytes, half_close: bool = False) -> bytes:
    with socket.create_connection(("127.0.0.1", srv["port"]), timeout=30) as s:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except ConnectionResetError:
            pass
        return out


def test_broken_http_is_refused_and_the_daemon_lives(srv):
    assert raw_exchange(srv, b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400")
    assert raw_exchange(srv, b"GET /health HTTP/2.0\r\n\r\n").startswith(b"HTTP/1.1 505")
    assert raw_exchange(srv, b"GET /health HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n").startswith(b"HTTP/1.1 431")
    auth = b"Authorization: Bearer " + srv["token"].encode() + b"\r\n"  # a body is read only after the token
    assert raw_exchange(srv, b"POST /infill HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n").startswith(b"HTTP/1.1 401")
    assert raw_exchange(srv, b"POST /infill HTTP/1.1\r\n" + auth + b"Content-Length: 99999999999\r\n\r\n") \
        .startswith(b"HTTP/1.1 413")
    assert raw_exchange(srv, b"POST /infill HTTP/1.1\r\n" + auth + b"\r\n").startswith(b"HTTP/1.1 411")
    # a chunked body, and a body cut short by the client's close
    body = json.dumps({"prompt": "x = ", "max_tokens": 2}).encode()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    reply = raw_exchange(srv, b"POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer " + srv["token"].encode()
                         + b"\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + chunked)
    assert reply.startswith(b"HTTP/1.1 200") and b"text_completion" in reply
    assert raw_exchange(srv, b"POST /infill HTTP/1.1\r\n" + auth + b"Content-Length: 100\r\n\r\n{\"a\"",
                        half_close=True).startswith(b"HTTP/1.1 400")
    alive(srv)


def test_a_client_that_hangs_up_has_its_completion_cancelled(srv):
    before = daemon_status(srv["sock"])["stale"]["cancelled"]
    req = fixture("llama_vscode_fim")
    req.update(n_cmpl=1, n_predict=2048, t_max_predict_ms=600_000, stream=True, samplers=[])
    req["input_prefix"] = "# hang-up test\n" * 3 + req["input_prefix"]
    conn = http.client.HTTPConnection("127.0.0.1", srv["port"], timeout=60)
    conn.request("POST", "/infill", body=json.dumps(req).encode(),
                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {srv['token']}"})
    r = conn.getresponse()
    assert r.status == 200
    r.fp.readline()  # the first chunk is on its way: the completion runs
    conn.sock.close()
    conn.close()
    deadline = time.time() + 30
    while daemon_status(srv["sock"])["stale"]["cancelled"] == before and time.time() < deadline:
        time.sleep(0.1)
    assert daemon_status(srv["sock"])["stale"]["cancelled"] > before
    alive(srv)


def test_http_needs_loopback_and_a_token_file(tmp_path, tiny_dir):
    for args, words in ((["--http", f"0.0.0.0:{free_port()}", "--token-file", str(tmp_path / "t")], "loopback"),
                        (["--http", "192.168.1.5:8012", "--token-file", str(tmp_path / "t")], "loopback"),
                        (["--http", f"127.0.0.1:{free_port()}"], "--token-file"),
                        (["--http", "localhost", "--token-file", str(tmp_path / "t")], "HOST:PORT")):
        r = subprocess.run([sys.executable, "-m", "completiond", "serve", "--socket", str(tmp_path / "d.sock"),
                            "--target", str(tiny_dir), *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr
    with pytest.raises(StartError):
        parse_http("[::]:80")
    assert parse_http("[::1]:8012") == ("::1", 8012) and parse_http("127.0.0.2:1") == ("127.0.0.2", 1)


# ---- llama.cpp's request-side rules, alone ------------------------------------------------------------
def test_client_cut_follows_llama_cpp():
    ask = Ask("", 0, 8, None, 1.0, 0, None, ["END", "\n\n"], n_indent=4)
    assert client_cut(ask, "a = 1END b") == (5, "word", "END")
    assert client_cut(ask, "a\n\nb") == (1, "word", "\n\n")
    # a line less indented than n_indent ends the text after its indentation (llama.cpp erases from there)
    assert client_cut(ask, "x = 1\n    y = 2\n  z") == (18, "limit", "")
    assert client_cut(ask, "x = 1\n    y = 2\n") == (None, "", "")
    assert pick_fields({"content": "a", "timings": {"prompt_n": 3}}, ["content", "timings/prompt_n", "x/y", ""]) == \
        {"content": "a", "timings/prompt_n": 3}
