"""What `/infill` and `/v1/completions` ask for, checked (400 with the field named), and the answers
in llama.cpp's and OpenAI's shapes (service/http.py runs them)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.prompt import FIM_STYLES
from . import protocol as P
from .http_docs import FILE_HEADER
from .http_io import HttpError, HttpRequest

if TYPE_CHECKING:
    from .daemon import Daemon

MAX_ALTERNATIVES = 8  # n_cmpl / n
DEFAULT_N_PREDICT = 128  # /infill without n_predict (or -1): llama.vim's default
OPENAI_DEFAULT_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions


def position(text: str, offset: int) -> dict:
    """The LSP position of `offset` in code points (the session speaks utf-32); line breaks as the
    daemon's documents count them (\\r\\n, \\r, \\n)."""
    from ..core.prompt import line_index

    starts = line_index(text[:offset])
    return {"line": len(starts) - 1, "character": offset - int(starts[-1])}


# ---- requests: what a client asked for, checked ------------------------------------------------
TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "a boolean", list: "a list",
              dict: "an object"}


def _field(body: dict, key: str, types: type | tuple, default: Any = None, check: Callable[[Any], bool] | None = None,
           what: str = "", kind: str = "") -> Any:
    """body[key] checked: of `types` (else "'key' must be <kind or the types>, not <its JSON type>"),
    then `check` (else "'key' out of range: value (what)")."""
    v = body.get(key, default)
    if v is None:
        return default
    types_t = types if isinstance(types, tuple) else (types,)
    if isinstance(v, bool) and bool not in types_t or not isinstance(v, types_t):
        names = " or ".join(TYPE_NAMES.get(t, t.__name__) for t in types_t if not (t is int and float in types_t))
        raise HttpError(400, f"'{key}' must be {kind or names}, not {_json_type(v)}")
    if check is not None and not check(v):
        raise HttpError(400, f"'{key}' out of range: {v!r}" + (f" ({what})" if what else ""))
    return v


def _json_type(v: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(v), type(v).__name__) + (f" ({v!r})" if isinstance(v, str) and len(v) <= 20 else "")


def _stops(body: dict, key: str = "stop") -> list[str]:
    v = body.get(key)
    if v is None:
        return []
    if isinstance(v, str):
        return [v] if v else []
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise HttpError(400, f"'{key}' must be a string or a list of strings")
    return [s for s in v if s]


@dataclass
class Ask:
    """One completion as HTTP asked for it, in the daemon's terms plus llama.cpp's client-side stops."""
    text: str
    cursor: int
    max_tokens: int
    temperature: float | None
    top_p: float
    top_k: int
    seed: int | None
    stop: list[str]
    n_indent: int = 0
    t_max_predict_ms: float = 0.0
    n: int = 1
    stream: bool = False
    file: str | None = None  # the file the client names (X-Completiond-File): its document (http_docs.py)
    extra_chunks: int = 0  # input_extra chunks accepted (the context buffer prompt lookup reads)

    def params(self, uri: str, i: int = 0) -> dict:
        p = {"uri": uri, "position": position(self.text, self.cursor), "max_tokens": self.max_tokens,
             "multiline": True}
        if self.temperature is not None and self.temperature >= P.MIN_TEMPERATURE:
            p.update(temperature=min(self.temperature, P.MAX_TEMPERATURE), top_p=self.top_p, top_k=self.top_k)
            if self.seed is not None or self.n > 1:
                p["seed"] = (self.seed or 0) + i  # alternatives differ; one seed repeats itself
        elif self.n > 1:  # greedy: the daemon's distinct alternatives, decoded in the same passes
            p["n"] = min(self.n, P.MAX_SUGGESTIONS)
        return p

    @property
    def greedy(self) -> bool:
        return self.temperature is None or self.temperature < P.MIN_TEMPERATURE


def file_named(headers: dict[str, str] | None) -> str | None:
    """The file the client names in the X-Completiond-File header, if any (at most 1,000 characters)."""
    name = (headers or {}).get(FILE_HEADER, "").strip()
    return name[:1000] or None


def infill_ask(body: dict, headers: dict[str, str] | None = None) -> tuple[Ask, list[dict]]:
    """llama.cpp /infill: the document is input_prefix + prompt + input_suffix, the cursor after prompt
    (llama.cpp puts `prompt` after <|fim_middle|>: llama.vim and llama.vscode send the current line's
    text before the cursor there)."""
    prefix = _field(body, "input_prefix", str, "")
    suffix = _field(body, "input_suffix", str, "")
    prompt = _field(body, "prompt", str, "", kind="a string (token arrays are not supported)")
    extra = _field(body, "input_extra", list, [])
    chunks = []
    for i, c in enumerate(extra):  # llama.cpp refuses the same shapes (tools/server tests)
        if not isinstance(c, dict) or not isinstance(c.get("text"), str) \
                or not isinstance(c.get("filename", ""), str):
            raise HttpError(400, f"input_extra[{i}] must be an object {{\"filename\": string, \"text\": string}}")
        chunks.append({"filename": c.get("filename", "tmp"), "text": c["text"]})
    n_predict = _field(body, "n_predict", int, -1, lambda v: v >= -1, ">= -1")
    ask = Ask(text=prefix + prompt + suffix, cursor=len(prefix) + len(prompt),
              max_tokens=min(P.MAX_TOKENS, DEFAULT_N_PREDICT if n_predict == -1 else max(n_predict, 1)),
              temperature=_field(body, "temperature", (int, float), None, lambda v: v >= 0, ">= 0"),
              top_p=_field(body, "top_p", (int, float), 1.0, lambda v: 0 < v <= 1, "0 < top_p <= 1"),
              top_k=_field(body, "top_k", int, 0, lambda v: v >= 0, ">= 0"),
              seed=_seed(body), stop=_stops(body),
              n_indent=_field(body, "n_indent", int, 0, lambda v: v >= 0, ">= 0"),
              t_max_predict_ms=_field(body, "t_max_predict_ms", (int, float), 0.0, lambda v: v >= 0, ">= 0"),
              n=_field(body, "n_cmpl", int, 1, lambda v: 1 <= v <= MAX_ALTERNATIVES, f"1..{MAX_ALTERNATIVES}"),
              stream=_field(body, "stream", bool, False), file=file_named(headers), extra_chunks=len(chunks))
    for key, typ in (("cache_prompt", bool), ("samplers", list), ("id_slot", int), ("response_fields", list),
                     ("t_max_prompt_ms", (int, float)), ("return_tokens", bool)):
        _field(body, key, typ)  # accepted (llama.vim, llama.vscode send them); type-checked like llama.cpp
    if n_predict == 0:
        ask.max_tokens = 0  # a context update (llama.vim's ring buffer): nothing to generate
    return ask, chunks


def _seed(body: dict) -> int | None:
    s = _field(body, "seed", int, None)
    return None if s is None or s < 0 else s % 2**32




def raw_fim(prompt: str) -> tuple[str, str] | None:
    """(text before the cursor, text after it) of a raw prefix-suffix-middle FIM prompt, else None.
    What stands before the prefix marker (repository / file headers) is dropped: this daemon builds
    its own context from the documents it holds."""
    for pre, suf, mid in FIM_STYLES:  # markers as text: what vLLM's /v1/completions takes (no `suffix`)
        p, s, m = prompt.find(pre), prompt.find(suf), prompt.find(mid)
        if 0 <= p < s < m:
            return prompt[p + len(pre):s] + prompt[m + len(mid):], prompt[s + len(suf):m]
    return None


def openai_ask(body: dict, headers: dict[str, str] | None = None) -> tuple[Ask, bool]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise HttpError(400, "'prompt' must be a string (or a list of one string)")
    suffix = _field(body, "suffix", str, "")
    if not suffix and (raw := raw_fim(prompt)) is not None:
        prompt, suffix = raw
    if body.get("logprobs") not in (None, 0):
        raise HttpError(400, "'logprobs' is not supported")
    if body.get("best_of") not in (None, 1):
        raise HttpError(400, "'best_of' is not supported")
    stop = _stops(body)
    ask = Ask(text=prompt + suffix, cursor=len(prompt),
              max_tokens=_field(body, "max_tokens", int, OPENAI_DEFAULT_MAX_TOKENS,
                                lambda v: 1 <= v <= P.MAX_TOKENS, f"1..{P.MAX_TOKENS}"),
              temperature=_field(body, "temperature", (int, float), None, lambda v: 0 <= v <= 2, "0..2"),
              top_p=_field(body, "top_p", (int, float), 1.0, lambda v: 0 < v <= 1, "0 < top_p <= 1"),
              top_k=0, seed=_seed(body), stop=stop,
              n=_field(body, "n", int, 1, lambda v: 1 <= v <= MAX_ALTERNATIVES, f"1..{MAX_ALTERNATIVES}"),
              stream=_field(body, "stream", bool, False), file=file_named(headers))
    if ask.stream and ask.n > 1:
        raise HttpError(400, "'stream' with 'n' > 1 is not supported")
    _field(body, "stream_options", dict)
    return ask, _field(body, "echo", bool, False)


def client_cut(ask: Ask, text: str) -> tuple[int | None, str, str]:
    """Where llama.cpp's request-side rules end the text: (cut or None, stop_type, stopping word).
    A stop string ends before itself; `n_indent` ends a line that starts less indented than it,
    after its indentation, as llama.cpp cuts it."""
    best: tuple[int | None, str, str] = (None, "", "")
    for s in ask.stop:
        i = text.find(s)
        if i >= 0 and (best[0] is None or i < best[0]):
            best = (i, "word", s)
    if ask.n_indent > 0:
        start = text.find("\n")
        while start >= 0:
            pos = start + 1
            while pos < len(text) and text[pos] in " \t":
                pos += 1
            if pos < len(text) and text[pos] != "\n" and pos - start - 1 < ask.n_indent:
                if best[0] is None or pos < best[0]:
                    best = (pos, "limit", "")
                break
            start = text.find("\n", start + 1)
    return best


def _held(ask: Ask, text: str) -> int:
    """How much of the end of `text` could still become a stop string: held back from a stream."""
    hold = 0
    for s in ask.stop:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                hold = max(hold, k)
                break
    return hold


# ---- answers -----------------------------------------------------------------------------------
@dataclass
class Done:
    """A finished completion with the client's rules applied."""
    text: str
    res: dict
    stop_type: str
    stopping_word: str = ""

    @property
    def predicted(self) -> int:
        return len(self.res.get("token_ids") or [])


TRUNCATED = ("max_tokens", "alternatives_budget")  # stopped_by: the text was cut, not finished


def _stop_type(res: dict) -> str:
    return {"eos": "eos", "stop_rule": "eos", "max_tokens": "limit", "deadline": "limit",
            "alternatives_budget": "limit"}.get(res.get("stopped_by", ""), "none")


def timings(res: dict, predicted: int) -> dict:
    """llama.cpp's `timings` from the daemon's result (prompt: until the first token)."""
    prompt_n = max(0, res.get("prompt_tokens", 0) - res.get("reused_tokens", 0))
    prompt_ms = res.get("ms_first_token", 0.0)
    pred_ms = max(0.0, res.get("ms_total", 0.0) - prompt_ms)
    return {"cache_n": res.get("reused_tokens", 0), "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": 1e3 * prompt_n / prompt_ms if prompt_ms else 0.0,
            "predicted_n": predicted, "predicted_ms": pred_ms,
            "predicted_per_token_ms": pred_ms / predicted if predicted else 0.0,
            "predicted_per_second": 1e3 * predicted / pred_ms if pred_ms else 0.0}


def infill_json(d: Daemon, ask: Ask, done: Done, index: int, stream: bool, return_tokens: bool) -> dict:
    res = done.res
    out = {"index": index, "content": "" if stream else done.text,
           "tokens": res.get("token_ids", []) if return_tokens and not stream else [],
           "id_slot": 0, "stop": True, "model": d.info.get("target"), "tokens_predicted": done.predicted,
           "tokens_evaluated": res.get("prompt_tokens", 0),
           "generation_settings": {"n_predict": ask.max_tokens, "temperature": ask.temperature or 0.0,
                                   "top_k": ask.top_k, "top_p": ask.top_p, "stop": ask.stop, "n_indent": ask.n_indent,
                                   "t_max_predict_ms": ask.t_max_predict_ms},
           "has_new_line": "\n" in done.text, "truncated": False, "stop_type": done.stop_type,
           "stopping_word": done.stopping_word,
           "tokens_cached": res.get("prompt_tokens", 0) + done.predicted,
           "timings": timings(res, done.predicted),
           # ours, beside llama.cpp's: how the daemon got there
           "completiond": {**{k: res.get(k) for k in ("mode", "target_passes", "mean_accepted", "reused_tokens",
                                                      "served_tokens", "prompt_lane", "stopped_by", "cancelled",
                                                      "document", "prompt_tokens")},
                           # input_extra chunks this request gave the context buffer (prompt lookup reads it)
                           "extra_chunks": ask.extra_chunks}}
    return out


def pick_fields(out: dict, fields: list) -> dict:
    """llama.cpp's response_fields: each "a/b" path present in the answer, under that flat key."""
    picked = {}
    for path in fields:
        if not isinstance(path, str):
            continue
        cur: Any = out
        for k in path.split("/"):
            if isinstance(cur, dict) and k in cur:
                cur = cur[k]
            else:
                break
        else:
            picked[path] = cur
    return picked


def finish_reason(done: Done) -> str:
    """OpenAI's: "length" where the text was cut (max_tokens, or an alternative cut where the main
    suggestion ended), "stop" where it ended (a stop string or rule, end of text)."""
    return "length" if done.stop_type == "limit" and done.res.get("stopped_by") in TRUNCATED else "stop"


def _usage(done: Done) -> dict:
    pt = done.res.get("prompt_tokens", 0)
    return {"prompt_tokens": pt, "completion_tokens": done.predicted, "total_tokens": pt + done.predicted}


def json_body(req: HttpRequest) -> dict:
    try:
        body = json.loads(req.body.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise HttpError(400, f"request body is not UTF-8: {e.reason} at byte {e.start}") from None
    except json.JSONDecodeError as e:
        raise HttpError(400, f"request body is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise HttpError(400, "request body is not valid JSON: nested too deep") from None
    if not isinstance(body, dict):
        raise HttpError(400, "request body must be a JSON object")
    return P.scrub(body)  # lone surrogates (JSON "\ud800") -> U+FFFD, as the wire does
