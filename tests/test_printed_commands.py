"""Every command a message prints runs as printed: it parses with completiond's own parser, with
the flags that make it act on what the message was about (the socket, the corpus, the checkpoint)."""

import re
import shlex

import pytest

from completiond import cli
from completiond.flags import UsageError


def parses(command: str):
    argv = shlex.split(command)
    assert argv[0] == "completiond", command
    return cli.build_parser().parse_args(argv[1:])


def test_already_running_names_the_socket_to_stop(tmp_path, monkeypatch):
    from completiond.service.transport import stop_command

    monkeypatch.setenv("COMPLETIOND_SOCKET", str(tmp_path / "default.sock"))
    assert stop_command(tmp_path / "default.sock") == "completiond stop"
    other = tmp_path / "with space" / "d.sock"
    a = parses(stop_command(other))
    assert a.command == "stop" and a.socket == str(other)


@pytest.mark.parametrize("argv", [
    ["train-draft", "train", "--corpus", "{tmp}/no-corpus"],
    ["train-draft", "export", "--ckpt", "{tmp}/run/checkpoint.pt", "--corpus", "{tmp}/no-corpus"],
])
def test_train_draft_hints_act_on_the_paths_given(tmp_path, argv, capsys):
    code = cli.main([x.format(tmp=tmp_path) for x in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    command = re.search(r"run `([^`]+)` first", err).group(1)
    a = parses(command)
    if argv[1] == "export":
        assert a.step == "train" and a.out == str(tmp_path / "run")
    else:
        assert a.step == "label" and a.out == str(tmp_path / "no-corpus")
