"""The editors' own HTTP clients, replayed against a real `serve --http` on a tiny FIM model.

llama.vim (ggml-org/llama.vim autoload/llama.vim, a1c8e6e): `llama#fim` sends the 256 lines before
the cursor (`input_prefix`), the line up to the cursor (`prompt`) and the rest of it plus 64 lines
(`input_suffix`), `t_max_predict_ms` 250 for a position's first request and 1000 for the speculative
follow-up (the window as if the suggestion were accepted); it re-sends a request after 100 ms while
one is in flight; `s:ring_update` sends a context update every second while chunks are queued:
`n_predict` 0, empty prefix/suffix, `input_extra` chunks `{text, time, filename}`. An OpenAI FIM
client (the `openai` package) sends the whole prefix and suffix to /v1/completions.

The tiny model's output row of <|fim_middle|> is made to win where its most frequent token would,
so it writes the special token (the real 1.5B did: `return self._value<|fim_middle|>`).
Checks: no special token in any answer, no empty-prefix prompt (the quick prompt at line 256 of
llama.vim's window, and at lines 64k of an LSP document), window shifts stay in one document and
reuse its cache, ring updates are taken (extra_chunks) and never open or warm a document, and
concurrent clients never cancel each other.
"""

import collections
import concurrent.futures
import http.client
import json
import socket

import pytest
import torch

import tiny
from completiond.bench import infill
from completiond.bench.infill import fim_ctx_local, fim_request, ring_request
from completiond.core.prompt import build_prompt, special_ids
from completiond.service.client import Client
from completiond.service.handlers import QUICK_PROMPT_TOKENS
from completiond.service.plan import QUICK_PROMPT_MAX_TOKENS
from daemon_util import daemon_status, start_daemon, stop_daemon

FILE = (tiny.STDLIB / "difflib.py").read_text()
OTHER = (tiny.STDLIB / "argparse.py").read_text()
LINES = FILE.splitlines()


# llama.vim's requests: the bench's builders (completiond bench --via infill asks with the same)
def chunk(lines: list[str], start: int, filename: str = "difflib.py", t: float = 1.0) -> dict:
    return infill.chunk(lines, start, filename, t)


# ---- the daemons --------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def leaky_dir(tmp_path_factory):
    """A tiny Qwen2 FIM model that writes <|fim_middle|> where it would write its most frequent token."""
    target = tiny.loaded(tiny.qwen2_config(), seed=5, scale=4.0)
    tok, model = target.tokenizer, target.model
    mid = tok.convert_tokens_to_ids("<|fim_middle|>")
    counts = collections.Counter()
    with torch.no_grad():
        for line in (300, 340, 600):
            ctx = fim_ctx_local(LINES, line)
            text = ctx["prefix"] + ctx["middle"] + ctx["suffix"]
            ids = build_prompt(tok, text, len(ctx["prefix"]) + len(ctx["middle"]), multiline=True).ids
            for _ in range(12):
                nxt = int(model(torch.tensor([ids])).logits[0, -1].argmax())
                counts[nxt] += 1
                ids.append(nxt)
    top = next(t for t, _ in counts.most_common() if t not in special_ids(tok))
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head[mid] = 2 * head[top]
    path = tmp_path_factory.mktemp("leaky")
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


def serve(tmp_path_factory, model_dir, *extra: str) -> dict:
    tmp = tmp_path_factory.mktemp("replay")
    port, token_file = free_port(), tmp / "token"
    proc = start_daemon(tmp / "d.sock", model_dir, "--http", f"127.0.0.1:{port}", "--token-file", str(token_file),
                        *extra)
    return {"port": port, "token": token_file.read_text().strip(), "sock": tmp / "d.sock", "proc": proc}


@pytest.fixture(scope="module")
def srv(tmp_path_factory, leaky_dir):
    # the lane a cold answer takes depends on the measured prefill rate (quick before the first
    # measurement, full after): the retry below must see the same lane, so always the full one
    s = serve(tmp_path_factory, leaky_dir, "--quick-prompt-ms", "60000")
    yield s
    assert stop_daemon(s["proc"]) == 0


@pytest.fixture(scope="module")
def slow(tmp_path_factory, leaky_dir):
    """A daemon that behaves as on a slow CPU: a cold document answers from the quick prompt."""
    s = serve(tmp_path_factory, leaky_dir, "--quick-prompt-ms", "0", "--no-warm")
    yield s
    assert stop_daemon(s["proc"]) == 0


def post(srv, path: str, body: dict, headers: dict | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", srv["port"], timeout=120)
    conn.request("POST", path, body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {srv['token']}",
                          **(headers or {})})
    r = conn.getresponse()
    out = json.loads(r.read().decode())
    conn.close()
    return r.status, out


def no_special(text: str) -> None:
    assert "<|" not in text and "|>" not in text, text


# ---- the replays --------------------------------------------------------------------------------------------
def test_llama_vim_editing_session(srv):
    """BufEnter picks a chunk, the ring sends it; FIM at line 300, its retry, the speculative follow-up,
    typing, ring updates, window shifts of 40 and 300 lines, another file: one document per file, the
    cache reused across shifts, no special token."""
    answers = []

    def fim(lines, line, col=None, prev=None, extra=(), first=True) -> dict:
        status, out = post(srv, "/infill", fim_request(fim_ctx_local(lines, line, col, prev), list(extra), first))
        assert status == 200, out
        no_special(out["content"])
        answers.append(out)
        return out

    extra = [chunk(LINES, 900)]
    assert post(srv, "/infill", ring_request(extra))[0] == 200
    a = fim(LINES, 300, extra=extra)
    doc = a["completiond/document"]
    assert a["completiond/extra_chunks"] == 1
    again = fim(LINES, 300, extra=extra)  # llama.vim re-sends after its 100 ms timer
    assert again["content"] == a["content"] and again["completiond/document"] == doc
    assert a["completiond/prompt_lane"] == again["completiond/prompt_lane"] == "full"
    assert again["completiond/reused_tokens"] >= again["completiond/prompt_tokens"] - 1
    if a["content"]:  # the speculative follow-up: the window as if the suggestion were accepted
        follow = fim(LINES, 300, prev=a["content"].split("\n"), extra=extra, first=False)
        assert follow["completiond/document"] == doc
    extra = extra + [chunk(LINES, 1200, t=2.0), chunk(OTHER.splitlines(), 100, "argparse.py", 3.0)]
    assert post(srv, "/infill", ring_request(extra))[0] == 200
    typed = LINES[:300] + [LINES[300] + " x"] + LINES[301:]
    t = fim(typed, 300, extra=extra)
    assert t["completiond/document"] == doc and t["completiond/extra_chunks"] == 3
    # the cursor jumps 40 lines down: llama.vim's window moved 40 lines, the document (its cached
    # sequence, anchor and warm state) stays; what of the prompt is reused depends on where the cut
    # falls, at least its head (a new document reused nothing)
    jump = fim(typed, 340, extra=extra)
    assert jump["completiond/document"] == doc and jump["completiond/reused_tokens"] > 0
    far = fim(typed, 600, extra=extra)  # 300 lines further: the windows still overlap
    assert far["completiond/document"] == doc
    other = fim(OTHER.splitlines(), 400, extra=extra)
    assert other["completiond/document"] != doc
    back = fim(typed, 320, extra=extra)
    assert back["completiond/document"] == doc
    # the leaky model wrote <|fim_middle|> in some answers: they ended there
    assert any(x["completiond/stopped_by"] == "eos" for x in answers), [x["completiond/stopped_by"] for x in answers]


def test_no_empty_prefix_prompt_through_http_or_the_socket(slow, leaky_dir):
    """On a slow device a cold document answers from the quick prompt (256 tokens). llama.vim's window
    puts a cursor beyond line 256 of the file on line 256 of the request's text, and an LSP cursor on
    line 128 is on a multiple of 64: both prompts keep the lines above the cursor."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(leaky_dir))
    for line in (300, 700, 1500):  # each a fresh document (the windows do not overlap)
        ctx = fim_ctx_local(LINES, line)
        status, out = post(slow, "/infill", fim_request(ctx, []))
        assert status == 200 and out["completiond/prompt_lane"] == "quick"
        text = ctx["prefix"] + ctx["middle"] + ctx["suffix"]
        cursor = len(ctx["prefix"]) + len(ctx["middle"])
        assert text[:cursor].count("\n") == 256
        # the quick prompt's size follows the prefill speed measured (plan.quick_prompt_tokens): the
        # daemon's is one of these; each keeps the lines above the cursor (was: none, the cut rounded
        # up to line 256)
        sizes = {}
        for budget in (QUICK_PROMPT_TOKENS, 2 * QUICK_PROMPT_TOKENS, QUICK_PROMPT_MAX_TOKENS):
            q = build_prompt(tok, text, cursor, multiline=True, max_tokens=budget)
            assert q.prefix.count("\n") >= 4 and len(tok.encode(q.prefix)) >= budget // 4
            sizes[len(q.ids)] = budget
        assert out["tokens_evaluated"] in sizes and out["tokens_evaluated"] >= sizes[out["tokens_evaluated"]] // 2
    import asyncio

    async def wire() -> dict:
        c = await Client.connect(slow["sock"])
        try:
            await c.request("initialize", {"client": "t", "protocol": 1, "workspace_roots": []})
            await c.request("document/open", {"uri": "file:///w/difflib.py", "text": FILE, "version": 1})
            return await c.request("complete", {"uri": "file:///w/difflib.py", "position": {"line": 128, "character": 0},
                                                "max_tokens": 4})
        finally:
            await c.close()

    res = asyncio.run(wire())
    assert res["prompt_lane"] == "quick" and res["prompt_tokens"] >= QUICK_PROMPT_TOKENS // 2
    no_special(res["text"])


def test_concurrent_clients_never_cancel_each_other(srv):
    """Twelve clients at once, on one document: each gets its whole answer (none is superseded)."""
    ctx = fim_ctx_local(LINES, 1000)
    body = {**fim_request(ctx, []), "t_max_predict_ms": 0, "n_predict": 16}

    def one(i: int) -> dict:
        status, out = post(srv, "/infill", body)
        assert status == 200, out
        return out

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        outs = list(pool.map(one, range(12)))
    assert not [o for o in outs if o["completiond/cancelled"]]
    assert len({o["content"] for o in outs}) == 1  # greedy: one answer, whole every time
    assert len({o["completiond/document"] for o in outs}) == 1


def test_openai_fim_client_named_file(srv):
    """The `openai` client, as an editor plugin uses it for FIM (whole prefix and suffix, temperature 0),
    naming the file in a header: every cursor position is one document; no special token."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv['port']}/v1", api_key=srv["token"], max_retries=0)
    counts = []
    for line in (200, 260, 900, 1400):
        at = sum(len(x) + 1 for x in LINES[:line]) + len(LINES[line])
        res = client.completions.create(model="completiond", prompt=FILE[:at], suffix=FILE[at:], max_tokens=16,
                                        temperature=0, n=2,
                                        extra_headers={"X-Completiond-File": "src/difflib.py"})
        for c in res.choices:
            no_special(c.text)
            assert c.finish_reason in ("stop", "length")
        counts.append(daemon_status(srv["sock"])["documents"])
    assert len(set(counts)) == 1, counts  # no position opened a document of its own
