"""The VS Code extension builds from its lock file, its unit tests pass, and it packages to a .vsix.

(The real-editor test, code-server + headless Chromium, is `bash editors/vscode/test/e2e.sh`.)
"""

import shutil
import subprocess
from pathlib import Path

import pytest

EXT = Path(__file__).parent.parent / "editors" / "vscode"


def npm(*args, timeout=600):
    return subprocess.run(["npm", *args], cwd=EXT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def built():
    if shutil.which("npm") is None:
        pytest.fail("npm is needed for the VS Code extension (Node 20)")
    done = npm("ci", "--no-audit", "--no-fund")
    assert done.returncode == 0, done.stderr[-3000:]
    done = npm("run", "compile")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return EXT


def test_unit_tests_pass(built):
    done = npm("test")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "# fail 0" in done.stdout


def test_packages_to_vsix(built, tmp_path):
    done = npm("run", "package")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    vsix = EXT / "completiond.vsix"
    assert vsix.stat().st_size > 10_000
    import zipfile
    names = zipfile.ZipFile(vsix).namelist()
    assert "extension/package.json" in names and "extension/dist/extension.js" in names
