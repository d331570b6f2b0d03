"""completiond-lsp without a daemon: what the language server process loads, and its pure helpers."""

import subprocess
import sys

import pytest


def test_lsp_server_import_leaves_torch_unloaded():
    # a fresh interpreter: this test process may already have torch from other tests
    code = ("import completiond_lsp.server, sys; "
            "heavy = [m for m in ('torch', 'transformers', 'numpy') if m in sys.modules]; "
            "assert not heavy, heavy")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_cache_root_follows_completiond_cache(tmp_path, monkeypatch):
    from completiond.paths import cache_root

    monkeypatch.setenv("COMPLETIOND_CACHE", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"
    monkeypatch.delenv("COMPLETIOND_CACHE")
    assert "completiond" in cache_root().parts


def test_stale_version_recognised_by_code_and_old_message():
    from completiond.service import protocol as P
    from completiond.service.client import DaemonError
    from completiond_lsp.server import is_stale_version

    assert is_stale_version(DaemonError(P.CONTENT_MODIFIED, "document moved on"))
    # a daemon from before -32801
    assert is_stale_version(DaemonError(P.INVALID_PARAMS, "document is at version 20, request names 19"))
    assert not is_stale_version(DaemonError(P.INVALID_PARAMS, "unknown document 'file:///x.py'"))
    assert not is_stale_version(DaemonError(P.INTERNAL_ERROR, "version mismatch in the engine"))


def test_settings_defaults_match_readme_and_wire_schema():
    from dataclasses import fields

    from completiond.service import protocol as P
    from completiond_lsp.settings import Settings

    s = Settings()
    assert s.debounceMs == 75 and s.mode == "combined" and s.mode in P.MODES  # as README states
    wire = {f.name: f.default for f in fields(P.Complete)}
    assert s.maxTokens == wire["max_tokens"] and s.multiline is wire["multiline"] is True


def test_settings_update_checks_each_value():
    from completiond_lsp.settings import Settings

    s = Settings()
    problems = s.update({"mode": "fast", "maxTokens": "lots", "debounceMs": -1, "multiline": "yes",
                         "socket": 5, "streaming": True, "target": "/models/t", "unknown": 1})
    assert [p.split(" must")[0] for p in problems] == ["setting mode", "setting maxTokens", "setting multiline",
                                                     "setting debounceMs", "setting socket"]
    assert "combined" in problems[0] and "keeping 64" in problems[1]
    assert (s.mode, s.maxTokens, s.debounceMs, s.multiline, s.socket) == ("combined", 64, 75, True, None)
    assert s.streaming is True and s.target == "/models/t"
    # whole-number floats (some JSON encoders) are integers; null keeps a value unless it can be null
    assert s.update({"maxTokens": 128.0, "debounceMs": None, "target": None}) == []
    assert (s.maxTokens, s.debounceMs, s.target) == (128, 75, None)
    assert s.update({"maxTokens": 100000}) and s.maxTokens == 128
    assert s.update(None) == [] and s.update(["x"]) == ["settings must be an object, got list"]


def test_root_paths_decode_file_uris_and_skip_others():
    from completiond_lsp.server import root_paths

    assert root_paths(["file:///w/my%20project", "untitled:Untitled-1", "file:///srv/x"]) == ["/w/my project",
                                                                                              "/srv/x"]


async def test_failed_handshake_closes_the_connection(tmp_path):
    """A daemon that answers initialize with an error: the link says why and leaves no connection open."""
    import asyncio

    import pytest

    from completiond.service import protocol as P
    from completiond_lsp.daemon_link import DaemonLink, DaemonUnavailable

    hung_up = asyncio.Event()

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        unpacker = P.unpacker()
        while data := await reader.read(65536):
            unpacker.feed(data)
            for frame in unpacker:
                if frame[0] == P.REQUEST:
                    writer.write(P.response(frame[1], P.RpcError(P.INVALID_PARAMS, "protocol 1 not supported")))
        hung_up.set()  # EOF: the link closed its end
        writer.close()

    sock = tmp_path / "d.sock"
    fake = await asyncio.start_unix_server(refuse, path=str(sock))
    statuses = []
    link = DaemonLink(lambda: [], lambda state, message, info: statuses.append((state, message)))
    link.socket, link.autostart = sock, False
    try:
        with pytest.raises(DaemonUnavailable, match="initialize .* failed: protocol 1 not supported"):
            await link.get()
        await asyncio.wait_for(hung_up.wait(), 30)
        assert not link.connected and statuses[-1][0] == "error"
    finally:
        fake.close()


def test_daemon_errors_keep_their_lsp_codes():
    from completiond.service import protocol as P
    from completiond.service.client import DaemonError
    from completiond_lsp.server import lsp_error

    for code in (P.INVALID_PARAMS, P.INTERNAL_ERROR, -32800, P.CONTENT_MODIFIED):
        err = lsp_error(DaemonError(code, "why")).to_response_error()
        assert (err.code, err.message) == (code, "why")
    assert lsp_error(DaemonError(0, "no code")).code == -32603


class StandInDaemon:
    """A unix-socket stand-in for `completiond serve` that answers every `complete` with -32801 (stale
    version), optionally only after the editor's edit to `hold_until` arrived; it records what it got."""

    def __init__(self, hold_until: int | None = None):
        import asyncio

        self.hold_until, self.changed = hold_until, asyncio.Event()
        self.opens: list[dict] = []
        self.completes: list[dict] = []
        self.cursors: list[dict] = []

    async def serve(self, reader, writer) -> None:
        import asyncio

        from completiond.service import protocol as P

        unpacker = P.unpacker()
        while data := await reader.read(65536):
            unpacker.feed(data)
            for frame in unpacker:
                # document updates come as notifications or as requests (whose refusal the LSP sees)
                method, params = (frame[1], frame[2]) if frame[0] == P.NOTIFICATION else (frame[2], frame[3])
                if method.startswith("document/"):
                    if method == "document/open":
                        self.opens.append(params)
                    elif method == "document/cursor":
                        self.cursors.append(params)
                    elif method == "document/change" and params.get("version") == self.hold_until:
                        self.changed.set()
                    if frame[0] != P.NOTIFICATION:
                        writer.write(P.response(frame[1], None, None))
                elif frame[2] == "initialize":
                    writer.write(P.response(frame[1], None, {"protocol": 1, "target": "stand-in", "device": "cpu"}))
                elif frame[2] == "complete":
                    self.completes.append(frame[3])
                    answer = P.response(frame[1], P.RpcError(P.CONTENT_MODIFIED, "document moved on"))
                    if self.hold_until is None:
                        writer.write(answer)
                    else:  # answer once the edit arrived; keep reading meanwhile
                        self.held = asyncio.create_task(self.answer_after_edit(writer, answer))
                else:
                    writer.write(P.response(frame[1], None, None))
        writer.close()

    async def answer_after_edit(self, writer, answer: bytes) -> None:
        import asyncio

        await asyncio.wait_for(self.changed.wait(), 60)
        writer.write(answer)


async def lsp_against(daemon: StandInDaemon, sock, version_after_open: int):
    """The real server over stdio, connected to the stand-in; one document opened and edited to
    `version_after_open`; returns (client, inline-completion future)."""
    import asyncio

    from lsprotocol import types
    from pygls.lsp.client import LanguageClient

    server = await asyncio.start_unix_server(daemon.serve, path=str(sock))
    client = LanguageClient("light", "1")
    await client.start_io(sys.executable, "-m", "completiond_lsp.server")
    await client.initialize_async(types.InitializeParams(capabilities=types.ClientCapabilities(),
                                                         initialization_options={"socket": str(sock),
                                                                                 "autostart": False,
                                                                                 "debounceMs": 0}))
    client.initialized(types.InitializedParams())
    uri = "file:///w/a.py"
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text="x = 1\n")))
    for version in range(2, version_after_open + 1):
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=f"x = {version}\n")]))
    pending = client.protocol.send_request_async(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=1, character=0),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic)))
    return server, client, pending


async def stop(server, client) -> None:
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    server.close()


async def test_stale_version_resyncs_once_then_reports_content_modified(tmp_path):
    import asyncio

    daemon = StandInDaemon()
    server, client, pending = await lsp_against(daemon, tmp_path / "s.sock", version_after_open=2)
    try:
        with pytest.raises(Exception) as e:
            await asyncio.wait_for(pending, 60)
        assert getattr(e.value, "code", None) == -32801
        # the editor is at the version the request named: the server re-sent its text and retried once
        assert [c["version"] for c in daemon.completes] == [2, 2]
        assert [(o["version"], o["text"]) for o in daemon.opens][-1] == (2, "x = 2\n")
    finally:
        await stop(server, client)


async def test_request_outdated_by_an_edit_is_not_retried(tmp_path):
    import asyncio

    from lsprotocol import types

    daemon = StandInDaemon(hold_until=3)
    server, client, pending = await lsp_against(daemon, tmp_path / "s.sock", version_after_open=2)
    try:
        for _ in range(600):  # until the request reached the stand-in, then edit (the answer waits for it)
            if daemon.completes:
                break
            await asyncio.sleep(0.05)
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri="file:///w/a.py", version=3),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text="x = 3\n")]))
        with pytest.raises(Exception) as e:
            await asyncio.wait_for(pending, 60)
        assert getattr(e.value, "code", None) == -32801 and "while the request ran" in str(e.value)
        assert [c["version"] for c in daemon.completes] == [2] and len(daemon.opens) == 1  # no resync
    finally:
        await stop(server, client)


async def test_editor_cursor_is_forwarded_to_the_daemon(tmp_path):
    """`completiond/cursor` from an editor reaches the daemon as `document/cursor` (it warms there);
    a malformed one is dropped, not forwarded."""
    import asyncio

    daemon = StandInDaemon()
    server, client, pending = await lsp_against(daemon, tmp_path / "d.sock", 1)
    try:
        await asyncio.wait([pending], timeout=30)  # answered (with an error): the link is connected now
        client.protocol.notify("completiond/cursor", {"textDocument": {"uri": "file:///w/a.py"}, "position": "x"})
        client.protocol.notify("completiond/cursor", {"textDocument": {"uri": "file:///w/a.py"},
                                                      "position": {"line": 0, "character": 3}})
        for _ in range(600):
            if daemon.cursors:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        assert daemon.cursors == [{"uri": "file:///w/a.py", "position": {"line": 0, "character": 3}}]
    finally:
        await stop(server, client)
