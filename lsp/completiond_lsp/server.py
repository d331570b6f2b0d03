"""completiond-lsp: the language server editors talk to (pygls 2.x, stdio).

LSP methods:
  textDocument/inlineCompletion   ghost text from the daemon's `complete` (latest request per document
                                  wins; $/cancelRequest cancels the daemon request too)
  textDocument/didOpen|didChange|didClose   forwarded to the daemon (incremental, same encoding)
  workspace/executeCommand completiond.rewrite   rewrite a range, applied with workspace/applyEdit
  textDocument/codeAction         offers that rewrite for a selection
  workspace/didChangeConfiguration   settings apply live
  completiond/nextEdit            the predicted next edit, from the daemon's `next_edit` (next_edit.py)
Custom notifications to the client: `completiond/status` (loading / ready / error, last latency,
mean accepted tokens per pass) and, for clients that set `streaming` in initializationOptions,
`completiond/partial` {uri, version, position, text} with the text so far while it streams.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.exceptions import (JsonRpcContentModified, JsonRpcException, JsonRpcInternalError,
                              JsonRpcInvalidParams)
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol
from pygls.uris import to_fs_path
from pygls.workspace import TextDocument

from completiond import __version__
from completiond.paths import socket_path
from completiond.service import protocol as P
from completiond.service.client import DaemonError

from . import next_edit as _next_edit
from .daemon_link import DaemonLink, DaemonUnavailable
from .settings import Settings

log = logging.getLogger("completiond.lsp")
REWRITE = "completiond.rewrite"
CURSOR = "completiond/cursor"  # editor -> server notification: the cursor rests here


MIB = 1024 * 1024


class Malformed:
    """A request whose params did not fit the method's types: answered with -32602, not dropped."""

    def __init__(self, msg_id: Any, method: str, why: str):
        self.id, self.method, self.why = msg_id, method, why


def describe(e: BaseException) -> str:
    """cattrs' structuring error as one line naming the fields at fault ("invalid value for type,
    expected int @ $.params.position.line")."""
    try:
        from cattrs import transform_error

        return "; ".join(transform_error(e))[:500]
    except Exception:
        return str(e).splitlines()[0][:500]


class Protocol(LanguageServerProtocol):
    """pygls drops a request whose params it cannot structure (logged, never answered: the editor
    waits forever); here it gets an invalid-params error naming the method."""

    def structure_message(self, data: dict[str, Any]):
        try:
            return super().structure_message(data)
        except JsonRpcException as e:
            if isinstance(data, dict) and "id" in data and isinstance(data.get("method"), str):
                msg_id = data["id"] if isinstance(data["id"], (int, str)) and not isinstance(data["id"], bool) else None
                why = describe(e.__cause__) if e.__cause__ is not None else str(e)
                return Malformed(msg_id, data["method"], why)
            raise

    def handle_message(self, message) -> None:
        if isinstance(message, Malformed):
            log.info("malformed %s request %r: %s", message.method, message.id, message.why)
            self._send_response(message.id, error=JsonRpcInvalidParams(
                f"{message.method}: malformed params ({message.why})").to_response_error())
            return
        super().handle_message(message)


class CompletiondServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__("completiond-lsp", __version__, protocol_cls=Protocol)
        self.settings = Settings()
        self.link = DaemonLink(self._open_documents, self._status)
        self.inflight: dict[str, asyncio.Task] = {}  # uri -> the inline-completion task in flight
        self.last_status: dict = {}
        self.ready_message = ""  # the status message to restore when completions work again after an error
        self.refused: dict[str, str] = {}  # uri -> why the daemon does not hold it (too large...)
        self._progress: str | None = None  # the $/progress token of the load being shown

    def _open_documents(self) -> list[P.DocumentOpen]:
        return [open_params(d) for d in self.workspace.text_documents.values() if d.uri not in self.refused]

    def link_open(self, uri: str) -> tuple[str, dict]:
        """The `document/open` that gives the daemon the editor's whole text of `uri`."""
        return "document/open", open_params(self.workspace.get_text_document(uri)).to_wire()

    def _status(self, state: str, message: str, info: dict) -> None:
        """`completiond/status` to the client (state loading / restarting / ready / error, with the
        daemon's phase and the model), a log line, and LSP work-done progress while it loads."""
        self.last_status = {"state": state, "message": message, "target": info.get("target", ""),
                            "draft": info.get("draft"), "device": info.get("device", ""),
                            # the target's weights form, and why target and form are the default (None: named)
                            "quant": info.get("quant"), "defaultReason": info.get("default_reason"),
                            "phase": info.get("phase"), "phaseS": info.get("phase_s"),
                            "elapsedS": info.get("elapsed_s"), "progress": info.get("progress"),
                            # a background switch to the larger default: {model, phase, progress, why}
                            "upgrade": info.get("upgrade"),
                            "lastLatencyMs": self.last_status.get("lastLatencyMs"),
                            "meanAccepted": self.last_status.get("meanAccepted")}
        self.protocol.notify("completiond/status", self.last_status)
        level = types.MessageType.Error if state == "error" else types.MessageType.Info
        self.window_log_message(types.LogMessageParams(type=level, message=message))
        self._work_done(state, message, info.get("progress"))

    def _work_done(self, state: str, message: str, progress: Any) -> None:
        """Standard `$/progress` for clients that take it (VS Code's progress UI, Neovim's
        vim.lsp.status()): begun on the first loading status, ended on ready or error."""
        caps = self.client_capabilities
        if caps is None or caps.window is None or not caps.window.work_done_progress:
            return
        pct = int(progress) if isinstance(progress, (int, float)) and not isinstance(progress, bool) else None
        try:
            if state in ("loading", "restarting"):
                if self._progress is None:
                    self._progress = f"completiond-load-{id(self)}-{asyncio.get_running_loop().time():.3f}"
                    self.work_done_progress.create(self._progress)
                    self.work_done_progress.begin(self._progress, types.WorkDoneProgressBegin(
                        title="completiond", message=message, percentage=pct, cancellable=False))
                else:
                    self.work_done_progress.report(self._progress, types.WorkDoneProgressReport(
                        message=message, percentage=pct))
            elif self._progress is not None:
                self.work_done_progress.end(self._progress, types.WorkDoneProgressEnd(message=message))
                self._progress = None
        except Exception as e:  # progress is a courtesy: never let it break status
            log.info("work-done progress: %s", e)

    def apply_settings(self, values: Any) -> None:
        """Take initializationOptions / settings.completiond; refused values are shown to the user."""
        problems = self.settings.update(values)
        if problems:
            message = "completiond: " + "; ".join(problems)
            log.warning("%s", message)
            self.window_show_message(types.ShowMessageParams(type=types.MessageType.Warning, message=message))
        s = self.settings
        self.link.socket = Path(s.socket) if s.socket else socket_path()
        self.link.autostart = s.autostart
        self.link.serve_args = [arg for key in ("target", "draft", "dtype", "device")
                                if getattr(s, key) for arg in (f"--{key}", str(getattr(s, key)))]


def open_params(doc: TextDocument) -> P.DocumentOpen:
    """`document/open` for a pygls TextDocument (the editor's current text and version)."""
    return P.DocumentOpen(uri=doc.uri, text=doc.source, version=doc.version or 0, language_id=doc.language_id or "")


server = CompletiondServer()


@server.feature(types.INITIALIZE)
def initialize(ls: CompletiondServer, params: types.InitializeParams) -> None:
    ls.apply_settings(params.initialization_options)
    ls.link.roots = root_paths([f.uri for f in params.workspace_folders or []]
                               or ([params.root_uri] if params.root_uri else []))
    ls.link.encoding = wire_encoding(ls.workspace.position_encoding)


def root_paths(uris: list[str]) -> list[str]:
    """Workspace folder URIs -> the paths the daemon indexes (file: URIs only, %-decoded)."""
    return [path for path in map(to_fs_path, uris) if path]


def wire_encoding(encoding: types.PositionEncodingKind | str | None) -> str:
    """The daemon's name for the negotiated encoding: "utf-16", "utf-8" or "utf-32".

    pygls hands over the enum when the client sent no `general.positionEncodings` (LSP's default,
    UTF-16) and the client's string otherwise; str() of the enum is "PositionEncodingKind.Utf16",
    which the daemon rejects, so take its value.
    """
    if encoding is None:
        return types.PositionEncodingKind.Utf16.value
    return encoding.value if isinstance(encoding, types.PositionEncodingKind) else str(encoding)


@server.feature(types.INITIALIZED)
async def initialized(ls: CompletiondServer, params: types.InitializedParams) -> None:
    try:
        await ls.link.get()  # start / connect now, so the first completion does not wait for model loading
    except (DaemonUnavailable, OSError, DaemonError, asyncio.TimeoutError) as e:
        log.warning("daemon not available yet: %s", e)


@server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
def did_change_configuration(ls: CompletiondServer, params: types.DidChangeConfigurationParams) -> None:
    settings = params.settings
    if isinstance(settings, dict):
        ls.apply_settings(settings.get("completiond", settings))


def too_large(uri: str, chars: int) -> str | None:
    """Why the daemon cannot hold a document of `chars` characters, or None."""
    if chars <= P.MAX_DOCUMENT_CHARS:
        return None
    return (f"{uri} is too large ({chars / MIB:.1f} MiB, limit {P.MAX_DOCUMENT_CHARS / MIB:.0f} MiB: {chars} "
            f"characters, at most {P.MAX_DOCUMENT_CHARS}): no completiond suggestions in it")


def refuse(ls: CompletiondServer, uri: str, why: str) -> None:
    """Keep `uri` off the daemon and say why, once (the editor's completions then get this error)."""
    if ls.refused.get(uri) != why:
        log.warning("%s", why)
        ls.window_show_message(types.ShowMessageParams(type=types.MessageType.Warning, message="completiond: " + why))
    ls.refused[uri] = why


def resend(ls: CompletiondServer, uri: str, why: str) -> None:
    """The daemon refused an edit: its copy and the editor's differ now; send the editor's whole text."""
    if uri not in ls.workspace.text_documents or uri in ls.refused:
        return
    log.warning("daemon refused an edit of %s (%s): sending the whole document again", uri, why)
    ls.window_log_message(types.LogMessageParams(
        type=types.MessageType.Warning, message=f"completiond: the daemon refused an edit of {uri} ({why}); "
                                                f"sent the whole document again"))
    ls.link.send(ls.link_open(uri), lambda e: log.warning("re-sending %s failed: %s", uri, e))


@server.feature(types.TEXT_DOCUMENT_DID_OPEN)
async def did_open(ls: CompletiondServer, params: types.DidOpenTextDocumentParams) -> None:
    # pygls has put the document in its workspace already: one builder for every document/open
    doc = ls.workspace.get_text_document(params.text_document.uri)
    if why := too_large(doc.uri, len(doc.source)):
        refuse(ls, doc.uri, why)
        return
    ls.refused.pop(doc.uri, None)
    ls.link.send(ls.link_open(doc.uri), lambda e: refuse(ls, doc.uri, f"the daemon refused {doc.uri}: {e.message}"))


@server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
async def did_change(ls: CompletiondServer, params: types.DidChangeTextDocumentParams) -> None:
    uri = params.text_document.uri
    doc = ls.workspace.get_text_document(uri)  # pygls applied the change already
    if why := too_large(uri, len(doc.source)):
        if uri not in ls.refused:
            ls.link.send(("document/close", P.DocumentClose(uri=uri).to_wire()), None)
        refuse(ls, uri, why)
        return
    if uri in ls.refused:  # small enough again: the daemon gets it whole
        del ls.refused[uri]
        ls.link.send(ls.link_open(uri), lambda e: refuse(ls, uri, f"the daemon refused {uri}: {e.message}"))
        return
    changes = []
    for ch in params.content_changes:
        if isinstance(ch, types.TextDocumentContentChangePartial):
            changes.append({"range": ls.protocol._converter.unstructure(ch.range), "text": ch.text})
        else:
            changes.append({"text": ch.text})
    # a request, not a notification: a refused edit comes back, and the whole text is sent again
    ls.link.send(("document/change", P.DocumentChange(uri=uri, changes=changes,
                                                      version=params.text_document.version).to_wire()),
                 lambda e: resend(ls, uri, e.message))


@server.feature(CURSOR)
async def cursor(ls: CompletiondServer, params: Any) -> None:
    """`completiond/cursor` {textDocument: {uri}, position}: where the editor's cursor rests (LSP has no
    such message); the daemon warms the prompt of a completion there."""
    try:
        uri, pos = params.textDocument.uri, params.position
        wire = P.DocumentCursor(uri=uri, position=P.Position(int(pos.line), int(pos.character))).to_wire()
    except (AttributeError, TypeError, ValueError, P.RpcError) as e:
        log.info("ignored %s: %s", CURSOR, e)
        return
    await ls.link.notify("document/cursor", wire)


@server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
async def did_close(ls: CompletiondServer, params: types.DidCloseTextDocumentParams) -> None:
    if ls.refused.pop(params.text_document.uri, None) is not None:
        return  # the daemon never had it
    await ls.link.notify("document/close", P.DocumentClose(uri=params.text_document.uri).to_wire())


def is_stale_version(e: DaemonError) -> bool:
    """The daemon's copy of the document is not at the version the request names (an edit it refused)."""
    if e.code == P.CONTENT_MODIFIED:
        return True
    # Fallback for a daemon older than -32801, which answered -32602 "document is at version N, request
    # names M"; remove once no such daemon is in use (an autostarted daemon outlives LSP upgrades).
    return e.code == P.INVALID_PARAMS and "version" in e.message


def lsp_error(e: DaemonError) -> JsonRpcException:
    """The daemon's codes are JSON-RPC / LSP ones (-32602 invalid params, -32603 internal, -32800
    cancelled, -32801 content modified): pass them on, so that editors drop cancelled and outdated
    requests quietly and report the rest."""
    # the editor opens documents with textDocument/didOpen; the daemon's own method means nothing to it
    message = e.message.replace("send document/open first", "send textDocument/didOpen first")
    return JsonRpcException(message=message, code=e.code or JsonRpcInternalError.CODE)


async def daemon_request(ls: CompletiondServer, method: str, params: dict, partial: str, on_partial) -> dict:
    """Send a streaming request to the daemon; cancel it there if this task is cancelled."""
    try:
        client = await ls.link.get()
    except (DaemonUnavailable, OSError) as e:
        raise JsonRpcInvalidParams(f"completiond daemon unavailable: {e}") from None
    msgid, fut = client.send_request(method, params)
    unsubscribe = client.on(partial, lambda p: on_partial(p["text"]) if p.get("id") == msgid else None)
    try:
        try:
            return await fut
        except DaemonError as e:
            if not is_stale_version(e) or "uri" not in params:
                raise
            doc = ls.workspace.get_text_document(params["uri"])
            if params.get("version", doc.version) != doc.version:
                # the editor moved on since this request: it is outdated, and re-sending the text won't help
                raise JsonRpcContentModified(f"{params['uri']} changed (version {params['version']} -> "
                                             f"{doc.version}) while the request ran") from None
            # out of sync (an edit the daemon refused): send the editor's full text, then try once more
            await client.notify("document/open", open_params(doc).to_wire())
            unsubscribe()
            msgid, fut = client.send_request(method, params)
            unsubscribe = client.on(partial, lambda p: on_partial(p["text"]) if p.get("id") == msgid else None)
            return await fut
    except asyncio.CancelledError:
        if not client.closed.is_set():
            client.send_request("cancel", P.Cancel(id=msgid).to_wire())  # the daemon stops within one forward pass
        raise
    except DaemonError as e:
        raise lsp_error(e) from None
    except ConnectionError:
        raise JsonRpcInvalidParams("the completiond daemon went away; it is restarted on the next request") \
            from None
    finally:
        unsubscribe()


@server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
async def inline_completion(ls: CompletiondServer, params: types.InlineCompletionParams
                            ) -> types.InlineCompletionList | None:
    uri, pos = params.text_document.uri, params.position
    if uri not in ls.workspace.text_documents:
        raise JsonRpcInvalidParams(f"document not open: {uri}: send textDocument/didOpen first")
    if uri in ls.refused:
        raise JsonRpcInvalidParams(ls.refused[uri])
    if (old := ls.inflight.get(uri)) is not None and not old.done():
        old.cancel()  # a newer request for this document: the older one is stale
    me = asyncio.current_task()
    ls.inflight[uri] = me
    try:
        if ls.settings.debounceMs > 0:
            await asyncio.sleep(ls.settings.debounceMs / 1000)  # cancelled here while the user types fast
        try:
            doc = ls.workspace.get_text_document(uri)
            version = doc.version
        except Exception:
            version = None
        so_far: list[str] = []

        def on_partial(text: str) -> None:
            so_far.append(text)
            if ls.settings.streaming:
                ls.protocol.notify("completiond/partial", {
                    "uri": uri, "version": version, "position": {"line": pos.line, "character": pos.character},
                    "text": "".join(so_far)})

        req = P.Complete(uri=uri, position=P.Position(pos.line, pos.character), version=version,
                         mode=ls.settings.mode, max_tokens=ls.settings.maxTokens,
                         multiline=ls.settings.multiline, n=ls.settings.suggestions).to_wire()
        try:
            res = await daemon_request(ls, "complete", req, "complete/partial", on_partial)
        except JsonRpcException as e:
            if e.code == P.INTERNAL_ERROR:  # e.g. a remote target down or failing: say so, not just drop it
                if ls.last_status.get("state") != "error":
                    ls.ready_message = ls.last_status.get("message", "")
                ls.last_status.update({"state": "error", "message": "completiond: " + e.message.removeprefix(
                    "RemoteError: ")})
                ls.protocol.notify("completiond/status", ls.last_status)
            raise
        if ls.last_status.get("state") == "error":  # served again: back to the message "ready" had
            ls.last_status["message"] = ls.ready_message
        ls.last_status.update({"state": "ready", "lastLatencyMs": res["ms_total"],
                               "meanAccepted": res["mean_accepted"]})
        ls.protocol.notify("completiond/status", ls.last_status)
        if res["cancelled"] or not res["text"]:
            return types.InlineCompletionList(items=[])
        # the greedy suggestion first, then the alternatives (editors cycle through the items)
        texts = [res["text"]] + [a["text"] for a in res.get("alternatives", [])]
        return types.InlineCompletionList(items=[types.InlineCompletionItem(
            insert_text=t, range=types.Range(start=pos, end=pos)) for t in texts])
    finally:
        if ls.inflight.get(uri) is me:
            del ls.inflight[uri]


@server.command(REWRITE)
async def rewrite(ls: CompletiondServer, args: Any) -> dict:
    """Arguments: [{uri, range, instruction}]; applies the edit and returns {applied, text}."""
    arg = args[0] if isinstance(args, list) and args else args
    if not isinstance(arg, dict):
        raise JsonRpcInvalidParams("completiond.rewrite takes [{uri, range, instruction}]")
    try:
        req = P.Rewrite.parse({k: arg.get(k) for k in ("uri", "range", "instruction")})
    except P.RpcError as e:
        raise JsonRpcInvalidParams(f"completiond.rewrite takes [{{uri, range, instruction}}]: {e.message}") from None
    res = await daemon_request(ls, "rewrite", req.to_wire(), "rewrite/partial", lambda t: None)
    rng = ls.protocol._converter.structure(arg["range"], types.Range)
    edit = types.WorkspaceEdit(changes={arg["uri"]: [types.TextEdit(range=rng, new_text=res["text"])]})
    applied = await ls.workspace_apply_edit_async(types.ApplyWorkspaceEditParams(edit=edit,
                                                                                 label="completiond rewrite"))
    return {"applied": bool(applied.applied), "text": res["text"]}


@server.feature(types.TEXT_DOCUMENT_CODE_ACTION,
                types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.RefactorRewrite]))
def code_action(ls: CompletiondServer, params: types.CodeActionParams) -> list[types.CodeAction]:
    r = params.range
    if r.start == r.end:
        return []
    arg = {"uri": params.text_document.uri, "range": ls.protocol._converter.unstructure(r),
           "instruction": "Rewrite this code to be clearer and simpler, keeping its behaviour"}
    return [types.CodeAction(title="Rewrite selection with completiond", kind=types.CodeActionKind.RefactorRewrite,
                             command=types.Command(title="Rewrite selection", command=REWRITE, arguments=[arg]))]


_next_edit.register(server, daemon_request)  # completiond/nextEdit (next_edit.py)


def main() -> None:
    import argparse
    import os

    p = argparse.ArgumentParser(prog="completiond-lsp", description="completiond language server (stdio)")
    p.add_argument("--log-file", default=os.environ.get("COMPLETIOND_LSP_LOG"))
    p.add_argument("--log-level", default="WARNING")
    a = p.parse_args()
    logging.basicConfig(level=a.log_level.upper(), filename=a.log_file,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    server.start_io()


if __name__ == "__main__":
    main()
