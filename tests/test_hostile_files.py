"""Hostile files around the daemon: token files that are FIFOs, too open, too big or links (both
--token-file and --remote-token-file: one rule, one clear line, never a hang); `setup neovim` on a
symlink loop or a file as --pack-dir; `setup vscode` with a stale .vsix; a workspace whose first
file is huge; the GGUF `.verified` stamp written atomically."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tiny
from completiond.files import read_secret, write_atomic
from completiond.flags import UsageError
from test_http import free_port

ROOT = Path(__file__).resolve().parents[1]


def serve(tmp: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "completiond", "serve", "--socket", str(tmp / "d.sock"), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def one_line_error(done: subprocess.CompletedProcess, words: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert words in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().count("\n") == 0, done.stderr


def private(path: Path, text: str = "s3cret\n", mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


# ---- token files ---------------------------------------------------------------------------------
def test_a_fifo_token_file_is_refused_at_once(tmp_path, tiny_dir):
    fifo = tmp_path / "token"
    os.mkfifo(fifo, 0o600)
    t0 = time.monotonic()
    done = serve(tmp_path, "--target", str(tiny_dir), "--http", f"127.0.0.1:{free_port()}", "--token-file", str(fifo))
    one_line_error(done, "not a regular file")
    assert time.monotonic() - t0 < 50  # the old open() waited for a writer forever


def test_a_fifo_remote_token_file_is_refused_at_once(tmp_path, tiny_dir):
    fifo = tmp_path / "remote-token"
    os.mkfifo(fifo, 0o600)
    done = serve(tmp_path, "--target", f"openai:http://127.0.0.1:{free_port()}/v1#{tiny_dir}",
                 "--remote-token-file", str(fifo))
    one_line_error(done, "not a regular file")


@pytest.mark.parametrize("flag", ["--token-file", "--remote-token-file"])
def test_both_token_flags_have_the_same_mode_rule(tmp_path, tiny_dir, flag):
    open_file = private(tmp_path / "token", mode=0o644)
    target = (["--target", str(tiny_dir), "--http", f"127.0.0.1:{free_port()}"] if flag == "--token-file"
              else ["--target", f"openai:http://127.0.0.1:{free_port()}/v1#{tiny_dir}"])
    one_line_error(serve(tmp_path, *target, flag, str(open_file)), "chmod 600")


def test_read_secret_rules(tmp_path):
    assert read_secret(private(tmp_path / "ok"), "token file") == "s3cret"
    with pytest.raises(FileNotFoundError):
        read_secret(tmp_path / "missing", "token file")
    cases = {"big": (private(tmp_path / "big", "x" * 5000), "at most 4096"),
             "empty": (private(tmp_path / "empty", " \n"), "is empty"),
             "binary": (tmp_path / "bin", "not UTF-8"),
             "open": (private(tmp_path / "open", mode=0o640), "chmod 600"),
             "dir": (tmp_path / "dir", "not a regular file"),
             "link": (tmp_path / "link", "regular file of ours")}
    (tmp_path / "bin").write_bytes(b"\xff\xfe")
    (tmp_path / "bin").chmod(0o600)
    (tmp_path / "dir").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "ok")
    for name, (path, words) in cases.items():
        with pytest.raises(ValueError) as e:
            read_secret(path, "token file")
        assert words in str(e.value) and str(path) in str(e.value), (name, e.value)


# ---- setup ---------------------------------------------------------------------------------------
def setup(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "completiond", "setup", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, **(env or {})})


def test_setup_neovim_on_a_symlink_loop_or_a_file_is_one_line(tmp_path):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    one_line_error(setup("neovim", "--pack-dir", str(tmp_path / "loop")), "symbolic links")
    (tmp_path / "file").write_text("not a folder")
    one_line_error(setup("neovim", "--pack-dir", str(tmp_path / "file")), "is not a directory")
    (tmp_path / "a").mkdir()  # the default pack path under a data dir that loops
    (tmp_path / "a" / "nvim").symlink_to(tmp_path / "a" / "nvim")
    one_line_error(setup("neovim", env={"XDG_DATA_HOME": str(tmp_path / "a")}), "symbolic links")


def test_setup_vscode_does_not_install_a_stale_vsix(tmp_path, monkeypatch):
    from completiond import setup_cli

    editors = tmp_path / "editors"
    (editors / "vscode").mkdir(parents=True)
    stale = editors / "vscode" / "completiond.vsix"
    stale.write_bytes(b"PK old build")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("npm", "code"):  # a build that succeeds and writes nothing; a `code` that records installs
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / (name + '.log')}\nexit 0\n")
        script.chmod(0o755)
    monkeypatch.setattr(setup_cli, "EDITORS", editors)
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(UsageError) as e:
        setup_cli.cmd_vscode(argparse.Namespace(code="code", no_install=False))
    assert "did not write" in str(e.value)
    assert not (tmp_path / "code.log").exists()  # nothing was installed


# ---- the CLI indexer -----------------------------------------------------------------------------
def test_workspace_index_skips_a_huge_first_file(tmp_path):
    from completiond.core.speculation.index import TokenIndex
    from completiond.service.workspace import index_workspace

    with open(tmp_path / "a_huge.py", "wb") as f:  # sparse: 2 GB of size, no disk
        f.truncate(2 * 1024**3)
    (tmp_path / "b.py").write_text("def area(r):\n    return 3.14 * r * r\n")
    (tmp_path / "c.py").write_text("import os\nprint(os.getcwd())\n")
    index = TokenIndex()
    assert index_workspace(index, tiny.tokenizer(), tmp_path) == 2
    assert index.n_files == 2


# ---- cache stamps --------------------------------------------------------------------------------
def test_verified_stamp_is_replaced_not_written_in_place(tmp_path):
    from completiond.models.catalog import _verified, _write_stamp

    out = tmp_path / "m.gguf"
    out.write_bytes(b"GGUF" + b"\0" * 100)
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    stamp = tmp_path / "m.verified"
    stamp.symlink_to(victim)  # a link (or a hard link, or a reader mid-read) must not see a half-written stamp
    _write_stamp(out, stamp, "ab" * 32)
    assert victim.read_text() == "keep me\n"
    assert not stamp.is_symlink() and _verified(out, stamp, "ab" * 32)
    before = stamp.stat().st_ino
    _write_stamp(out, stamp, "cd" * 32)
    assert stamp.stat().st_ino != before and _verified(out, stamp, "cd" * 32)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_write_atomic_leaves_no_temp_file_on_failure(tmp_path):
    target = tmp_path / "sub"
    target.mkdir()
    with pytest.raises(OSError):
        write_atomic(target, "x")  # a directory cannot be replaced by a file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sub"]
