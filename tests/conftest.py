import os
import sys
from pathlib import Path

# The suite's real-model texts and quantization tolerances were set with int16 activations (this
# project's machines cache int16 or float32). A fresh AVX512-VNNI machine's probe may pick int8,
# which changes ~1 % of greedy tokens (docs/kernels.md): pin the kind so every machine tests the
# same model. int8 itself is tested where it is asked for (test_native_layer, test_lossless_quant,
# test_cpu_kernel), and a user's own setting still wins.
os.environ.setdefault("COMPLETIOND_INT8_ACTIVATIONS", "int16")

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import tiny  # noqa: E402


@pytest.fixture(scope="session")
def code_ids() -> list[int]:
    """Token ids of a real source file under the tiny tokenizer."""
    return tiny.tokenizer().encode((tiny.STDLIB / "textwrap.py").read_text())


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """A saved tiny Gemma-3-style model + tokenizer directory (what --target DIR loads)."""
    return tiny.save(tmp_path_factory.mktemp("tiny-target"), tiny.gemma_config(window=16), seed=1, scale=4.0)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, tiny_dir):
    """A real `completiond serve` on the tiny model, one per test module (a module may define its own)."""
    from daemon_util import start_daemon, stop_daemon

    sock = tmp_path_factory.mktemp("run") / "d.sock"
    proc = start_daemon(sock, tiny_dir)
    yield sock
    assert stop_daemon(proc) == 0


@pytest.fixture(scope="session", autouse=True)
def private_default_socket(tmp_path_factory):
    """`completiond complete` asks a running daemon at the default socket when there is one: the
    tests' default socket is a folder of their own, so a user's daemon never answers for them."""
    import os

    if "COMPLETIOND_SOCKET" in os.environ:
        yield
        return
    os.environ["COMPLETIOND_SOCKET"] = str(tmp_path_factory.mktemp("default-run") / "daemon.sock")
    yield
    os.environ.pop("COMPLETIOND_SOCKET", None)
