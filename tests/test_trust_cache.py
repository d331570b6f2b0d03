"""Issue 38 item 1: the cache runs no one else's code.

A shared library whose constructor writes a marker file, planted at the kernel's cache path, must
never be loaded (completion still works, on a rebuilt kernel); the cache root is created 0700 and
refused (one line, exit 2) when another user owns it or group/others can write it; a library that
loads but lacks a symbol falls back to torch's kernel with one warning line.
"""

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from completiond.models.kernels import cpu_kernel

needs_kernel = pytest.mark.skipif(not cpu_kernel.wanted() or not shutil.which("gcc"),
                                  reason="no x86 CPU with AVX2 + FMA, or no gcc, here")
SOURCE = "def area(width, height):\n    return width * height\n\n\ndef perimeter(width, height):\n    "


def planted_library(tmp: Path, marker: Path, symbols: bool = False) -> Path:
    """A shared library whose constructor writes `marker` (symbols: also every name the kernel binds)."""
    body = f'#include <stdio.h>\n__attribute__((constructor)) static void planted(void) {{\n' \
           f'  FILE *f = fopen("{marker}", "w"); if (f) {{ fputs("ran", f); fclose(f); }}\n}}\n'
    if symbols:  # loads and binds like the real kernel, does nothing
        body += "void completiond_int8_mm(void) {}\n"
    src, so = tmp / "planted.c", tmp / "planted.so"
    src.write_text(body)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True, capture_output=True)
    return so


@pytest.fixture(scope="module")
def kernel_name(tmp_path_factory) -> str:
    """The file name build() gives the kernel on this machine (sources, flags and compiler)."""
    return cpu_kernel.build(tmp_path_factory.mktemp("kernel")).name


def complete(cache: Path, tiny_dir: Path, tmp: Path, **env: str) -> subprocess.CompletedProcess:
    src = tmp / "shapes.py"
    src.write_text(SOURCE)
    cmd = [sys.executable, "-m", "completiond", "complete", str(src), "--line", "6", "--col", "5", "--mode", "ar",
           "--target", str(tiny_dir), "--draft", "none", "--dtype", "float32", "--quant", "int8",
           "--max-tokens", "4", "--json"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COMPLETIOND_CACHE": str(cache), "COMPLETIOND_INT8_KERNEL": "completiond",
                               **env})


@needs_kernel
def test_a_library_planted_at_the_kernel_path_never_runs(tmp_path, tiny_dir, kernel_name):
    marker = tmp_path / "marker"
    cache = tmp_path / "cache"
    (cache / "kernels").mkdir(parents=True, mode=0o700)
    os.chmod(cache, 0o700)
    planted = cache / "kernels" / kernel_name
    shutil.copy(planted_library(tmp_path, marker), planted)
    res = complete(cache, tiny_dir, tmp_path)
    assert not marker.exists(), "the planted library's constructor ran"
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert '"int8_kernel": "completiond' in res.stdout  # completion ran on a kernel built here instead
    assert "rebuilding" in res.stderr and planted.read_bytes() != (tmp_path / "planted.so").read_bytes()
    # the rebuilt library is reused by the next run, without a rebuild or a warning
    again = complete(cache, tiny_dir, tmp_path)
    assert again.returncode == 0 and "rebuilding" not in again.stderr, again.stderr


@needs_kernel
def test_a_planted_library_with_a_copied_digest_file_never_runs(tmp_path, tiny_dir, kernel_name):
    """A library and its digest file copied in from another cache: the digest names another file."""
    marker = tmp_path / "marker"
    other, cache = tmp_path / "other", tmp_path / "cache"
    other.mkdir(mode=0o700)
    (cache / "kernels").mkdir(parents=True, mode=0o700)
    os.chmod(cache, 0o700)
    built = cpu_kernel.build(other)  # a genuine build with its digest file ...
    shutil.copy(planted_library(tmp_path, marker), built)  # ... then its library swapped
    shutil.copy(built, cache / "kernels" / kernel_name)
    shutil.copy(str(built) + ".sha256", cache / "kernels" / (kernel_name + ".sha256"))
    res = complete(cache, tiny_dir, tmp_path)
    assert not marker.exists() and res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert cpu_kernel.build(other) == built and not marker.exists()  # rebuilt in place, not loaded
    assert (tmp_path / "planted.so").read_bytes() != built.read_bytes()


@needs_kernel
def test_a_library_without_the_kernels_symbols_falls_back_to_torch(tmp_path, kernel_name):
    """A library build() vouches for that is not the kernel (an older build, a bad compiler): one warning
    line, torch's kernel, no traceback."""
    marker = tmp_path / "marker"
    folder = tmp_path / "kernels"
    folder.mkdir(mode=0o700)
    so = folder / kernel_name
    shutil.copy(planted_library(tmp_path, marker, symbols=True), so)
    code = ("import sys; from pathlib import Path; from completiond.models.kernels import cpu_kernel\n"
            "cpu_kernel.build = lambda out_dir=None: Path(sys.argv[1])\n"
            "print(cpu_kernel.library(), cpu_kernel.name())")
    res = subprocess.run([sys.executable, "-c", code, str(so)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COMPLETIOND_INT8_KERNEL": "completiond"})
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert res.stdout.split() == ["None", "torch"]
    assert len(res.stderr.strip().splitlines()) == 1 and "using torch's" in res.stderr, res.stderr


def test_the_cache_root_is_created_private(tmp_path, tiny_dir):
    cache = tmp_path / "new" / "cache"
    res = complete(cache, tiny_dir, tmp_path, COMPLETIOND_INT8_KERNEL="torch")
    assert res.returncode == 0, res.stderr
    for d in [cache, *(p for p in cache.iterdir() if p.is_dir())]:
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_a_cache_others_can_write_is_refused(tmp_path, tiny_dir, mode):
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chmod(cache, mode)
    res = complete(cache, tiny_dir, tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "writable by group or others" in res.stderr


def test_a_cache_subfolder_others_can_write_is_refused(tmp_path, tiny_dir):
    cache = tmp_path / "cache"
    (cache / "kernels").mkdir(parents=True)
    os.chmod(cache, 0o700)
    os.chmod(cache / "kernels", 0o777)
    res = complete(cache, tiny_dir, tmp_path)
    assert res.returncode == 2 and "kernels" in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user needs root")
def test_a_cache_of_another_user_is_refused(tmp_path, tiny_dir):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    os.chown(cache, 65534, 65534)
    res = complete(cache, tiny_dir, tmp_path)
    assert res.returncode == 2 and "another user" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user needs root")
def test_serve_refuses_a_cache_of_another_user_before_binding(tmp_path, tiny_dir):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    os.chown(cache, 65534, 65534)
    cmd = [sys.executable, "-m", "completiond", "serve", "--socket", str(tmp_path / "d.sock"), "--target",
           str(tiny_dir)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COMPLETIOND_CACHE": str(cache)})
    assert res.returncode == 2 and "another user" in res.stderr and not (tmp_path / "d.sock").exists()
