"""Streaming: `Engine.complete(req, on_step)` calls on_step with each pass's new tokens and text (the
daemon forwards them as `complete/partial`); a cancel set from a step stops the request at once."""

import tiny
from completiond.core.engine import Engine, Request, Step
from completiond.core.prompt.stops import StopRules

STOPS = StopRules(multiline=True, cursor_indent=100)


def engine():
    return Engine(tiny.loaded(tiny.gemma_config(window=16), seed=1, scale=4.0))


def test_steps_concatenate_to_the_result(code_ids):
    e = engine()
    steps: list[Step] = []
    result = e.complete(Request(prompt=code_ids[:60], mode="pld", max_tokens=30, stops=STOPS), steps.append)
    assert len(steps) >= 2 and all(isinstance(s, Step) for s in steps)
    assert "".join(s.text for s in steps) == result.text
    assert sum(len(s.token_ids) for s in steps) == len(result.token_ids)
    # the same request without streaming gives the same tokens
    again = e.complete(Request(prompt=code_ids[:60], mode="ar", max_tokens=30, stops=STOPS))
    assert again.token_ids == result.token_ids


def test_a_cancel_from_a_step_stops_the_request_and_frees_the_engine(code_ids):
    e = engine()
    req = Request(prompt=code_ids[:60], mode="ar", max_tokens=2000, stops=STOPS)
    seen: list[Step] = []

    def on_step(step: Step) -> None:  # the consumer goes away after the first text
        seen.append(step)
        req.cancel.set()

    res = e.complete(req, on_step)
    assert res.cancelled and len(seen) == 1 and len(res.token_ids) == len(seen[0].token_ids)
    again = e.complete(Request(prompt=code_ids[:20], mode="ar", max_tokens=3))
    assert len(again.token_ids) <= 3 and e.stats["passes"] < 10
