"""MessagePack-RPC framing and the daemon's error codes (contract: shared/DESIGN.md).

request `[0, msgid, method, params]`, response `[1, msgid, error, result]`, notification
`[2, method, params]`; params is one map; error is null or {"code": int, "message": str}.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

REQUEST, RESPONSE, NOTIFICATION = 0, 1, 2
PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 16 * 1024 * 1024

INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
CANCELLED = -32800


class RpcError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

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
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise RpcError(INVALID_PARAMS, "params must be a map")
    return Frame(kind, msgid, method, params)


def request_id(obj: Any) -> int | None:
    """The msgid of a malformed request, when one can be read, so its error can be answered."""
    if isinstance(obj, (list, tuple)) and len(obj) >= 2 and obj[0] == REQUEST and isinstance(obj[1], int) \
            and not isinstance(obj[1], bool) and 0 <= obj[1] < 2**32:
        return obj[1]
    return None


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def response(msgid: int | None, error: RpcError | None, result: Any = None) -> bytes:
    return pack([RESPONSE, msgid, error.to_wire() if error else None, None if error else result])


def notification(method: str, params: dict) -> bytes:
    return pack([NOTIFICATION, method, params])


def unpacker(max_bytes: int = MAX_FRAME_BYTES) -> msgpack.Unpacker:
    # raw=False decodes strings as UTF-8 (invalid UTF-8 raises); max_buffer_size bounds one frame
    return msgpack.Unpacker(raw=False, max_buffer_size=max_bytes, strict_map_key=False)


# ---- params ---------------------------------------------------------------------------------------
def get(params: dict, key: str, typ, default=..., check=None):
    """params[key] checked against a type (and a predicate); RpcError(-32602) otherwise."""
    if key not in params or params[key] is None:
        if default is ...:
            raise RpcError(INVALID_PARAMS, f"missing param {key!r}")
        return default
    value = params[key]
    types = typ if isinstance(typ, tuple) else (typ,)
    if isinstance(value, bool) and bool not in types:
        raise RpcError(INVALID_PARAMS, f"param {key!r} must be {typ_name(typ)}")
    if not isinstance(value, types):
        if float in types and isinstance(value, int):
            value = float(value)
        else:
            raise RpcError(INVALID_PARAMS, f"param {key!r} must be {typ_name(typ)}")
    if check is not None and not check(value):
        raise RpcError(INVALID_PARAMS, f"param {key!r} out of range: {value!r}")
    return value


def typ_name(typ) -> str:
    types = typ if isinstance(typ, tuple) else (typ,)
    return " or ".join(t.__name__ for t in types)


def position(params: dict, key: str = "position") -> tuple[int, int]:
    pos = get(params, key, dict)
    line = get(pos, "line", int, check=lambda v: v >= 0)
    char = get(pos, "character", int, check=lambda v: v >= 0)
    return line, char


# ---- where the socket lives ---------------------------------------------------------------------
def socket_path() -> Path:
    """$COMPLETIOND_SOCKET, else $XDG_RUNTIME_DIR/completiond/daemon.sock, else a 0700 per-user temp dir."""
    if os.environ.get("COMPLETIOND_SOCKET"):
        return Path(os.environ["COMPLETIOND_SOCKET"])
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "completiond" / "daemon.sock"
    return Path(tempfile.gettempdir()) / f"completiond-{os.getuid()}" / "daemon.sock"
