import sys
from pathlib import Path

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
