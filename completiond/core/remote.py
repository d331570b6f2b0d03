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
status and its message, an event it cannot read), one line each: the request that met them answers
that error, the daemon serves on. The server is read on a thread per answer, never on the engine
thread, and a hostile one is bounded: max_tokens counted here, an overall deadline, an idle
deadline that only whole events reset (a byte at a time does not), one SSE line at most
MAX_LINE_BYTES, QUEUE_EVENTS read ahead.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import queue
import socket
import threading
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
SLICE_S = 0.02  # an engine-thread step waits at most this for the server (then other jobs run)
MAX_TOKEN_CHARS = 64  # characters per token of max_tokens: an answer longer than that is cut
MAX_LINE_BYTES = 1 << 20  # one SSE line (llama.cpp's last event repeats the prompt)
QUEUE_EVENTS = 64  # events read ahead of the engine thread
STOP_EVERY_CHARS = 2048  # up to this, the stop rules see every batch of events; beyond, every +25 %
DEADLINE_S = 120.0  # a whole answer, however the server streams it


class RemoteError(Exception):
    """A remote target failed (down, slow, an error status, a malformed answer): one line for the user."""
    quiet = True  # the daemon logs it as one line, not a traceback: it is the server's failure, not a bug


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
                 token: str | None = None, deadline_s: float = DEADLINE_S):
        self.spec = spec
        name = f"{spec.kind}:{spec.url}#{spec.model}" + ("#raw" if spec.raw else "")
        self.target = RemoteTarget(name, tokenizer, spec.url)
        self.draft = None
        self.heads = None
        self.index = index or TokenIndex()
        self.timeout_s = timeout_s  # no whole event for this long: the request fails
        self.deadline_s = deadline_s  # a whole answer: then it ends with what came (stopped_by "deadline")
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

    def warming(self, prompt: list[int], ctx: PassContext,
                draft_ctx: PassContext | None = None) -> Generator[None, None, int]:
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
        """The completion streamed from the server; ctx (else the request's cancel) ends it early.

        The server is read on a thread of its own (_Stream); each step here waits at most SLICE_S for
        what it sent, so the engine thread is never held by a slow server: other documents' jobs
        run between the steps, a cancel is seen within SLICE_S and closes the stream at once. The
        stream ends at the request's max_tokens (counted here, whatever the server does), at the
        overall deadline (`deadline_s`, or the request's own), or with a RemoteError when no whole
        event came for `timeout_s` (a byte at a time does not count). max_tokens is counted without
        re-tokenizing what the server sent (its tokens need not be ours): servers stream one event
        per token or more, so at most max_tokens events with text (2 x max_tokens + 16 in all) and
        MAX_TOKEN_CHARS characters per token are taken."""
        from .request import Result
        from .prompt.typed import Step

        t0 = time.monotonic()
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
        tok, limit = self.target.tokenizer, max(1, req.max_tokens)
        deadline = t0 + min(self.deadline_s, req.deadline_ms / 1000 if req.deadline_ms is not None else self.deadline_s)
        text, n_events, n_texts, stopped, ms_first, cancelled = "", 0, 0, "", 0.0, False
        checked = emitted = 0  # text[:checked] has been through the stop rules, text[:emitted] streamed
        # The work a step reports is the turns this answer has had (the work left is the server's,
        # unknown here): the scheduler's least-work-first is then round robin among remote answers,
        # and a new request goes first.
        turns = 0
        yield Work(0, turns)
        stream = _Stream(self, self.body(req, prefix, suffix, middle))
        try:
            while not stopped:
                try:
                    ctx.check()
                except Cancelled:  # a stream keeps what came so far
                    cancelled, stopped = True, "cancelled"
                    break
                now = time.monotonic()
                if now >= deadline:
                    stopped = "deadline"
                    break
                if now - stream.last_event >= self.timeout_s:
                    raise RemoteError(f"{stream.where} did not answer within {self.timeout_s:g} s" if not stream.answered
                                      else f"{stream.where} sent no whole event for {self.timeout_s:g} s")
                pieces, finish = stream.take(min(SLICE_S, deadline - now))
                kept = []
                for piece in pieces:  # a server streams one event per token or more: max_tokens bounds them
                    if n_texts >= limit or n_events >= 2 * limit + 16:
                        finish = "max_tokens"
                        break
                    n_events += 1
                    if piece:
                        n_texts += 1
                        kept.append(piece)
                new = "".join(kept)[:limit * MAX_TOKEN_CHARS - len(text)]
                if n_texts >= limit or len(text) + len(new) >= limit * MAX_TOKEN_CHARS:
                    finish = finish or "max_tokens"
                if new:
                    ms_first = ms_first or (time.monotonic() - t0) * 1000
                    text += new
                if new or finish:
                    # The stop rules read the whole text: once per batch of events while it is short,
                    # then each time it has grown by a quarter (O(text) in all, not O(text^2)); only
                    # text they have seen is streamed.
                    if finish or len(text) <= STOP_EVERY_CHARS or len(text) >= checked * 5 // 4:
                        text, finish, checked = self._stop(req, text, finish)
                    if checked > emitted:
                        on_step(Step([], text[emitted:checked]))
                        emitted = checked
                stopped = finish
                if not stopped:
                    turns += 1
                    yield Work(0, turns)
        except RemoteError:
            self.stats["remote_errors"] += 1
            raise
        finally:
            stream.close()  # an early stop closes the stream: the server cancels its generation
        if checked < len(text):  # cancelled or out of time between two checks
            text = self._stop(req, text, stopped)[0]
        ids = tok.encode(text, add_special_tokens=False) if text else []
        self.stats["requests"] += 1
        if cancelled:
            self.stats["cancelled"] += 1
            self.stats["cancelled_ms"] += (time.monotonic() - t0) * 1000
        return Result(text=text, token_ids=ids, tokens=[tok.decode([i]) for i in ids],
                      mode=req.mode, target_passes=0, mean_accepted=0.0, ms_first_token=ms_first,
                      ms_total=(time.monotonic() - t0) * 1000, stopped_by=stopped or "eos", cancelled=cancelled,
                      prompt_tokens=len(req.prompt), reused_tokens=0, accepted_by_depth=[], served_tokens=0)

    @staticmethod
    def _stop(req: Request, text: str, finish: str) -> tuple[str, str, int]:
        """(text cut by the request's stop rules, the finish reason, its length)."""
        cut = req.stops.cut(text) if req.stops is not None else None
        if cut is not None:
            text, finish = text[:cut], "stop_rule"
        return text, finish, len(text)

    # ---- HTTP (on a _Stream's thread) ---------------------------------------------------------------
    def _open(self, body: dict, stream: _Stream) -> Iterator[tuple[str, str]]:
        """POST the request; its stream of (text, finish or ""). Errors: RemoteError. The connection is
        handed to `stream` (which may close it from the engine thread) as soon as it exists."""
        parts = urlsplit(self.spec.url)
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = cls(parts.hostname, parts.port, timeout=CONNECT_S)
        path = (parts.path or "") + self.spec.endpoint
        where = stream.where
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            conn.connect()
            if not stream.adopt(conn):
                return iter(())
            conn.sock.settimeout(self.timeout_s)  # connected: now each read may wait this long
            conn.request("POST", path, body=json.dumps(body).encode(), headers=headers)
            r = conn.getresponse()
        except ConnectionRefusedError:
            raise RemoteError(f"{where} is down (connection refused)") from None
        except (socket.timeout, TimeoutError):
            raise RemoteError(f"{where} did not answer within {self.timeout_s:g} s") from None
        except http.client.HTTPException as e:  # a status line or headers that are not HTTP
            raise RemoteError(f"{where} answered something that is not HTTP ({type(e).__name__}: "
                              f"{str(e)[:120]!r})") from None
        except OSError as e:
            if stream.stop.is_set():
                return iter(())
            raise RemoteError(f"{where} cannot be reached: {e.strerror or e}") from None
        stream.answered = True
        stream.last_event = time.monotonic()  # the headers are in: now whole events are waited for
        if r.status != 200:
            try:
                raw = r.read(64 * 1024).decode("utf-8", "replace")
            except (OSError, http.client.HTTPException):
                raw = ""
            try:
                msg = json.loads(raw)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                msg = raw.strip()[:200] or r.reason
            raise RemoteError(f"{where} answered {r.status}: {str(msg)[:200]}")
        return self._events(r, where)

    def _events(self, r: http.client.HTTPResponse, where: str) -> Iterator[tuple[str, str]]:
        kind = self.spec.kind
        while True:
            try:
                line = r.readline(MAX_LINE_BYTES + 1)
            except (socket.timeout, TimeoutError):
                raise RemoteError(f"{where} stopped streaming for {self.timeout_s:g} s") from None
            except (OSError, http.client.HTTPException, ValueError) as e:
                raise RemoteError(f"{where} broke off the answer: {type(e).__name__}: {str(e)[:120]}") from None
            if not line:
                return  # the server ended the stream
            if len(line) > MAX_LINE_BYTES:
                raise RemoteError(f"{where} sent an event line over {MAX_LINE_BYTES} bytes")
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
                    err = ev["error"]
                    raise RemoteError(f"{where} failed mid-answer: "
                                      f"{str(err.get('message', err) if isinstance(err, dict) else err)[:200]}")
                if kind == "openai":
                    ch = ev["choices"][0]
                    text, finish = ch.get("text") or "", ch.get("finish_reason") or ""
                    finish = {"length": "max_tokens", "stop": "eos"}.get(finish, finish)
                else:
                    text = ev.get("content") or ""
                    finish = ("max_tokens" if ev.get("stop_type") == "limit" else "eos") if ev.get("stop") else ""
                if not isinstance(text, str) or not isinstance(finish, str):
                    raise TypeError("text and finish_reason must be strings")
            except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError):
                raise RemoteError(f"{where} sent an event this daemon cannot read: {data[:120]!r}") from None
            yield text, finish


class _Stream:
    """One remote answer, read on a thread of its own into a bounded queue (QUEUE_EVENTS): the engine
    thread takes what came without waiting on the socket, and `close` ends the read at once (the
    socket is shut down under the reading thread)."""

    def __init__(self, engine: RemoteEngine, body: dict):
        self.where = f"remote target {engine.spec.url}"
        self.queue: queue.Queue = queue.Queue(QUEUE_EVENTS)
        self.stop = threading.Event()
        self.answered = False  # the status line and headers came
        self.last_event = time.monotonic()  # when the last whole event (or the headers) came
        self._conn: http.client.HTTPConnection | None = None
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(engine, body), name="remote-stream", daemon=True)
        self._thread.start()

    def adopt(self, conn: http.client.HTTPConnection) -> bool:
        """The reading thread's connection, once connected; False (and closed) if the stream was closed."""
        with self._lock:
            if self.stop.is_set():
                conn.close()
                return False
            # the socket itself: http.client drops conn.sock once a response reads until close
            self._conn, self._sock = conn, conn.sock
            return True

    def _read(self, engine: RemoteEngine, body: dict) -> None:
        try:
            for event in engine._open(body, self):
                if not self._put(event):
                    return
            self._put(_END)
        except RemoteError as e:
            self._put(e)
        except Exception as e:  # anything else a hostile server provokes: still one line with the address
            self._put(RemoteError(f"{self.where} failed: {type(e).__name__}: {str(e)[:200]}"))
        finally:
            with self._lock:
                conn, self._conn, self._sock = self._conn, None, None
            if conn is not None:
                conn.close()

    def _put(self, item: Any) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:  # the engine thread takes them at its pace: wait, or stop when closed
                continue
        return False

    def take(self, wait_s: float) -> tuple[list[str], str]:
        """The texts of the events that came (waiting up to wait_s for the first), and a finish
        reason if the stream ended; raises the stream's RemoteError."""
        pieces, finish = [], ""
        try:
            item = self.queue.get(timeout=max(0.0, wait_s))
            while True:
                if item is _END:
                    return pieces, finish or "eos"
                if isinstance(item, RemoteError):
                    raise item
                self.last_event = time.monotonic()
                pieces.append(item[0])
                if item[1]:
                    return pieces, item[1]
                item = self.queue.get_nowait()
        except queue.Empty:
            return pieces, finish

    def close(self) -> None:
        self.stop.set()
        with self._lock:  # under the lock: the reading thread closes the socket only after it
            if self._sock is not None:
                try:
                    self._sock.shutdown(socket.SHUT_RDWR)  # the reading thread's recv returns now
                except OSError:
                    pass


_END = object()


def load_remote(spec: str, index: TokenIndex, timeout_s: float = 30.0, token: str | None = None,
                deadline_s: float = DEADLINE_S) -> RemoteEngine:
    """A RemoteEngine with the tokenizer of the spec's #model (named model, directory or HF id)."""
    from transformers import AutoTokenizer

    from ..models.catalog import ModelError
    from ..models.loader import resolve

    rs = parse_remote(spec)
    model = rs.model if rs.model != "default" else "default"
    try:
        where, _, _ = resolve(model, "target", "cpu")
        tok = AutoTokenizer.from_pretrained(str(where))
    except ModelError as e:
        raise RemoteError(f"the tokenizer for {spec!r} (#{model}): {e}") from None
    except (OSError, ValueError) as e:
        raise RemoteError(f"the tokenizer for {spec!r} (#{model}): {e}") from None
    return RemoteEngine(rs, tok, index, timeout_s, token, deadline_s)
