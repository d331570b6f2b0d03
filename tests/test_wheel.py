"""A built wheel installs into a fresh venv, carries the draft weights, and its `completiond-lsp` answers
an LSP `initialize` over stdio (autostart off, so no daemon or model is needed)."""

import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import threading
import venv
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("build", reason="`build` is not installed (pip install -e '.[test]')")

REPO = Path(__file__).resolve().parents[1]
SOURCES = ["pyproject.toml", "README.md", "completiond", "lsp"]
WEIGHTS = ["config.json", "model.safetensors", "vocab_map.json", "MODEL_CARD.md"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the sources: setuptools writes build/ and *.egg-info next to pyproject.toml."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        p = REPO / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(p, src / name)
    # --no-isolation: build with the setuptools already installed, no index needed (else build fetches it)
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-isolation"]
    done = subprocess.run([sys.executable, "-m", "build", "--wheel", *isolation, "--outdir", str(tmp / "dist"),
                           str(src)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (whl,) = (tmp / "dist").glob("completiond-*.whl")
    return whl


def test_wheel_carries_package_data_and_entry_points(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for w in WEIGHTS:
        assert f"completiond/draft/weights/{w}" in names
    assert "completiond_lsp/server.py" in names and "completiond/cli.py" in names
    from completiond.models.kernels import cpu_kernel
    for src in cpu_kernel.SOURCES + cpu_kernel.HEADERS:  # the int8 kernel's sources, compiled on first use
        assert f"completiond/models/kernels/{src.name}" in names, src.name
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry).decode()
    assert "completiond-lsp = completiond_lsp.server:main" in text and "completiond = completiond.cli:main" in text


def frame(msg: dict) -> bytes:
    body = json.dumps(msg).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def read_message(stream) -> dict:
    length = None
    while True:
        line = stream.readline()
        if not line:
            raise EOFError("completiond-lsp closed stdout")
        if line in (b"\r\n", b"\n"):
            break
        key, _, value = line.decode().partition(":")
        if key.lower() == "content-length":
            length = int(value)
    return json.loads(stream.read(length))


def read_response(stream, id_: int) -> dict:
    while True:  # skip notifications (window/logMessage ...) until our answer
        msg = read_message(stream)
        if msg.get("id") == id_ and "method" not in msg:
            return msg


def running_site_packages() -> list[str]:
    """Where the interpreter running the tests finds its packages: a venv's own site-packages inside
    a venv, the system's otherwise (a venv's "system site packages" would be the base interpreter's,
    which inside a user's venv has none of lsprotocol, torch, ...)."""
    paths = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]
    return list(dict.fromkeys(p for p in paths if Path(p).is_dir()))


def see_running_packages(py: Path) -> None:
    """The new venv sees the running environment's packages after its own (a .pth file of their
    folders), so torch and the rest come from there and the wheel from the venv itself. A .pth line
    adds a folder without running that folder's own .pth files: the checkout's editable install
    stays out of the venv."""
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "completiond-test-running-env.pth").write_text("\n".join(running_site_packages()) + "\n")


def test_venv_for_the_wheel_sees_the_running_environment(tmp_path):
    """The packages the installed wheel needs resolve in the new venv from the environment running the
    tests (a venv or the system interpreter), not from the base interpreter's site-packages."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    see_running_packages(py)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = "import lsprotocol, pygls, msgpack, torch; print(lsprotocol.__file__); print(torch.__file__)"
    done = subprocess.run([str(py), "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    running = running_site_packages()
    assert all(any(line.startswith(p) for p in running) for line in done.stdout.split()), (done.stdout, running)


def test_installed_wheel_lsp_answers_initialize(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    see_running_packages(py)
    done = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall",
                           "--disable-pip-version-check", "-q", str(wheel)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    env = {**os.environ, "COMPLETIOND_CACHE": str(tmp_path / "cache"), "PYTHONNOUSERSITE": "1"}
    env.pop("PYTHONPATH", None)
    where = subprocess.run([str(py), "-c", "import completiond, completiond_lsp; print(completiond.__file__); "
                            "print(completiond_lsp.__file__)"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert where.returncode == 0, where.stderr
    assert all(line.startswith(str(env_dir)) for line in where.stdout.split()), where.stdout  # not the checkout
    assert (env_dir / "bin" / "completiond").exists()

    proc = subprocess.Popen([str(env_dir / "bin" / "completiond-lsp")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path, env=env)
    killer = threading.Timer(120, proc.kill)  # a hung server fails the test instead of hanging it
    killer.start()
    try:
        proc.stdin.write(frame({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "processId": os.getpid(), "rootUri": tmp_path.as_uri(), "capabilities": {},
            "initializationOptions": {"autostart": False, "socket": str(tmp_path / "no-daemon.sock")}}}))
        proc.stdin.flush()
        init = read_response(proc.stdout, 1)
        assert "inlineCompletionProvider" in init["result"]["capabilities"], init
        assert init["result"]["serverInfo"]["name"] == "completiond-lsp", init
        proc.stdin.write(frame({"jsonrpc": "2.0", "method": "initialized", "params": {}}))
        proc.stdin.write(frame({"jsonrpc": "2.0", "id": 2, "method": "shutdown", "params": None}))
        proc.stdin.flush()
        assert "error" not in read_response(proc.stdout, 2)
        proc.stdin.write(frame({"jsonrpc": "2.0", "method": "exit", "params": None}))
        proc.stdin.flush()
        assert proc.wait(timeout=60) == 0, proc.stderr.read().decode()[-2000:]
    finally:
        killer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
