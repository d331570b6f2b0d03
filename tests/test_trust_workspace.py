"""Issue 38 item 3: a .gitignore that blocks on read (a FIFO), or points outside the root, cannot hang
or steer the daemon.

Every file the workspace code reads is a regular file inside its root, size-capped, never a FIFO,
device or socket; one root's problem does not stall another client's.
"""

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest

import tiny
from completiond.core.speculation.index import TokenIndex
from completiond.service.client import Client
from completiond.service.workspace import Ignore, index_workspace, read_text_file
from daemon_util import start_daemon, stop_daemon

FIFOS: list[Path] = []


def fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    FIFOS.append(path)
    return path


@pytest.fixture(autouse=True, scope="module")
def release_fifos():
    """After the tests: a reader still blocked on one of our FIFOs (the old code) gets its EOF."""
    yield
    for p in FIFOS:
        try:
            os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # nobody reading it
            pass


def tree(root: Path, gitignore_fifo: str | None = None) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "main.py").write_text("def zqv_main_marker():\n    return 1\n")
    (root / "pkg" / "mod.py").write_text("def zqv_mod_marker():\n    return 2\n")
    if gitignore_fifo is not None:
        fifo(root / gitignore_fifo / ".gitignore")
    return root


@pytest.fixture(scope="module")
def fifo_daemon(tmp_path_factory, tiny_dir):
    """`serve --workspace` on a root whose .gitignore is a FIFO: it must bind and load."""
    tmp = tmp_path_factory.mktemp("fifo")
    root = tree(tmp / "owner-root", gitignore_fifo=".")
    proc = start_daemon(tmp / "d.sock", tiny_dir, "--workspace", str(root))
    yield {"sock": tmp / "d.sock", "root": root}
    assert stop_daemon(proc) == 0


async def files_indexed(sock: Path, root: Path, want: int, timeout: float = 60.0) -> dict:
    c = await Client.connect(sock)
    try:
        await c.request("initialize", {"protocol": 1}, timeout=30)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = (await c.request("status", {}, timeout=30))["workspace"].get(str(root.resolve()))
            if st and st["files"] >= want:
                return st
            await asyncio.sleep(0.2)
        raise TimeoutError(f"{root} not indexed: {st}")
    finally:
        await c.close()


async def test_serve_binds_and_indexes_with_a_fifo_gitignore_at_its_workspace_root(fifo_daemon):
    await files_indexed(fifo_daemon["sock"], fifo_daemon["root"], 2)


async def test_a_fifo_gitignore_in_a_subfolder_does_not_stop_other_roots_being_indexed(fifo_daemon, tmp_path):
    bad, good = tree(tmp_path / "bad", gitignore_fifo="pkg"), tree(tmp_path / "good")
    c = await Client.connect(fifo_daemon["sock"])
    await c.request("initialize", {"protocol": 1, "workspace_roots": [str(bad)]}, timeout=30)
    await asyncio.sleep(1.0)  # the walk of `bad` has reached pkg/.gitignore
    other = await Client.connect(fifo_daemon["sock"])
    await other.request("initialize", {"protocol": 1, "workspace_roots": [str(good)]}, timeout=30)
    await files_indexed(fifo_daemon["sock"], good, 2)
    await files_indexed(fifo_daemon["sock"], bad, 2)  # the FIFO's own root too, the FIFO left out
    await c.close()
    await other.close()


async def test_initialize_with_a_root_whose_gitignore_is_a_fifo_answers(fifo_daemon, tmp_path):
    root = tree(tmp_path / "r", gitignore_fifo=".")
    c = await Client.connect(fifo_daemon["sock"])
    info = await c.request("initialize", {"protocol": 1, "workspace_roots": [str(root)]}, timeout=30)
    assert info["ignored_roots"] == []
    await files_indexed(fifo_daemon["sock"], root, 2)
    await c.close()


@pytest.mark.parametrize("where", [".", "pkg"])
def test_a_gitignore_symlink_to_outside_the_root_is_not_followed(tmp_path, where):
    outside = tmp_path / "outside-rules"
    outside.write_text("*.py\n")
    root = tree(tmp_path / "root")
    (root / where / ".gitignore").symlink_to(outside)
    ids = TokenIndex()
    assert index_workspace(ids, tiny.qwen_tokenizer(), root) == 2  # both .py files: the rules were not read


def test_a_gitignore_symlink_inside_the_root_still_counts(tmp_path):
    root = tree(tmp_path / "root")
    (root / "rules").write_text("pkg/\nrules\n")
    (root / ".gitignore").symlink_to(root / "rules")
    assert index_workspace(TokenIndex(), tiny.qwen_tokenizer(), root) == 1  # main.py: pkg/ and rules ignored


def test_reads_never_block_and_are_capped(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    done = threading.Event()

    def read() -> None:
        Ignore(root)  # a FIFO .gitignore at the root
        assert read_text_file(root / ".gitignore") is None
        done.set()

    fifo(root / ".gitignore")
    threading.Thread(target=read, daemon=True).start()
    assert done.wait(10), "reading a FIFO .gitignore blocked"
    big = root / "big.gitignore"
    big.write_text("x\n" * 600_000)  # over the cap: not read
    ig = Ignore(root)
    ig.load(big)
    assert root not in ig.specs
    (root / "sub").mkdir()
    (root / "sub" / "s.py").write_text("y = 2\n")
    link = root / "link.py"
    link.symlink_to(tmp_path / "secret.py")
    (tmp_path / "secret.py").write_text("zqv = 'secret'\n")
    assert read_text_file(root / "sub" / "s.py", root=root) == "y = 2\n"
    assert read_text_file(link, root=root) is None  # a symlink to outside the root
