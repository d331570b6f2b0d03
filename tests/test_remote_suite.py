"""The daemon and completiond-lsp tests of a local target, run again on a daemon whose target is
remote: `--target openai:URL#model` against a second completiond's `--http` (the tiny model on both
ends). The tests are the very functions of test_daemon.py and test_lsp.py, imported here so that
pytest runs them with this module's `daemon` / `daemon_sock` fixtures; what a remote target cannot
do is left out by name: prompt-lookup candidates (debug/lookup reads the local engine), and
test_another_clients_completion_does_not_wait_for_a_long_request, whose "long" request the server
answers from its own typed-through memory in one event (an earlier test asked it the same), so it
ends before the short one starts; the laptop gives turns per streamed event, not per pass.

Then the server's failures through the LSP: down, 500 and silent each answer the editor's request
with an error that names the server and what happened, put the LSP's status in state "error" with
that message (Neovim shows it once, VS Code in its status item), and the next good answer puts the
status back to "ready"; never a hang."""

import asyncio
import time

import pytest

import test_daemon as td
import test_lsp as tl
from completiond.service.client import Client
from daemon_util import start_daemon, stop_daemon
from test_http import free_port
from test_http_remote import failing_target

# The shared tests (each runs as written, against the remote-target daemon below).
from test_daemon import (  # noqa: F401
    test_bad_frames_get_errors_and_daemon_keeps_serving,
    test_clients_share_the_daemon_and_survive_a_disconnect,
    test_complete_streams_partials_that_concatenate,
    test_document_changes_utf16_and_version,
    test_explicit_cancel_stops_quickly,
    test_latest_complete_for_a_document_wins,
    test_rewrite_streams_and_answers,
    test_truncated_and_oversize_frames,
    workspace,
)
from test_lsp import (  # noqa: F401
    test_bad_settings_are_shown_and_defaults_kept,
    test_cancel_request_and_latest_wins,
    test_capabilities_and_streamed_completion,
    test_client_without_position_encodings_gets_completions,
    test_incremental_utf16_edits_match_direct_daemon,
    test_refused_edit_resyncs_the_document_and_retries,
    test_rewrite_command_applies_edit_and_bad_params,
    test_utf8_client_positions_in_bytes,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_dir):
    """The team's server: a second completiond, on the tiny model, serving --http."""
    tmp = tmp_path_factory.mktemp("suite-server")
    port = free_port()
    proc = start_daemon(tmp / "d.sock", tiny_dir, "--http", f"127.0.0.1:{port}", "--token-file", str(tmp / "token"))
    yield {"port": port, "token_file": tmp / "token", "sock": tmp / "d.sock"}
    assert stop_daemon(proc) == 0


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, tiny_dir, server):
    """The laptop's daemon: no model of its own, its target the server's /v1/completions."""
    sock = tmp_path_factory.mktemp("suite-laptop") / "d.sock"
    proc = start_daemon(sock, tiny_dir, "--target", f"openai:http://127.0.0.1:{server['port']}/v1#{tiny_dir}",
                        "--remote-token-file", str(server["token_file"]))
    yield sock
    assert stop_daemon(proc) == 0


@pytest.fixture(scope="module")
def daemon_sock(daemon):
    return daemon


async def test_the_suite_ran_on_the_remote_target(daemon, server):
    """The fixtures above are what the imported tests ran on: a remote target, and the server did the work."""
    c = await td.connect(daemon)
    st = await c.request("status", {})
    await c.close()
    assert st["target"].startswith("openai:http://127.0.0.1:") and st["device"] == "remote"
    c = await Client.connect(server["sock"])
    served = (await c.request("status", {}))["requests_served"]
    await c.close()
    assert served >= 1


async def wait_status(client: tl.Client, state: str, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.statuses and client.statuses[-1].get("state") == state:
            return client.statuses[-1]
        await asyncio.sleep(0.05)
    raise AssertionError(f"no status {state!r}; got {client.statuses[-3:]}")


@pytest.mark.parametrize("failure", ["down", "500", "silent"])
async def test_lsp_shows_a_failing_server_and_recovers(tmp_path, tiny_dir, server, failure):
    """A laptop daemon whose server fails: the editor's request fails at once with the reason, the
    status says so, and once the target answers again (a daemon restarted on a good server, as the
    user would after fixing the URL) the same LSP session serves and is "ready"."""
    url, words, srv = failing_target(failure)
    sock = tmp_path / "bad.sock"
    proc = start_daemon(sock, tiny_dir, "--target", f"openai:{url}#{tiny_dir}", "--remote-timeout", "2")
    client, _ = await tl.start_lsp(tl.options(sock))
    try:
        tl.did_open(client)
        t0 = time.monotonic()
        with pytest.raises(Exception) as e:
            await asyncio.wait_for(tl.inline(client, 8, 14), 30)
        assert time.monotonic() - t0 < 20, "a failing server must not hold the editor's request"
        assert words in str(e.value) and url in str(e.value)
        st = await wait_status(client, "error")
        assert words in st["message"] and url in st["message"]
        # the daemon itself is fine: the same LSP session, pointed at a good server, serves again
        assert stop_daemon(proc) == 0
        proc = start_daemon(sock, tiny_dir, "--target", f"openai:http://127.0.0.1:{server['port']}/v1#{tiny_dir}",
                            "--remote-token-file", str(server["token_file"]))
        res = None
        for _ in range(3):  # the first try may meet the old daemon's closed connection
            try:
                res = await asyncio.wait_for(tl.inline(client, 8, 14), 60)
                break
            except Exception:
                await asyncio.sleep(0.3)
        assert res is not None and len(res.items) == 1
        assert client.statuses[-1]["state"] == "ready"
    finally:
        await tl.stop_lsp(client)
        stop_daemon(proc)
        if srv is not None:
            srv.shutdown()
