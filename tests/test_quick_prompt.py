"""The quick prompt (issue 15, cold documents): while a document's full prompt is cold, a completion
answers from a short prompt around the cursor in a cached sequence of its own; the warm-up fills the
quick prompt first, then the full one, and completions move to the full prompt once it is warm.
Through a real daemon with a tiny FIM model; `quick_prompt_ms=0` stands for a slow device (a tiny
model prefills thousands of tokens in the 300 ms the default allows)."""

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest

import tiny
from completiond.core.engine import Engine
from completiond.core.forward.context import NO_CONTEXT
from completiond.core.prompt import build_prompt
from completiond.service.handlers import QUICK_PROMPT_TOKENS, Lane, pick_lane
from completiond.service import plan
from completiond.service.plan import QUICK_PROMPT_MAX_TOKENS, quick_prompt_tokens
from daemon_util import cursor_after, in_process, insert, wait_warm

SRC = (tiny.STDLIB / "textwrap.py").read_text()
SLOW_MS_PER_TOKEN = 4.0
URI = "file:///w/textwrap.py"


@pytest.fixture
async def served(tmp_path, request):
    """(client, daemon); request.param: (warm, quick_prompt_ms)."""
    warm, quick_ms = getattr(request, "param", (False, 0.0))
    engine = Engine(tiny.loaded(tiny.qwen2_config(), seed=5, scale=4.0))
    if quick_ms == 0.0:  # a slow device's prefill (a 1.5B on 2 cores): the quick prompt keeps its least size
        engine.prefill_ms_per_token = lambda: SLOW_MS_PER_TOKEN
    async with in_process(tmp_path, engine, warm=warm, quick_prompt_ms=quick_ms) as (c, daemon):
        yield c, daemon


def middle_cursor() -> tuple[int, int]:
    """(line, character) at the end of a code line in the middle of SRC: a long prefix and suffix."""
    lines = SRC.split("\n")
    i = next(i for i in range(len(lines) // 2, len(lines)) if lines[i].strip())
    return i, len(lines[i])


async def complete(c, line: int, char: int, **kw) -> dict:
    return await c.request("complete", {"uri": URI, "position": {"line": line, "character": char},
                                        "max_tokens": 8, "mode": "ar", "multiline": False, **kw})


async def test_cold_document_answers_from_the_quick_prompt_in_its_own_sequence(served):
    c, daemon = served
    line, char = middle_cursor()
    await c.request("document/open", {"uri": URI, "text": SRC, "version": 1, "language_id": "python"})
    first = await complete(c, line, char)
    assert first["prompt_lane"] == "quick"
    assert first["prompt_tokens"] <= QUICK_PROMPT_TOKENS + 8 and first["reused_tokens"] == 0
    keys = daemon.engine.slots.keys()
    sid = next(k[0] for k in keys if isinstance(k, tuple))
    assert (sid, URI, "quick") in keys  # the quick prompt's own sequence
    assert not daemon.engine.slots.tokens((sid, URI))  # the full one was not touched
    # the same cursor again: still cold, the quick prompt is served from its cache
    again = await complete(c, line, char)
    assert again["prompt_lane"] == "quick" and again["reused_tokens"] == again["prompt_tokens"] - 1
    assert again["text"] == first["text"]
    # typing at the cursor extends the quick prompt: only the typed tokens are new
    await insert(c, URI, 2, line, char, " zq")
    typed = await complete(c, line, char + 3)
    assert typed["prompt_lane"] == "quick" and typed["reused_tokens"] >= first["prompt_tokens"] - 1


@pytest.mark.parametrize("served", [(True, 0.0)], indirect=True)
async def test_warm_up_fills_the_quick_prompt_then_the_full_one_which_completions_move_to(served):
    c, daemon = served
    line, char = middle_cursor()
    await c.notify("document/open", {"uri": URI, "text": SRC, "version": 1, "language_id": "python"})
    await c.notify("document/cursor", {"uri": URI, "position": {"line": line, "character": char}})
    st = await wait_warm(c, URI)
    assert st["prompt_tokens"] > 2 * QUICK_PROMPT_TOKENS
    res = await complete(c, line, char)
    assert res["prompt_lane"] == "full" and res["reused_tokens"] == res["prompt_tokens"] - 1
    # the quick prompt was warmed on the way (in its own sequence): it holds a short prompt
    quick = [k for k in daemon.engine.slots.keys() if isinstance(k, tuple) and k[-1] == "quick"]
    assert quick and 0 < len(daemon.engine.slots.tokens(quick[0])) <= QUICK_PROMPT_TOKENS + 8
    # typing on at the cursor keeps the full prompt, extended by the typed tokens
    await insert(c, URI, 2, line, char, " zq")
    typed = await complete(c, line, char + 3)
    assert typed["prompt_lane"] == "full" and typed["reused_tokens"] >= res["prompt_tokens"] - 1


@pytest.mark.parametrize("served", [(False, 300.0)], indirect=True)
async def test_a_fast_device_always_uses_the_full_prompt(served):
    c, _ = served  # the default threshold: a tiny model prefills the whole prompt well within it
    line, char = middle_cursor()
    await c.request("document/open", {"uri": URI, "text": SRC, "version": 1, "language_id": "python"})
    res = await complete(c, line, char)
    assert res["prompt_lane"] == "full" and res["prompt_tokens"] > 2 * QUICK_PROMPT_TOKENS


def test_the_quick_prompt_is_as_long_as_this_device_prefills_in_its_budget():
    second = 1000.0
    assert quick_prompt_tokens(SLOW_MS_PER_TOKEN, second) == QUICK_PROMPT_TOKENS == 256  # the 1.5B on 2 cores
    assert quick_prompt_tokens(1.4, second) == 512  # the 0.5B on 2 quiet cores
    assert quick_prompt_tokens(0.5, second) == quick_prompt_tokens(0.01, second) == QUICK_PROMPT_MAX_TOKENS == 1024
    assert quick_prompt_tokens(64.0, second) == 256  # a loaded machine: never under the least size
    assert quick_prompt_tokens(0.01, 0.0) == 256  # no budget: the least size


async def test_a_faster_device_gets_a_longer_quick_prompt(tmp_path, monkeypatch):
    monkeypatch.setattr(plan, "QUICK_PREFILL_MS", 1000.0)
    engine = Engine(tiny.loaded(tiny.qwen2_config(), seed=5, scale=4.0))
    engine.prefill_ms_per_token = lambda: 0.9  # 1,024 tokens in about a second
    async with in_process(tmp_path, engine, warm=False, quick_prompt_ms=0.0) as (c, daemon):
        line, char = middle_cursor()
        await c.request("document/open", {"uri": URI, "text": SRC, "version": 1, "language_id": "python"})
        res = await complete(c, line, char)
        assert res["prompt_lane"] == "quick"
        assert 2 * QUICK_PROMPT_TOKENS < res["prompt_tokens"] <= QUICK_PROMPT_MAX_TOKENS + 8


def test_pick_lane_weighs_what_each_cache_lacks():
    full, quick = Lane(list(range(1000)), None, "f"), Lane(list(range(200)), None, "q")
    cached = {"f": 0, "q": 0}
    engine = SimpleNamespace(cached_prefix_len=lambda ids, slot: cached[slot], prefill_ms_per_token=lambda: 3.0)
    allowance_ms = 300.0
    assert pick_lane(engine, allowance_ms, full, quick) is quick  # 1000 tokens lacking: 3 s
    assert pick_lane(engine, allowance_ms, full, None) is full
    cached["f"] = 900  # 100 lacking: 300 ms, within the allowance
    assert pick_lane(engine, allowance_ms, full, quick) is full
    cached["f"] = 850  # 150 lacking (450 ms), but the quick prompt lacks all of its 200
    assert pick_lane(engine, allowance_ms, full, quick) is full
    cached["q"] = 100
    assert pick_lane(engine, allowance_ms, full, quick) is quick
    allowance_ms = -1  # switched off
    assert pick_lane(engine, allowance_ms, full, quick) is full


async def test_a_short_document_has_no_quick_prompt(served):
    c, daemon = served  # quick_prompt_ms=0: any cold prompt long enough would go quick
    text = "import os\n\n\ndef walk(root):\n    for name in os.listdir(root):\n        "
    await c.request("document/open", {"uri": URI, "text": text, "version": 1, "language_id": "python"})
    res = await complete(c, 5, 8)
    assert res["prompt_lane"] == "full" and res["prompt_tokens"] <= QUICK_PROMPT_TOKENS + 64
    assert not [k for k in daemon.engine.slots.keys() if isinstance(k, tuple) and k[-1] == "quick"]


@pytest.mark.parametrize("repo_context", [False, True])
async def test_other_open_buffers_enter_the_prompt_only_with_repo_context(tmp_path, repo_context):
    engine = Engine(tiny.loaded(tiny.qwen2_config(), seed=5, scale=4.0))
    small = "def area(r):\n    return 3.14 * r * r\n\n\nprint(area(2))\n"
    other = "def helper(x):\n    return x + 1\n" * 20
    async with in_process(tmp_path, engine, warm=False, quick_prompt_ms=-1, repo_context=repo_context) as (c, _):
        await c.request("document/open", {"uri": "file:///w/other.py", "text": other, "version": 1,
                                          "language_id": "python"})
        await c.request("document/open", {"uri": URI, "text": small, "version": 1, "language_id": "python"})
        got = await complete(c, 1, 4)
    alone = build_prompt(engine.target.tokenizer, small, small.index("return"), multiline=False)
    # off (the default): the plain FIM prompt of this file; on: the other buffer comes first
    assert (got["prompt_tokens"] > len(alone.ids) + 100) == repo_context
    if not repo_context:
        assert got["prompt_tokens"] == len(alone.ids)


def stalled_draft_warm(engine: Engine, timeout_s: float = 10.0) -> tuple[threading.Event, list[bool]]:
    """The draft's first warm-up prefill stands for a real one (seconds on a 0.5B): it stalls until its
    PassContext's cancel is set (as a real prefill checks between layers) or `timeout_s`. Returns
    (entered, [stopped by its cancel])."""
    entered, stopped, real = threading.Event(), [], engine.draft.warm

    def warm(context, ctx=NO_CONTEXT):
        if entered.is_set():
            return real(context, ctx)
        entered.set()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not (ctx.cancel is not None and ctx.cancel.is_set()):
            time.sleep(0.01)
        stopped.append(ctx.cancel is not None and ctx.cancel.is_set())
        ctx.check()

    engine.draft.warm = warm
    return entered, stopped


def with_draft() -> Engine:
    engine = Engine(tiny.loaded(tiny.qwen2_config(), seed=5, scale=4.0),
                    tiny.loaded(tiny.qwen2_config(layers=1), seed=6, scale=4.0))
    engine.prefill_ms_per_token = lambda: SLOW_MS_PER_TOKEN  # a slow device: the quick prompt comes first
    return engine


async def open_until_draft_warm(c, entered: threading.Event) -> tuple[int, int]:
    """Open SRC with the cursor resting mid-file until the warm-up's draft prefill has begun (the quick
    prompt's target chunks are done); the cursor's (line, character)."""
    line, char = middle_cursor()
    await c.request("document/open", {"uri": URI, "text": SRC, "version": 1, "language_id": "python"})
    await c.notify("document/cursor", {"uri": URI, "position": {"line": line, "character": char}})
    assert await asyncio.to_thread(entered.wait, 30)
    return line, char


async def test_a_request_stops_the_quick_prompts_draft_prefill_not_waiting_for_it(tmp_path):
    """The warm-up's quick prompt: its target chunk ends before the request (which needs it); the draft's
    prefill of it stops within a layer (the request's first token does not need it). On the 1.5B with
    the 0.5B draft, waiting for that prefill cost a line start after a 2 s pause ~0.6 s."""
    engine = with_draft()
    entered, stopped = stalled_draft_warm(engine)
    async with in_process(tmp_path, engine, warm=True, quick_prompt_ms=0.0) as (c, daemon):
        line, char = await open_until_draft_warm(c, entered)
        t0 = time.monotonic()
        res = await complete(c, line, char)
        assert time.monotonic() - t0 < 5.0 and stopped == [True]
        assert res["prompt_lane"] == "quick" and res["reused_tokens"] == res["prompt_tokens"] - 1


async def test_closing_a_document_stops_its_warm_up(tmp_path):
    engine = with_draft()
    entered, stopped = stalled_draft_warm(engine)
    async with in_process(tmp_path, engine, warm=True, quick_prompt_ms=0.0) as (c, daemon):
        await open_until_draft_warm(c, entered)
        await c.request("document/close", {"uri": URI})
        for _ in range(200):
            if stopped:
                break
            await asyncio.sleep(0.02)
        assert stopped == [True]
        w, key = daemon.warmer, (next(iter(daemon.sessions)), URI)
        assert key not in w.positions and key not in w.timers and w.focus != key


async def test_a_resting_cursor_in_a_cold_document_gets_its_first_tokens_from_the_quick_prompt(tmp_path):
    """The warm-up computes the completion's first tokens on the quick prompt right after its target
    chunks (before the draft's prefill of it and the full prompt: seconds on the 1.5B), so the first
    key typed through them (Enter at the line's end soon after opening) is served with no pass: the
    same text as a daemon that never warmed computes with passes."""
    engine = with_draft()
    entered, stopped = stalled_draft_warm(engine)  # by then the first tokens were computed
    reference = with_draft()
    for d in ("warm", "cold"):
        (tmp_path / d).mkdir()
    async with in_process(tmp_path / "warm", engine, warm=True, quick_prompt_ms=0.0) as (c, _), \
            in_process(tmp_path / "cold", reference, warm=False, quick_prompt_ms=0.0) as (cold, ref_daemon):
        await cold.request("document/open", {"uri": URI, "text": SRC, "version": 1, "language_id": "python"})
        line, char = await open_until_draft_warm(c, entered)
        at = {"uri": URI, "position": {"line": line, "character": char}}
        ref = await cold.request("complete", at)  # the warm-up's ask: greedy, multi-line, as editors ask
        assert ref["prompt_lane"] == "quick" and len(ref["text"]) > 2
        typed = ref["text"][:2]
        await insert(c, URI, 2, line, char, typed)
        await insert(cold, URI, 2, line, char, typed)
        cursor = cursor_after(line, char, typed)
        got = await c.request("complete", {"uri": URI, "position": cursor})
        ref_daemon.engine.typed.clear()  # it answered at the resting cursor: computed with passes now
        want = await cold.request("complete", {"uri": URI, "position": cursor})
        assert got["prompt_lane"] == want["prompt_lane"] == "quick"
        assert got["text"] == want["text"] and got["tokens"] == want["tokens"]
        assert got["served_tokens"] > 0 and want["served_tokens"] == 0
        assert stopped == [True]  # and the draft's prefill did not hold the request up
