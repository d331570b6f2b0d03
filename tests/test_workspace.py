"""Workspace watcher: excluded trees get no watches and no indexing; a root over its caps says so."""

import time
from pathlib import Path

import pytest

import tiny
from completiond.core.speculation.index import TokenIndex
from completiond.service.workspace import WorkspaceWatcher, index_workspace, iter_files


@pytest.fixture(scope="module")
def tok():
    return tiny.qwen_tokenizer()


def settle(w: WorkspaceWatcher, timeout: float = 20.0) -> None:
    """Wait until the watcher has taken every event so far (events need a moment to arrive)."""
    deadline = time.time() + timeout
    time.sleep(0.3)
    while time.time() < deadline:
        if w.idle:
            return
        time.sleep(0.05)
    raise TimeoutError("watcher did not settle")


def wait_for(cond, timeout: float = 20.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise TimeoutError("condition not met")


def write(path: Path, text: str = "x = 1\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def make_tree(root: Path) -> None:
    write(root / "main.py")
    write(root / "src" / "pkg" / "mod.py")
    write(root / ".gitignore", "out/\n")
    write(root / "out" / "gen.py")  # gitignored directory
    write(root / "myenv" / "pyvenv.cfg", "home = /usr/bin\n")  # a virtualenv by its marker, not its name
    write(root / "myenv" / "lib" / "site.py")
    write(root / "node_modules" / "dep" / "index.js")
    write(root / ".git" / "HEAD", "ref: refs/heads/main\n")
    write(root / "src" / "__pycache__" / "mod.pyc", "junk")
    write(root / "dist" / "pkg.py")


def watched_paths(w: WorkspaceWatcher) -> set[Path]:
    """What the observer really watches: one emitter per scheduled watch."""
    return {Path(e.watch.path) for e in w.observer.emitters}


@pytest.fixture
def watcher(tok):
    made = []

    def make(**kw) -> WorkspaceWatcher:
        w = WorkspaceWatcher(TokenIndex(), tok, debounce_s=0.05, **kw)
        made.append(w)
        return w

    yield make
    for w in made:
        w.stop()


def test_excluded_trees_get_no_watches_and_no_index(tmp_path, watcher):
    make_tree(tmp_path)
    w = watcher()
    w.add_root(tmp_path)
    settle(w)
    root = tmp_path.resolve()
    included = {root, root / "src", root / "src" / "pkg"}
    assert watched_paths(w) == included
    assert set(w.watched[root]) == included
    assert set(w.index.files) == {str(root / n) for n in (".gitignore", "main.py", "src/pkg/mod.py")}
    assert w.capped == {}
    st = w.status()[str(root)]
    assert st["files"] == 3 and st["watched_dirs"] == 3 and st["capped"] is None


def test_new_directories_follow_the_rules(tmp_path, watcher):
    make_tree(tmp_path)
    w = watcher()
    w.add_root(tmp_path)
    settle(w)
    root = tmp_path.resolve()
    new = write(root / "src" / "new" / "fresh.py")
    write(root / "node_modules" / "later" / "x.js")  # not watched: no event may reach us from here
    write(root / "build" / "tmp" / "b.py")
    wait_for(lambda: str(new) in w.index.files)
    settle(w)
    assert root / "src" / "new" in watched_paths(w)
    assert not any("node_modules" in p.parts or "build" in p.parts for p in watched_paths(w))
    assert not any("node_modules" in f or "/build/" in f for f in w.index.files)

    # a directory that becomes a virtualenv after it was watched (python -m venv writes pyvenv.cfg late)
    tool = write(root / "tools" / "t.py")
    wait_for(lambda: str(tool) in w.index.files)
    write(root / "tools" / "pyvenv.cfg", "home = /usr/bin\n")
    wait_for(lambda: str(tool) not in w.index.files)
    settle(w)
    assert root / "tools" not in watched_paths(w)

    # a newly gitignored directory loses its watch and its files
    write(root / ".gitignore", "out/\nsrc/new/\n")
    wait_for(lambda: str(new) not in w.index.files)
    settle(w)
    assert root / "src" / "new" not in watched_paths(w)


def test_root_over_file_cap_indexes_up_to_it_and_says_so(tmp_path, watcher):
    for i in range(5):
        write(tmp_path / f"f{i}.py", f"v{i} = {i}\n")
    w = watcher(max_files=3)
    w.add_root(tmp_path)
    settle(w)
    root = tmp_path.resolve()
    assert set(w.index.files) == {str(root / f"f{i}.py") for i in range(3)}  # the walk's first three
    assert "2 files not indexed" in w.capped[root]
    assert w.status()[str(root)]["capped"] == w.capped[root]

    extra = write(root / "g.py")  # a file created later does not slip past the cap
    wait_for(lambda: "3 files not indexed" in w.capped.get(root, ""))
    assert str(extra) not in w.index.files and len(w.index.files) == 3


def test_root_over_byte_cap(tmp_path, watcher):
    for i in range(4):
        write(tmp_path / f"f{i}.py", "x" * 39 + "\n")  # 40 bytes each
    w = watcher(max_bytes=100)
    w.add_root(tmp_path)
    settle(w)
    root = tmp_path.resolve()
    assert len(w.index.files) == 2 and w.status()[str(root)]["bytes"] == 80
    assert "2 files not indexed" in w.capped[root] and "100 bytes" in w.capped[root]


def test_root_over_directory_cap(tmp_path, watcher):
    for name in "abcd":
        write(tmp_path / name / "m.py")
    w = watcher(max_dirs=3)
    w.add_root(tmp_path)
    settle(w)
    root = tmp_path.resolve()
    assert watched_paths(w) == {root, root / "a", root / "b"}
    assert set(w.index.files) == {str(root / "a" / "m.py"), str(root / "b" / "m.py")}
    assert "directories past the first 3" in w.capped[root]


def test_one_shot_walk_skips_the_same_trees(tmp_path, tok):
    make_tree(tmp_path)
    files = {p.relative_to(tmp_path).as_posix() for p in iter_files(tmp_path)}
    assert files == {".gitignore", "main.py", "src/pkg/mod.py"}
    index = TokenIndex()
    assert index_workspace(index, tok, tmp_path, max_files=2) == 2


def test_moved_and_deleted_directories(tmp_path, watcher):
    make_tree(tmp_path)
    w = watcher()
    w.add_root(tmp_path)
    settle(w)
    root = tmp_path.resolve()
    (root / "src" / "pkg").rename(root / "src" / "lib")
    moved = str(root / "src" / "lib" / "mod.py")
    wait_for(lambda: moved in w.index.files)
    settle(w)
    assert str(root / "src" / "pkg" / "mod.py") not in w.index.files
    assert root / "src" / "lib" in watched_paths(w) and root / "src" / "pkg" not in watched_paths(w)
    import shutil

    shutil.rmtree(root / "src")
    wait_for(lambda: moved not in w.index.files)
    settle(w)
    assert watched_paths(w) == {root}
    assert set(w.index.files) == {str(root / ".gitignore"), str(root / "main.py")}
