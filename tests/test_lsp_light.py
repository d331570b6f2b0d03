"""completiond-lsp without a daemon: what the language server process loads, and its pure helpers."""

import subprocess
import sys


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
    from completiond import protocol as P
    from completiond.client import DaemonError
    from completiond_lsp.server import is_stale_version

    assert is_stale_version(DaemonError(P.CONTENT_MODIFIED, "document moved on"))
    # a daemon from before -32801
    assert is_stale_version(DaemonError(P.INVALID_PARAMS, "document is at version 20, request names 19"))
    assert not is_stale_version(DaemonError(P.INVALID_PARAMS, "unknown document 'file:///x.py'"))
    assert not is_stale_version(DaemonError(P.INTERNAL_ERROR, "version mismatch in the engine"))


def test_settings_defaults_match_readme_and_wire_schema():
    from dataclasses import fields

    from completiond import protocol as P
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

    from completiond import protocol as P
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
