"""A remote target: `--target openai:URL[#model]` or `llamacpp:URL[#model]` sends each completion to a
server (vLLM, llama.cpp server, another completiond's `--http`) instead of running a model here.

The daemon keeps what is local: the editor protocol, documents, the prompt (built with the tokenizer
of `#model`, a named model, directory or HF id), its stop rules, cancellation and the scheduler's
turns. The prompt goes out as text split at its FIM tokens: OpenAI `/v1/completions` gets
`prompt` (prefix) and `suffix`, llama.cpp `/infill` gets `input_prefix`, `prompt` (the typed middle)
and `input_suffix`; both stream (SSE) and the stop rules cut the text as it arrives, so a completion
that stops early closes the stream (the server's cancellation). What a server cannot take from here:
speculation (its own, if any), typed-through memory and warm-up (servers cache prompts themselves).

Failures are errors with the server's address and what happened (refused, timed out, an HTTP
status and its message), raised on the engine thread: the request that met them answers that error,
the daemon serves on. A connection that stays silent `timeout_s` seconds is given up, never waited on.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import time
from collections.abc import Callable, Generator, Hashable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .forward.context import Cancelled, PassContext
from .speculation.index import TokenIndex
from .scheduler import Work

if TYPE_CHECKING:  # torch comes with these; `serve` checks a remote spec before loading anything
    from .request import Request, Result
    from .prompt.typed import Step

SCHEMES = ("openai", "llamacpp")
CONNECT_S = 5.0


class RemoteError(Exception):
    """A remote target failed (down, slow, an error status, a malformed answer): one line for the user."""


def is_remote(spec: str) -> bool:
    return spec.split(":", 1)[0] in SCHEMES and "://" in spec


@dataclass(frozen=True)
class RemoteSpec:
    kind: str  # openai | llamacpp
    url: str  # the base: http://host:port[/v1]
    model: str  # sent as "model"; also where the tokenizer comes from
    raw: bool = False  # openai only (`#model#raw`): the FIM prompt as text with its FIM tokens, no `suffix` (vLLM)

    @property
    def endpoint(self) -> str:
        return "/completions" if self.kind == "openai" else "/infill"


def parse_remote(spec: str) -> RemoteSpec:
    kind, _, rest = spec.partition(":")
    url, *frag = rest.split("#")
    model, flags = (frag[0] if frag else ""), frag[1:]
    parts = urlsplit(url)
    if kind not in SCHEMES or parts.scheme not in ("http", "https") or not parts.hostname:
        raise RemoteError(f"--target {spec!r}: a remote target is openai:http://HOST:PORT/v1[#model[#raw]] "
                          f"or llamacpp:http://HOST:PORT[#model]")
    if any(f != "raw" for f in flags) or (flags and kind != "openai"):
        raise RemoteError(f"--target {spec!r}: the one flag after #model is #raw, for openai: targets "
                          f"(FIM tokens in the prompt, no suffix: vLLM)")
    return RemoteSpec(kind, url.rstrip("/"), model or "default", raw=bool(flags))


@dataclass
class RemoteTarget:
    """What the daemon reads of a target (name, tokenizer, device...) when the model is elsewhere."""
    name: str
    tokenizer: Any
    url: str
    device: str = "remote"
    dtype: str = "none"
    bulk_dtype: str | None = None
    meta: dict = field(default_factory=lambda: {"quant": "none"})

    def eos_ids(self) -> set[int]:
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return {eos} if isinstance(eos, int) else set()


class _NoSlots:
    """No cached sequences here: the server holds its own."""

    def hold(self, slot: Hashable, pinned: Any = (), capacity: int | None = None) -> None:
        return None

    def tokens(self, slot: Hashable) -> list[int]:
        return []

    def __len__(self) -> int:
        return 0


class _NoBudget:
    def costs(self) -> dict[int, float]:
        return {}

    def cost(self, n: int) -> float:
        return 1.0

    def table_status(self) -> dict:  # status.pass_costs: a remote target runs no passes here
        return {"origin": "remote", "sizes": {}}


@dataclass
class _Runner:
    backend: str = "remote"


class RemoteEngine:
    """An `EngineLike` (core/engine_like.py: what the daemon uses of an engine) over HTTP."""

    def __init__(self, spec: RemoteSpec, tokenizer: Any, index: TokenIndex | None = None, timeout_s: float = 30.0,
                 token: str | None = None):
        self.spec = spec
        name = f"{spec.kind}:{spec.url}#{spec.model}" + ("#raw" if spec.raw else "")
        self.target = RemoteTarget(name, tokenizer, spec.url)
        self.draft = None
        self.heads = None
        self.index = index or TokenIndex()
        self.timeout_s = timeout_s
        self.token = token
        self.stats = {"requests": 0, "passes": 0, "accepted": 0, "served_tokens": 0, "cancelled": 0,
                      "cancelled_ms": 0.0, "warms": 0, "warms_preempted": 0, "warm_ms": 0.0, "remote_errors": 0}
        self.budget = _NoBudget()
        self.slots = _NoSlots()
        self.runner = _Runner()

    # ---- what the daemon calls besides run --------------------------------------------------------
    @contextlib.contextmanager
    def turn(self, slot: Hashable = None, *, pinned: Any = ()) -> Iterator[None]:
        yield

    def work_ms(self, work: Work) -> float:
        return float(work.passes)

    def cached_prefix_len(self, prompt: list[int], slot: Hashable = None) -> int:
        return 0

    def prefill_ms_per_token(self) -> float:
        return 0.0  # the full prompt always: the server's prefill is not ours to avoid

    def typed_prompt(self, prompt: list[int], typed: str) -> None:
        return None

    def lookup(self, context: list[int], max_len: int = 16, n: int = 6) -> list[list[int]]:
        return []

    def save_calibration(self) -> None:
        return None

    def calibrate_cached(self) -> str:
        return "remote"

    def warming(self, prompt: list[int], ctx: PassContext) -> Generator[None, None, int]:
        """Nothing to prefill here (llama.cpp's cache_prompt and vLLM's prefix cache are the server's)."""
        return 0
        yield  # a generator, as the scheduler expects

    # ---- one completion -----------------------------------------------------------------------------
    def split(self, prompt: list[int]) -> tuple[str, str, str]:
        """(prefix, suffix, middle) text of a FIM prompt; a plain prompt is all prefix."""
        from .prompt import fim_tokens

        tok, fim = self.target.tokenizer, fim_tokens(self.target.tokenizer)

        def text(ids: list[int]) -> str:
            return tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

        if fim is not None and fim.prefix in prompt and fim.suffix in prompt and fim.middle in prompt:
            p, s, m = prompt.index(fim.prefix), prompt.index(fim.suffix), prompt.index(fim.middle)
            if p < s < m:
                return text(prompt[p + 1:s]), text(prompt[s + 1:m]), text(prompt[m + 1:])
        return text(prompt), "", ""

    def body(self, req: Request, prefix: str, suffix: str, middle: str) -> dict:
        s = req.sampling
        greedy = s.greedy
        if self.spec.kind == "openai":
            b = {"model": self.spec.model, "prompt": prefix + middle, "suffix": suffix, "max_tokens": req.max_tokens,
                 "temperature": 0.0 if greedy else s.temperature, "stream": True}
            if self.spec.raw:  # the whole prompt, FIM and repository tokens as text: the server tokenizes it
                heal = req.heal.text if req.heal else ""
                b["prompt"] = self.target.tokenizer.decode(req.prompt, skip_special_tokens=False,
                                                           clean_up_tokenization_spaces=False) + heal
                del b["suffix"]
            if not greedy:
                b["top_p"] = s.top_p
        else:
            b = {"input_prefix": prefix, "prompt": middle, "input_suffix": suffix, "n_predict": req.max_tokens,
                 "temperature": 0.0 if greedy else s.temperature, "cache_prompt": True, "stream": True}
            if not greedy:
                b.update(top_p=s.top_p, top_k=s.top_k)
        if req.seed is not None:
            b["seed"] = req.seed
        return b

    def run(self, req: Request, on_step: Callable[[Step], None] | None = None,
            ctx: PassContext | None = None) -> Generator[Work, None, Result]:
        """The completion streamed from the server; ctx (else the request's cancel) ends it early."""
        from .request import Result
        from .prompt.typed import Step

        t0 = time.perf_counter()
        ctx = PassContext(req.cancel) if ctx is None else ctx
        if on_step is None:  # the warm-up's speculative follow-up (nothing streams): memory we lack here
            return Result(text="", token_ids=[], tokens=[], mode=req.mode, target_passes=0, mean_accepted=0.0,
                          ms_first_token=0.0, ms_total=0.0, stopped_by="cancelled", cancelled=True,
                          prompt_tokens=len(req.prompt))
        prefix, suffix, middle = self.split(req.prompt)
        heal = req.heal.text if req.heal else ""
        if middle or not prefix.endswith(heal):
            middle += heal  # the healed token's text belongs before the cursor: the server heals its own
        else:
            prefix += heal
        text, emitted, stopped, ms_first, cancelled = "", 0, "", 0.0, False
        yield Work(0, req.max_tokens)
        conn = None
        try:
            conn, events = self._open(self.body(req, prefix, suffix, middle))
            for piece, finish in events:
                try:
                    ctx.check()
                except Cancelled:  # a stream keeps what came so far
                    cancelled, stopped = True, "cancelled"
                    break
                if piece and not ms_first:
                    ms_first = (time.perf_counter() - t0) * 1000
                text += piece
                cut = req.stops.cut(text) if req.stops is not None else None
                if cut is not None:
                    text, stopped = text[:cut], "stop_rule"
                delta, emitted = text[emitted:], max(emitted, len(text))
                if on_step is not None and delta:
                    on_step(Step([], delta))
                if stopped or finish:
                    stopped = stopped or finish
                    break
                yield Work(0, req.max_tokens)
        except RemoteError:
            self.stats["remote_errors"] += 1
            raise
        finally:
            if conn is not None:
                conn.close()  # an early stop closes the stream: the server cancels its generation
        ids = self.target.tokenizer.encode(text, add_special_tokens=False) if text else []
        self.stats["requests"] += 1
        if cancelled:
            self.stats["cancelled"] += 1
            self.stats["cancelled_ms"] += (time.perf_counter() - t0) * 1000
        return Result(text=text, token_ids=ids, tokens=[self.target.tokenizer.decode([i]) for i in ids],
                      mode=req.mode, target_passes=0, mean_accepted=0.0, ms_first_token=ms_first,
                      ms_total=(time.perf_counter() - t0) * 1000, stopped_by=stopped or "eos", cancelled=cancelled,
                      prompt_tokens=len(req.prompt), reused_tokens=0, accepted_by_depth=[], served_tokens=0)

    # ---- HTTP -------------------------------------------------------------------------------------
    def _open(self, body: dict) -> tuple[http.client.HTTPConnection, Iterator[tuple[str, str]]]:
        """POST the request; (connection, its stream of (text, finish or "")). Errors: RemoteError."""
        parts = urlsplit(self.spec.url)
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = cls(parts.hostname, parts.port, timeout=CONNECT_S)
        path = (parts.path or "") + self.spec.endpoint
        where = f"remote target {self.spec.url}"
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            conn.connect()
            conn.sock.settimeout(self.timeout_s)  # connected: now each read may wait this long
            conn.request("POST", path, body=json.dumps(body).encode(), headers=headers)
            r = conn.getresponse()
        except ConnectionRefusedError:
            conn.close()
            raise RemoteError(f"{where} is down (connection refused)") from None
        except (socket.timeout, TimeoutError):
            conn.close()
            raise RemoteError(f"{where} did not answer within {self.timeout_s:g} s") from None
        except OSError as e:
            conn.close()
            raise RemoteError(f"{where} cannot be reached: {e.strerror or e}") from None
        if r.status != 200:
            raw = r.read(64 * 1024).decode("utf-8", "replace")
            conn.close()
            try:
                msg = json.loads(raw)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                msg = raw.strip()[:200] or r.reason
            raise RemoteError(f"{where} answered {r.status}: {msg}")
        return conn, self._events(r, where)

    def _events(self, r: http.client.HTTPResponse, where: str) -> Iterator[tuple[str, str]]:
        kind = self.spec.kind
        while True:
            try:
                line = r.readline(1 << 20)
            except (socket.timeout, TimeoutError):
                raise RemoteError(f"{where} stopped streaming for {self.timeout_s:g} s") from None
            except (OSError, http.client.HTTPException) as e:
                raise RemoteError(f"{where} broke off the answer: {e}") from None
            if not line:
                return  # the server ended the stream
            line = line.strip()
            if not line.startswith(b"data:"):
                if line.startswith(b"error:"):
                    raise RemoteError(f"{where} failed mid-answer: {line[6:].decode('utf-8', 'replace')[:200]}")
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                return
            try:
                ev = json.loads(data)
                if "error" in ev:
                    raise RemoteError(f"{where} failed mid-answer: {ev['error'].get('message', ev['error'])}")
                if kind == "openai":
                    ch = ev["choices"][0]
                    text, finish = ch.get("text") or "", ch.get("finish_reason") or ""
                    finish = {"length": "max_tokens", "stop": "eos"}.get(finish, finish)
                else:
                    text = ev.get("content") or ""
                    finish = ("max_tokens" if ev.get("stop_type") == "limit" else "eos") if ev.get("stop") else ""
            except (ValueError, KeyError, IndexError, TypeError, AttributeError):
                raise RemoteError(f"{where} sent an event this daemon cannot read: {data[:120]!r}") from None
            yield text, finish


def load_remote(spec: str, index: TokenIndex, timeout_s: float = 30.0, token: str | None = None) -> RemoteEngine:
    """A RemoteEngine with the tokenizer of the spec's #model (named model, directory or HF id)."""
    from transformers import AutoTokenizer

    from ..models import ModelError, resolve

    rs = parse_remote(spec)
    model = rs.model if rs.model != "default" else "default"
    try:
        where, _, _ = resolve(model, "target", "cpu")
        tok = AutoTokenizer.from_pretrained(str(where))
    except ModelError as e:
        raise RemoteError(f"the tokenizer for {spec!r} (#{model}): {e}") from None
    except (OSError, ValueError) as e:
        raise RemoteError(f"the tokenizer for {spec!r} (#{model}): {e}") from None
    return RemoteEngine(rs, tok, index, timeout_s, token)
