"""Warm-up by where the user is: a document opened or changed elsewhere (another file in the background,
llama.vim's ring of context chunks through HTTP) never stops the warm-up of the document being
edited, and the HTTP bridge's context buffer is never warmed at all. In-process daemon on a tiny FIM
model; the engine thread is held busy so that the edited document's warm-up is still queued when the
other document's arrives (on a real model it takes seconds)."""

import asyncio
import threading

import tiny
from completiond.core.engine import Engine
from daemon_util import in_process, insert, wait_warm

SRC = (tiny.STDLIB / "textwrap.py").read_text()
A, B = "file:///w/a.py", "file:///w/b.py"


def hold_engine(daemon) -> threading.Event:
    """Queue a job that keeps the engine thread until the returned event is set."""
    release = threading.Event()
    daemon.scheduler.submit(lambda ctx: release.wait(30), ("hold", "engine"))
    return release


async def test_another_documents_warm_up_never_stops_the_edited_ones(tmp_path):
    engine = Engine(tiny.loaded(tiny.qwen2_config(), seed=5, scale=4.0))
    async with in_process(tmp_path, engine, warm=True) as (c, daemon):
        await c.request("document/open", {"uri": A, "text": SRC, "version": 1})
        await wait_warm(c, A)
        release = hold_engine(daemon)
        await insert(c, A, 2, 10, 0, "x")  # the user types in A: A is where the user is
        await asyncio.sleep(0.5)  # A's warm-up is queued (behind the held engine)
        w = daemon.warmer
        assert w.cancel_key is not None and w.cancel_key[1] == A
        a_cancel = w.cancel
        # another document opens (an editor restoring its buffers; an HTTP client's context): its warm-up
        # waits for A's instead of stopping it
        await c.request("document/open", {"uri": B, "text": SRC[:5000], "version": 1})
        await asyncio.sleep(0.8)
        assert not a_cancel.is_set() and w.cancel is a_cancel
        release.set()
        await wait_warm(c, A)
        await wait_warm(c, B)  # and B is warmed after A


async def test_the_http_context_buffer_is_never_warmed(tmp_path):
    """llama.vim's ring updates (n_predict 0, input_extra only) go to one context buffer: prompt
    lookup reads it; no warm-up is ever started for it, so none stops the edited document's."""
    from completiond.service.http import start_http

    engine = Engine(tiny.loaded(tiny.qwen2_config(), seed=5, scale=4.0))
    async with in_process(tmp_path, engine, warm=True) as (c, daemon):
        server = await start_http(daemon, "127.0.0.1", 0, "tok")
        port = daemon.servers[-1].sockets[0].getsockname()[1]
        started = []
        real_start = daemon.warmer._start
        daemon.warmer._start = lambda s, uri: (started.append(uri), real_start(s, uri))[1]
        body = {"input_prefix": SRC[:4000], "prompt": "", "input_suffix": SRC[4000:6000], "n_predict": 8}
        status, out = await asyncio.to_thread(post, port, body)
        assert status == 200
        doc = out["completiond"]["document"]
        for i in range(3):  # ring updates, a second apart as llama.vim sends them (here 0.4 s)
            ring = {"input_prefix": "", "input_suffix": "", "prompt": "", "n_predict": 0,
                    "input_extra": [{"filename": "other.py", "text": f"def helper_{k}():\n    return {k}\n", "time": k}
                                    for k in range(i + 1)], "response_fields": [""]}
            status, out = await asyncio.to_thread(post, port, ring)
            assert status == 200
            await asyncio.sleep(0.4)
        extra = server.bridge.docs  # the context buffer is not among the documents requests go to
        assert doc in extra.texts and not any("extra" in u for u in extra.texts)
        assert all("extra" not in u for u in started), started
        assert daemon.warmer.focus == (server.bridge.session.id, doc)


def post(port: int, body: dict) -> tuple[int, dict]:
    import http.client
    import json

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/infill", body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json", "Authorization": "Bearer tok"})
    r = conn.getresponse()
    data = json.loads(r.read().decode())
    conn.close()
    return r.status, data


async def test_a_warm_up_cancelled_by_a_request_stops_before_its_follow_up(tmp_path):
    """Warming ends quietly when its document's request cancels it; the warm-up must then end too.
    It went on into the follow-up completion, whose first prefill chunk runs whole once begun: the
    request waited for it (1.3 to 6 s after idle on the 0.5B, served from memory in 0 passes). And
    the warm-up is queued again, to go on once the request is done. quick_prompt_ms=0: a slow
    device, where the warm-up prefills the quick and the full prompt before its follow-up."""
    engine = Engine(tiny.loaded(tiny.qwen2_config(), seed=5, scale=4.0))
    async with in_process(tmp_path, engine, warm=True, quick_prompt_ms=0.0) as (c, daemon):
        await c.request("document/open", {"uri": A, "text": SRC, "version": 1})
        await c.request("complete", {"uri": A, "position": {"line": 200, "character": 0}, "max_tokens": 4})
        await wait_warm(c, A)
        runs, real_run, real_warming = [], engine.run, engine.warming

        def run(req, on_step=None, ctx=None):
            runs.append(req.cancel.is_set())
            return real_run(req, on_step, ctx)

        def warming(prompt, ctx, *draft_ctx):  # a request for A arrives while the warm-up prefills
            daemon.warmer.cancel.set()
            return real_warming(prompt, ctx, *draft_ctx)

        engine.run, engine.warming = run, warming
        await insert(c, A, 2, 10, 0, "x")  # away from the cursor: the full prompt is cold again
        for _ in range(100):
            await asyncio.sleep(0.05)
            if daemon.warmer.cancel is None and daemon.engine.stats["warms"] >= 1 and not daemon.warmer.timers:
                break
        assert True not in runs, runs  # no follow-up was started by a cancelled warm-up
        engine.run, engine.warming = real_run, real_warming
        # a request that cancels its document's queued warm-up queues it again: the document gets warm
        # without another edit
        release = hold_engine(daemon)
        await insert(c, A, 3, 10, 0, "y")
        await asyncio.sleep(0.5)  # the warm-up is queued behind the held engine
        assert daemon.warmer.cancel_key[1] == A
        ask = asyncio.create_task(c.request("complete", {"uri": A, "position": {"line": 201, "character": 0},
                                                         "max_tokens": 4}))
        await asyncio.sleep(0.2)
        release.set()
        assert (await ask) is not None
        await wait_warm(c, A, timeout=20)
