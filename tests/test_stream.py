"""Engine.stream: an async generator of per-pass text, then the result; closing it cancels the work."""

import asyncio

import tiny
from completiond.engine import Engine, Request, Result, Step
from completiond.stops import StopRules


def engine():
    return Engine(tiny.loaded(tiny.gemma_config(window=16), seed=1, scale=4.0))


async def test_stream_yields_steps_then_result(code_ids):
    e = engine()
    items = [item async for item in e.stream(Request(prompt=code_ids[:60], mode="pld", max_tokens=30,
                                                     stops=StopRules(multiline=True, cursor_indent=100)))]
    steps, result = items[:-1], items[-1]
    assert isinstance(result, Result) and all(isinstance(s, Step) for s in steps)
    assert len(steps) >= 2
    assert "".join(s.text for s in steps) == result.text
    assert sum(len(s.token_ids) for s in steps) == len(result.token_ids)
    # the same request without streaming gives the same tokens
    again = e.complete(Request(prompt=code_ids[:60], mode="ar", max_tokens=30,
                               stops=StopRules(multiline=True, cursor_indent=100)))
    assert again.token_ids == result.token_ids


async def test_closing_the_stream_cancels_within_a_pass(code_ids):
    e = engine()
    req = Request(prompt=code_ids[:60], mode="ar", max_tokens=2000, stops=StopRules(multiline=True, cursor_indent=100))
    gen = e.stream(req)
    first = await gen.__anext__()
    assert isinstance(first, Step)
    await gen.aclose()  # the consumer goes away: the request is cancelled and the worker finishes
    assert req.cancel.is_set()
    # the engine is free again right away (the lock was released when the worker stopped)
    res = await asyncio.to_thread(e.complete, Request(prompt=code_ids[:20], mode="ar", max_tokens=3))
    assert len(res.token_ids) <= 3 and e.stats["passes"] < 2000
