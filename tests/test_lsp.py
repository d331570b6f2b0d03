"""completiond-lsp end to end: a pygls client over stdio, the real server, a real daemon (tiny model)."""

import asyncio
import sys

import pytest
from lsprotocol import types
from pygls.lsp.client import LanguageClient

from daemon_util import start_daemon, stop_daemon

SRC = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"
URI = "file:///w/m.py"


class Client(LanguageClient):
    def __init__(self):
        super().__init__("test-client", "1")
        self.partials, self.statuses, self.edits, self.messages = [], [], [], []

        @self.feature("completiond/partial")
        def partial(params):
            self.partials.append(params._asdict())  # pygls hands custom params over as namedtuples

        @self.feature("completiond/status")
        def status(params):
            self.statuses.append(params._asdict())

        @self.feature(types.WORKSPACE_APPLY_EDIT)
        def apply_edit(params: types.ApplyWorkspaceEditParams):
            self.edits.append(params.edit)
            return types.ApplyWorkspaceEditResult(applied=True)

        @self.feature(types.WINDOW_LOG_MESSAGE)
        def log_message(params):
            pass

        @self.feature(types.WINDOW_SHOW_MESSAGE)
        def show_message(params: types.ShowMessageParams):
            self.messages.append(params)


@pytest.fixture(scope="module")
def daemon_sock(tmp_path_factory, tiny_dir):
    sock = tmp_path_factory.mktemp("lsp") / "d.sock"
    proc = start_daemon(sock, tiny_dir)
    yield sock
    stop_daemon(proc)


UTF16 = [types.PositionEncodingKind.Utf16]


async def start_lsp(options: dict, encodings: list | None = UTF16) -> tuple[Client, types.InitializeResult]:
    """Start the server over stdio; `encodings=None` is a client that sends no general.positionEncodings."""
    client = Client()
    await client.start_io(sys.executable, "-m", "completiond_lsp.server")
    caps = types.ClientCapabilities(general=types.GeneralClientCapabilities(position_encodings=encodings)
                                    if encodings is not None else None)
    result = await client.initialize_async(types.InitializeParams(
        capabilities=caps, root_uri=None, initialization_options=options))
    client.initialized(types.InitializedParams())
    return client, result


async def stop_lsp(client: Client) -> None:
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()


def did_open(client, text=SRC, uri=URI):
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))


def edit(client, version: int, start: tuple[int, int], end: tuple[int, int], text: str, uri=URI):
    """An incremental didChange replacing start..end ((line, character) in the negotiated encoding)."""
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=types.Position(*start), end=types.Position(*end)), text=text)]))


async def direct_complete(sock, text: str, line: int, char: int) -> str:
    """The daemon's completion for `text` on a connection of its own (what the LSP result must equal)."""
    from completiond.service.client import Client as RpcClient

    rpc = await RpcClient.connect(sock)
    await rpc.request("document/open", {"uri": URI, "text": text, "version": 1})
    res = await rpc.request("complete", {"uri": URI, "position": {"line": line, "character": char},
                                         "max_tokens": 16})
    await rpc.close()
    return res["text"]


def inline(client, line, char, uri=URI, msg_id=None):
    params = types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=line, character=char),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic))
    return client.protocol.send_request_async(types.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id=msg_id)


def options(sock, **kw):
    return {"socket": str(sock), "autostart": False, "debounceMs": 0, "streaming": True, "maxTokens": 16, **kw}


async def test_capabilities_and_streamed_completion(daemon_sock):
    client, init = await start_lsp(options(daemon_sock))
    try:
        caps = init.capabilities
        assert caps.inline_completion_provider is not None
        assert "completiond.rewrite" in caps.execute_command_provider.commands
        assert caps.code_action_provider
        did_open(client)
        res = await asyncio.wait_for(inline(client, 8, 14), 60)
        assert len(res.items) == 1
        item = res.items[0]
        assert item.range.start == types.Position(line=8, character=14)
        assert client.partials and client.partials[-1]["text"] == item.insert_text
        assert client.partials[-1]["uri"] == URI
        assert any(s.get("state") == "ready" for s in client.statuses)
        assert client.statuses[-1]["lastLatencyMs"] is not None
    finally:
        await stop_lsp(client)


async def test_client_without_position_encodings_gets_completions(daemon_sock):
    # issue 13.1: such a client (LSP default UTF-16) used to get -32602 for every request
    client, init = await start_lsp(options(daemon_sock), encodings=None)
    try:
        assert init.capabilities.position_encoding in (None, "utf-16")
        did_open(client, text="s = '😀'\n" + SRC)
        res = await asyncio.wait_for(inline(client, 9, 14), 60)
        assert len(res.items) == 1 and res.items[0].insert_text
        assert any(s.get("state") == "ready" for s in client.statuses)
        # UTF-16 positions: the emoji is two units, so character 6 splits it and 8 ends the line
        await asyncio.wait_for(inline(client, 0, 8), 60)
        with pytest.raises(Exception):
            await asyncio.wait_for(inline(client, 0, 6), 60)
    finally:
        await stop_lsp(client)


async def test_utf8_client_positions_in_bytes(daemon_sock):
    client, init = await start_lsp(options(daemon_sock), encodings=[types.PositionEncodingKind.Utf8])
    try:
        assert init.capabilities.position_encoding == "utf-8"
        did_open(client, text="s = 'é'\n")
        # an incremental edit in UTF-8 units: append "x = 1" after the closing quote (byte 8)
        edit(client, 2, (0, 8), (0, 8), "\nx = 1")
        via_lsp = await asyncio.wait_for(inline(client, 1, 5), 60)
        assert len(via_lsp.items) == 1 and via_lsp.items[0].insert_text
        with pytest.raises(Exception):  # byte 6 is inside "é" (2 bytes in UTF-8)
            await asyncio.wait_for(inline(client, 0, 6), 60)
    finally:
        await stop_lsp(client)
    assert via_lsp.items[0].insert_text == await direct_complete(daemon_sock, "s = 'é'\nx = 1\n", 1, 5)


async def test_bad_settings_are_shown_and_defaults_kept(daemon_sock):
    client, _ = await start_lsp(options(daemon_sock, maxTokens="lots", mode="fast"))
    try:
        did_open(client)
        res = await asyncio.wait_for(inline(client, 8, 14), 60)  # served with the defaults
        assert len(res.items) == 1
        warnings = [m.message for m in client.messages if m.type == types.MessageType.Warning]
        assert len(warnings) == 1 and "setting mode must be" in warnings[0] and "setting maxTokens" in warnings[0]
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
            settings={"completiond": {"debounceMs": "soon"}}))
        for _ in range(100):
            if len(client.messages) > 1:
                break
            await asyncio.sleep(0.05)
        assert "setting debounceMs must be an integer 0..5000" in client.messages[-1].message
    finally:
        await stop_lsp(client)


async def test_incremental_utf16_edits_match_direct_daemon(daemon_sock):
    client, _ = await start_lsp(options(daemon_sock))
    try:
        did_open(client, text="s = '😀'\n")
        # insert "é = 1\nt" after the emoji (UTF-16 character 7), then replace "1" by "22"
        edit(client, 2, (0, 7), (0, 7), "é = 1\nt")
        edit(client, 3, (0, 11), (0, 12), "22")
        via_lsp = await asyncio.wait_for(inline(client, 1, 1), 60)
        with pytest.raises(Exception):  # inside the surrogate pair: an error, not a wrong answer
            await asyncio.wait_for(inline(client, 0, 6), 60)
    finally:
        await stop_lsp(client)
    # the same final text sent directly to the daemon completes identically (greedy is deterministic)
    direct = await direct_complete(daemon_sock, "s = '😀é = 22\nt'\n", 1, 1)
    assert (via_lsp.items[0].insert_text if via_lsp.items else "") == direct


async def test_refused_edit_resyncs_the_document_and_retries(daemon_sock):
    from pygls.workspace import TextDocument

    # an edit past the end: pygls appends it, the daemon refuses it ("bad change range") and stays at
    # version 1; the completion names version 2, the daemon answers -32801 and the server re-sends the text
    added = "    return a * b\n\n\ndef div(a, b):\n"
    expected = TextDocument(URI, SRC, version=1)
    expected.apply_change(types.TextDocumentContentChangePartial(
        range=types.Range(start=types.Position(50, 0), end=types.Position(50, 0)), text=added))
    assert expected.source == SRC + added
    client, _ = await start_lsp(options(daemon_sock))
    try:
        did_open(client)
        edit(client, 2, (50, 0), (50, 0), added)
        via_lsp = await asyncio.wait_for(inline(client, 12, 14), 60)
    finally:
        await stop_lsp(client)
    direct = await direct_complete(daemon_sock, expected.source, 12, 14)
    assert [i.insert_text for i in via_lsp.items] == ([direct] if direct else [])


async def test_cancel_request_and_latest_wins(daemon_sock):
    client, _ = await start_lsp(options(daemon_sock, maxTokens=2000, mode="ar"))
    try:
        did_open(client, text=SRC.rstrip("\n"))
        first = inline(client, 8, 14, msg_id="long-1")
        for _ in range(600):
            if client.partials:
                break
            await asyncio.sleep(0.05)
        client.protocol.notify("$/cancelRequest", types.CancelParams(id="long-1"))
        with pytest.raises(Exception) as e:
            await asyncio.wait_for(first, 30)
        assert "cancel" in str(e.value).lower()
        # latest wins: a second request for the same document supersedes the first
        older = inline(client, 8, 14)
        await asyncio.sleep(0.3)
        newer = inline(client, 8, 10)
        done = await asyncio.wait_for(asyncio.gather(older, newer, return_exceptions=True), 60)
        assert isinstance(done[0], Exception) or done[0].items == []
        assert not isinstance(done[1], Exception)
    finally:
        await stop_lsp(client)


async def test_rewrite_command_applies_edit_and_bad_params(daemon_sock):
    client, _ = await start_lsp(options(daemon_sock))
    try:
        did_open(client)
        rng = {"start": {"line": 0, "character": 0}, "end": {"line": 2, "character": 0}}
        out = await asyncio.wait_for(client.workspace_execute_command_async(types.ExecuteCommandParams(
            command="completiond.rewrite", arguments=[{"uri": URI, "range": rng, "instruction": "rename to plus"}])),
            60)
        assert out["applied"] is True
        edit = client.edits[-1].changes[URI][0]
        assert edit.range.start.line == 0 and edit.range.end.line == 2 and edit.new_text == out["text"]
        actions = await client.text_document_code_action_async(types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=URI), range=types.Range(
                start=types.Position(line=0, character=0), end=types.Position(line=1, character=0)),
            context=types.CodeActionContext(diagnostics=[])))
        # pygls' client decodes the CodeAction | Command union as a Command whose `command` holds the rest
        assert actions and actions[0].title == "Rewrite selection with completiond"
        assert "'command': 'completiond.rewrite'" in str(actions[0].command)
        for bad in ([], [{"uri": URI}], ["nope"]):
            with pytest.raises(Exception):
                await client.workspace_execute_command_async(types.ExecuteCommandParams(
                    command="completiond.rewrite", arguments=bad))
        with pytest.raises(Exception):  # unknown document
            await asyncio.wait_for(inline(client, 0, 0, uri="file:///nowhere.py"), 30)
        with pytest.raises(Exception):  # position past the end of the document
            await asyncio.wait_for(inline(client, 99, 0), 30)
        assert (await asyncio.wait_for(inline(client, 8, 14), 60)) is not None  # still serving
    finally:
        await stop_lsp(client)


async def test_autostart_and_survive_daemon_restart(tmp_path, tiny_dir):
    import os
    import signal

    sock = tmp_path / "auto.sock"
    opts = options(sock, autostart=True, target=str(tiny_dir), draft="self:1", dtype="float32")
    client, _ = await start_lsp(opts)
    try:
        did_open(client)
        first = await asyncio.wait_for(inline(client, 8, 14), 180)
        assert sock.exists()
        # kill the daemon the server started; the next request starts a new one and re-sends the document
        from completiond.service.client import Client as RpcClient
        rpc = await RpcClient.connect(sock)
        pid = (await rpc.request("status", {}))["pid"]
        await rpc.close()
        os.kill(pid, signal.SIGKILL)
        await asyncio.sleep(0.5)
        second = None
        for _ in range(3):  # the first try may see the dead connection
            try:
                second = await asyncio.wait_for(inline(client, 8, 14), 180)
                break
            except Exception:
                await asyncio.sleep(0.5)
        assert second is not None and [i.insert_text for i in second.items] == [i.insert_text for i in first.items]
        rpc = await RpcClient.connect(sock)
        st = await rpc.request("status", {})
        assert st["pid"] != pid and st["documents"] == 1
        await rpc.request("shutdown", {})
        await rpc.close()
    finally:
        await stop_lsp(client)
