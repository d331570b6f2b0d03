"""MessagePack-RPC framing, the daemon's error codes and its one wire schema (contract: docs/protocol.md).

request `[0, msgid, method, params]`, response `[1, msgid, error, result]`, notification
`[2, method, params]`; params is one map; error is null or {"code": int, "message": str}.
The params of each method are typed below (one wire schema), with their defaults and bounds in one place.
This module stays free of torch: the LSP process imports it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import msgpack

from ..limits import MAX_PROMPT_TOKENS, MIN_TEMPERATURE  # noqa: F401 (part of the protocol)

REQUEST, RESPONSE, NOTIFICATION = 0, 1, 2
PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 16 * 1024 * 1024

INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
CANCELLED = -32800
CONTENT_MODIFIED = -32801  # LSP ContentModified: the document moved on past the version a request names

# strings are decoded with surrogateescape: an invalid UTF-8 byte becomes U+DC80..U+DCFF, so a bad
# string costs its own request (answered below) instead of the byte stream; lone surrogates that a
# sender holds (JSON "\\ud800" from an editor) are in the same range
_SURROGATE = re.compile("[\ud800-\udfff]")


class RpcError(Exception):
    def __init__(self, code: int, message: str, close: bool = False):
        super().__init__(message)
        self.code = code
        self.message = message
        self.close = close  # answer, then close the connection (a wrong token)

    def to_wire(self) -> dict:
        return {"code": self.code, "message": self.message}


@dataclass
class Frame:
    kind: int
    msgid: int | None
    method: str | None
    params: dict | None


def parse_frame(obj: Any) -> Frame:
    """Validate one decoded msgpack value as a request or notification; RpcError(-32600) if it is not."""
    if not isinstance(obj, (list, tuple)) or not obj:
        raise RpcError(INVALID_REQUEST, "a frame must be an array [0, msgid, method, params] or [2, method, params]")
    kind = obj[0]
    if kind == REQUEST:
        if len(obj) != 4:
            raise RpcError(INVALID_REQUEST, "a request has 4 elements: [0, msgid, method, params]")
        _, msgid, method, params = obj
        if not isinstance(msgid, int) or isinstance(msgid, bool) or not 0 <= msgid < 2**32:
            raise RpcError(INVALID_REQUEST, "msgid must be an unsigned 32-bit integer")
    elif kind == NOTIFICATION:
        if len(obj) != 3:
            raise RpcError(INVALID_REQUEST, "a notification has 3 elements: [2, method, params]")
        _, method, params = obj
        msgid = None
    else:
        raise RpcError(INVALID_REQUEST, f"unknown frame type {kind!r}: clients send requests (0) or notifications (2)")
    if not isinstance(method, str):
        raise RpcError(INVALID_REQUEST, "method must be a string")
    if (bad := invalid_utf8(method)) is not None:
        raise RpcError(INVALID_REQUEST, f"method is not valid UTF-8 ({bad})")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        if (bad := invalid_utf8(params)) is not None:
            raise RpcError(INVALID_REQUEST, f"malformed frame: a string is not valid UTF-8 ({bad})")
        raise RpcError(INVALID_PARAMS, "params must be a map")
    if (bad := invalid_utf8(params)) is not None:
        raise RpcError(INVALID_PARAMS, f"params are not valid UTF-8: {bad}")
    return Frame(kind, msgid, method, params)


def invalid_utf8(value: Any) -> str | None:
    """Where the first string that was not valid UTF-8 sits in a decoded value, or None.

    Iterative: a frame may nest as deep as msgpack allows, deeper than Python's recursion limit.
    """
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, str):
            if not v.isascii() and (m := _SURROGATE.search(v)):
                return f"{where or 'string'} has an invalid byte or lone surrogate at character {m.start()}"
        elif isinstance(v, dict):
            for k, item in v.items():
                name = f"{where}.{k}" if where else f"param {k!r}" if isinstance(k, str) else where
                if isinstance(k, str) and not k.isascii() and _SURROGATE.search(k):
                    return f"a key in {where or 'params'} is not valid UTF-8"
                stack.append((name, item))
        elif isinstance(v, (list, tuple)):
            stack.extend((f"{where}[{i}]" if where else f"[{i}]", item) for i, item in enumerate(v))
    return None


def scrub(value: Any) -> Any:
    """Lone surrogates -> U+FFFD in every string (one UTF-16 unit and one code point each: positions keep)."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value) if not value.isascii() else value
    if isinstance(value, dict):
        return {scrub(k): scrub(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub(v) for v in value]
    return value


def request_id(obj: Any) -> int | None:
    """The msgid of a malformed request, when one can be read, so its error can be answered."""
    if isinstance(obj, (list, tuple)) and len(obj) >= 2 and obj[0] == REQUEST and isinstance(obj[1], int) \
            and not isinstance(obj[1], bool) and 0 <= obj[1] < 2**32:
        return obj[1]
    return None


def pack(obj: Any) -> bytes:
    """msgpack bytes; a string holding a lone surrogate (not encodable as UTF-8) is sent scrubbed."""
    try:
        return msgpack.packb(obj, use_bin_type=True)
    except UnicodeEncodeError:
        return msgpack.packb(scrub(obj), use_bin_type=True)


def response(msgid: int | None, error: RpcError | None, result: Any = None) -> bytes:
    return pack([RESPONSE, msgid, error.to_wire() if error else None, None if error else result])


def notification(method: str, params: dict) -> bytes:
    return pack([NOTIFICATION, method, params])


def unpacker(max_bytes: int = MAX_FRAME_BYTES) -> msgpack.Unpacker:
    # max_buffer_size bounds one frame; invalid UTF-8 decodes to escapes that parse_frame rejects
    return msgpack.Unpacker(raw=False, max_buffer_size=max_bytes, strict_map_key=False,
                            unicode_errors="surrogateescape")


def describe(exc: Exception) -> str:
    """Why a byte stream could not be decoded, in words (msgpack's own exceptions carry no message)."""
    if isinstance(exc, msgpack.exceptions.StackError):
        return "nesting too deep"
    if isinstance(exc, msgpack.exceptions.FormatError):
        return "not MessagePack (a reserved byte where a value starts)"
    if isinstance(exc, UnicodeDecodeError):
        return f"invalid UTF-8 ({exc.reason})"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


# ---- params ---------------------------------------------------------------------------------------
def get(params: dict, key: str, typ, default=..., check=None, bounds: str = "", label: str = ""):
    """params[key] checked against a type (and a predicate); RpcError(-32602) otherwise."""
    name = label or key
    if key not in params or params[key] is None:
        if default is ...:
            raise RpcError(INVALID_PARAMS, f"missing param {name!r}")
        return default
    value = params[key]
    types = typ if isinstance(typ, tuple) else (typ,)
    if isinstance(value, bool) and bool not in types:
        raise RpcError(INVALID_PARAMS, f"param {name!r} must be {typ_name(typ)}")
    if not isinstance(value, types):
        if float in types and isinstance(value, int):
            value = float(value)
        else:
            raise RpcError(INVALID_PARAMS, f"param {name!r} must be {typ_name(typ)}")
    if check is not None and not check(value):
        raise RpcError(INVALID_PARAMS, f"param {name!r} out of range: {_short(value)}"
                                       + (f" ({bounds})" if bounds else ""))
    return value


def typ_name(typ) -> str:
    types = typ if isinstance(typ, tuple) else (typ,)
    return " or ".join(t.__name__ for t in types)


def _short(value: Any) -> str:
    if isinstance(value, (str, list, dict)) and len(value) > 40:
        return f"{len(value)} {'characters' if isinstance(value, str) else 'items'}"
    return repr(value)


# ---- the wire schema: each method's params, their defaults and bounds ----------------------------
MODES = ("ar", "pld", "draft", "combined")
ENCODINGS = ("utf-16", "utf-8", "utf-32")
DEFAULT_MAX_TOKENS = 64
MAX_SUGGESTIONS = 3  # complete's `n`: the greedy suggestion and up to two alternatives (core/alternatives.py)
MAX_TOKENS = 2048  # complete
MAX_REWRITE_TOKENS = 4096
MAX_INSTRUCTION_CHARS = 4000
MAX_DOCUMENT_CHARS = 4 * 1024 * 1024  # cost per request no longer grows with it: prompts read a window
MAX_OPEN_DOCUMENTS = 4096  # per connection, and MAX_SESSION_CHARS in all: memory is what they bound
MAX_SESSION_CHARS = 16 * MAX_DOCUMENT_CHARS
QUICK_PROMPT_MS = 300.0  # serve --quick-prompt-ms: the prefill a cold prompt may cost before the quick one answers
MAX_TEMPERATURE = 10.0
MAX_LOOKUP_LEN = 256


def param(typ, default: Any = ..., check=None, bounds: str = ""):
    """A schema field: its wire type(s), its default (... = required) and its bound (checked on parse)."""
    meta = {"typ": typ, "default": default, "check": check, "bounds": bounds}
    return field(metadata=meta) if default is ... else field(default=default, metadata=meta)


def between(typ, default: Any, lo: float, hi: float):
    """A number in [lo, hi]."""
    return param(typ, default, lambda v: lo <= v <= hi, f"{lo:g}..{hi:g}")


def one_of(choices: tuple[str, ...], default: Any):
    return param(str, default, lambda v: v in choices, " / ".join(choices))


class Params:
    """Base of the typed params: `parse(dict)` validates (RpcError -32602), `to_wire()` builds the map."""

    @classmethod
    def parse(cls, params: dict, prefix: str = ""):
        values = {}
        for f in fields(cls):
            m = f.metadata
            if isinstance(m["typ"], type) and issubclass(m["typ"], Params):  # nested: a position, a range
                sub = get(params, f.name, dict, m["default"], label=prefix + f.name)
                values[f.name] = m["typ"].parse(sub, f"{prefix}{f.name}.") if isinstance(sub, dict) else sub
            else:
                values[f.name] = get(params, f.name, m["typ"], m["default"], m["check"], m["bounds"],
                                     label=prefix + f.name)
        return cls(**values)

    def to_wire(self) -> dict:
        """The params map; None fields are left out (the daemon's default applies)."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is not None:
                out[f.name] = v.to_wire() if isinstance(v, Params) else list(v) if isinstance(v, tuple) else v
        return out


def _nonneg(v: int) -> bool:
    return v >= 0


@dataclass(frozen=True)
class Position(Params):
    line: int = param(int, check=_nonneg, bounds=">= 0")
    character: int = param(int, check=_nonneg, bounds=">= 0")


@dataclass(frozen=True)
class Range(Params):
    start: Position = param(Position)
    end: Position = param(Position)


@dataclass(frozen=True)
class Initialize(Params):
    client: str = param(str, "")
    protocol: int = param(int, PROTOCOL_VERSION)
    token: str = param(str, "")  # TCP only
    position_encoding: str = one_of(ENCODINGS, "utf-16")
    workspace_roots: list | tuple = param(list, (), lambda r: all(isinstance(x, str) for x in r), "a list of paths")


@dataclass(frozen=True)
class DocumentOpen(Params):
    uri: str = param(str)
    text: str = param(str, check=lambda t: len(t) <= MAX_DOCUMENT_CHARS,
                      bounds=f"a document has at most {MAX_DOCUMENT_CHARS} characters")
    version: int = param(int, 0)
    language_id: str = param(str, "")


@dataclass(frozen=True)
class DocumentChange(Params):
    uri: str = param(str)
    changes: list = param(list)  # LSP TextDocumentContentChangeEvents
    version: int | None = param(int, None)  # None: the document's version + 1


@dataclass(frozen=True)
class DocumentClose(Params):
    uri: str = param(str)


@dataclass(frozen=True)
class DocumentCursor(Params):  # where the editor's cursor rests: the warm-up prefills there
    uri: str = param(str)
    position: Position = param(Position)


@dataclass(frozen=True)
class Cancel(Params):
    id: int = param(int)


@dataclass(frozen=True)
class Empty(Params):
    """`status`, `shutdown`: no params."""


@dataclass(frozen=True)
class Complete(Params):
    uri: str = param(str)
    position: Position = param(Position)
    version: int | None = param(int, None)  # the document version the position refers to
    mode: str | None = one_of(MODES, None)  # None: the daemon's --mode
    max_tokens: int = between(int, DEFAULT_MAX_TOKENS, 1, MAX_TOKENS)
    temperature: float = between(float, 0.0, 0, MAX_TEMPERATURE)  # under MIN_TEMPERATURE: greedy
    top_p: float = param(float, 1.0, lambda p: 0 < p <= 1, "0 < top_p <= 1")
    top_k: int = param(int, 0, _nonneg, ">= 0, 0 = off")
    seed: int | None = param(int, None)
    multiline: bool = param(bool, True)
    deadline_ms: float | None = param((int, float), None, lambda d: d > 0, "> 0")
    reuse_prefix: bool = param(bool, True)
    # False: never answer from the short prompt of a cold document (`completiond complete` through a
    # daemon: the text a local load gives)
    quick: bool = param(bool, True)
    # suggestions in all: the greedy one (`text`) and up to n - 1 distinct `alternatives`, same passes
    n: int = between(int, 1, 1, MAX_SUGGESTIONS)


@dataclass(frozen=True)
class Rewrite(Params):
    uri: str = param(str)
    range: Range = param(Range)
    instruction: str = param(str, check=lambda s: 0 < len(s) <= MAX_INSTRUCTION_CHARS,
                             bounds=f"1..{MAX_INSTRUCTION_CHARS} characters")
    version: int | None = param(int, None)
    max_tokens: int | None = between(int, None, 1, MAX_REWRITE_TOKENS)  # None: twice the selection's tokens + 64
    mode: str | None = one_of(MODES, None)


@dataclass(frozen=True)
class NextEdit(Params):
    """`next_edit`: the edit the user likely makes next, near the last edit or `position`."""
    uri: str = param(str)
    version: int = param(int)  # the document version the client sees; -32801 if the daemon's moved on
    position: Position | None = param(Position, None)  # None: the document's last edit
    max_tokens: int | None = between(int, None, 1, MAX_REWRITE_TOKENS)  # None: twice the region + 64
    mode: str | None = one_of(MODES, None)


@dataclass(frozen=True)
class Lookup(Params):
    uri: str = param(str)
    position: Position = param(Position)
    max_len: int = between(int, 16, 1, MAX_LOOKUP_LEN)


def model_info(target: Any, draft: Any) -> dict:
    """target, draft, device, dtype of loaded models (initialize, status, `complete --json`); no torch
    import (the models are in). A named target is spelled with the weights form it runs, NAME@FORM."""
    from ..models.catalog import spelled

    return {"target": spelled(target.name, target.meta.get("quant")), "draft": draft.name if draft is not None else None, "device": str(target.device),
            "dtype": str(target.dtype).replace("torch.", ""), "quant": target.meta.get("quant", "none"),
            "prefill_dtype": prefill_dtype(target),
            # who runs int8 decode passes on CPU: "completiond-avx2" (models/kernels/int8_mm.c) or "torch"; None unquantized
            "int8_kernel": target.meta.get("int8_kernel"),
            # what holds the target's weights: "2 MB pages (...)", "mapped (4 KB pages: <why>)", "in memory"
            "weights": target.meta.get("weights"),
            # why `--target default` means this target here (None when a target was named)
            "default_reason": target.meta.get("default_reason")}


def prefill_dtype(target: Any) -> str:
    """What prefill chunks multiply in: the dtype, or float32 on CPUs with slow bf16 matmuls."""
    return str(getattr(target, "bulk_dtype", None) or target.dtype).replace("torch.", "")


@dataclass(frozen=True)
class Completion:
    """The result of `complete` and `rewrite` (keys: docs/protocol.md; extend, don't rename)."""
    text: str
    tokens: list
    token_ids: list
    target_passes: int
    mean_accepted: float  # draft tokens accepted per verify pass, bonus excluded
    ms_first_token: float
    ms_total: float
    cancelled: bool
    stopped_by: str
    mode: str
    prompt_tokens: int = 0
    reused_tokens: int = 0
    served_tokens: int = 0  # typed-through: tokens served from an earlier completion, with no pass
    prompt_lane: str = "full"  # complete: "quick" when answered from the short prompt of a cold document
    # complete with n > 1: [{text, token_ids, stopped_by}], distinct from `text` and each other, best first
    alternatives: list = field(default_factory=list)

    @classmethod
    def of(cls, res: Any, text: str | None = None) -> Completion:
        """From an engine Result (duck-typed: this module imports no torch); `text` overrides its text."""
        return cls(text=res.text if text is None else text, tokens=res.tokens, token_ids=res.token_ids,
                   target_passes=res.target_passes, mean_accepted=round(res.mean_accepted, 4),
                   ms_first_token=round(res.ms_first_token, 2), ms_total=round(res.ms_total, 2),
                   cancelled=res.cancelled, stopped_by=res.stopped_by, mode=res.mode,
                   prompt_tokens=res.prompt_tokens, reused_tokens=res.reused_tokens,
                   served_tokens=getattr(res, "served_tokens", 0),
                   alternatives=[{"text": a.text, "token_ids": a.token_ids, "stopped_by": a.stopped_by}
                                 for a in getattr(res, "alternatives", [])])

    @classmethod
    def superseded(cls, mode: str) -> Completion:
        """What a request cancelled before it reached the engine answers (no pass was run)."""
        return cls(text="", tokens=[], token_ids=[], target_passes=0, mean_accepted=0.0, ms_first_token=0.0,
                   ms_total=0.0, cancelled=True, stopped_by="cancelled", mode=mode)

    @classmethod
    def from_wire(cls, result: dict) -> Completion:
        """A client's view of a result map (keys it does not know are ignored)."""
        return cls(**{f.name: result[f.name] for f in fields(cls) if f.name in result})

    def to_wire(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
