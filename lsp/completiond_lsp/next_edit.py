"""`completiond/nextEdit`: the edit the user likely makes next, from the daemon's `next_edit`.

Request (editor -> server): {textDocument: {uri}, position?: Position, version?: int}
Result: {edits: [{range: Range, text}], ms, target_passes, version, cancelled, ...} -- the daemon's
result as is: its ranges are LSP ranges in the negotiated position encoding, against `version`.
A newer request for the same document cancels the older one (there and in the daemon), as does
$/cancelRequest; without `version` the server's current version of the document is asked for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from pygls.exceptions import JsonRpcInvalidParams

from completiond.service import protocol as P

NEXT_EDIT = "completiond/nextEdit"
log = logging.getLogger("completiond.lsp")


def _get(obj: Any, key: str) -> Any:
    """A field of custom params, which pygls hands over as namedtuples (or dicts)."""
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def wire_params(params: Any, current_version: Callable[[str], int | None]) -> P.NextEdit:
    """LSP params -> the daemon's `next_edit` params (JsonRpcInvalidParams, with the reason, if malformed)."""
    doc = _get(params, "textDocument")
    uri = _get(doc, "uri") if doc is not None else None
    if not isinstance(uri, str):
        raise JsonRpcInvalidParams(f"{NEXT_EDIT} takes {{textDocument: {{uri}}, position?, version?}}")
    version = _get(params, "version")
    if version is None:
        version = current_version(uri)
    pos = _get(params, "position")
    wire: dict = {"uri": uri, "version": version}
    if pos is not None:
        wire["position"] = {"line": _get(pos, "line"), "character": _get(pos, "character")}
    try:
        return P.NextEdit.parse(wire)
    except P.RpcError as e:
        raise JsonRpcInvalidParams(f"{NEXT_EDIT}: {e.message}") from None


def register(server: Any, daemon_request: Callable[..., Awaitable[dict]]) -> None:
    """Add the request to the server (server.py calls this once: a module of its own keeps it apart)."""
    inflight: dict[str, asyncio.Task] = {}

    def version_of(uri: str) -> int | None:
        try:
            return server.workspace.get_text_document(uri).version
        except Exception:  # not open in the server: the daemon answers "unknown document"
            return None

    @server.feature(NEXT_EDIT)
    async def next_edit(ls: Any, params: Any) -> dict:
        req = wire_params(params, version_of)
        if (old := inflight.get(req.uri)) is not None and not old.done():
            old.cancel()  # the newer request wins; daemon_request cancels the daemon's job too
        me = asyncio.current_task()
        inflight[req.uri] = me
        try:
            return await daemon_request(ls, "next_edit", req.to_wire(), "next_edit/partial", lambda t: None)
        finally:
            if inflight.get(req.uri) is me:
                del inflight[req.uri]
