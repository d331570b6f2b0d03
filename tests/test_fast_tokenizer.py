"""models/tokenizer.py's FastTokenizer (the `tokenizers` library on the cached tokenizer.json, no
transformers) against transformers' AutoTokenizer on the same folder: the same backend pipeline,
special ids, vocabulary, and the same ids and text on many strings (code, unicode that NFC changes,
FIM and other special tokens written in the text, whitespace runs, CRLF), and core/prompt/__init__.py's
byte tables built from it equal to a byte-by-byte reference.

Folders: the tiny Qwen2 GGUF converted in a temporary cache, and the real qwen2.5-coder-0.5b's
runtime folder when the user's cache has it (skipped otherwise).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

import tiny
from tiny_gguf import write_qwen2_gguf
from completiond.core import prompt
from completiond.models.tokenizer import FastTokenizer, load_tokenizer, supported

REAL = Path(os.path.expanduser("~/.cache/completiond/runtime/qwen2.5-coder-0.5b"))

SAMPLES = [
    "", " ", "  ", "\n", "\r\n", "\t\t", "a", "def f(x):\n    return x\n", "x = 1  # é e\u0301 ﬁ ① Å Å",
    "   \n\n\t  \r\n  trailing   ", "中文字符 and 日本語のテキスト 🙂👍🏽 مرحبا",
    "<|fim_prefix|>def f(<|fim_suffix|>)\n<|fim_middle|>", "<|endoftext|><|im_start|>user\nhi<|im_end|>",
    "<|repo_name|>r\n<|file_sep|>a.py\nimport os\n", "<|fim_pad|>", "<|not_a_token|>", "<|fim_prefix",
    "I'm they'LL we'Ve it's", "12345678901234567890 3.14159e-10 0x1F", "\u00a0nbsp\u2003em\u200bzw",
    "caf\u00e9 vs cafe\u0301", "\x00\x01\x7f control", "a" * 300, " " * 37 + "x", "\u212b\u2126\ufb01",
]


def corpus() -> list[str]:
    """SAMPLES, and slices of real source files at random offsets (mid-line, mid-indent)."""
    rng = random.Random(5)
    texts = list(SAMPLES)
    for path in sorted(tiny.STDLIB.glob("*.py"))[:12]:
        src = path.read_text(errors="replace")
        for _ in range(4):
            a = rng.randrange(max(1, len(src) - 400))
            texts.append(src[a:a + rng.randrange(1, 400)])
    return texts


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cache")
    old = os.environ.get("COMPLETIOND_CACHE")
    os.environ["COMPLETIOND_CACHE"] = str(root)
    try:
        from completiond.models.loader import load

        gguf = write_qwen2_gguf(root / "tiny-qwen2.gguf", seed=3)
        load(str(gguf), "target", "cpu", "float32", "none")
    finally:
        if old is None:
            del os.environ["COMPLETIOND_CACHE"]
        else:
            os.environ["COMPLETIOND_CACHE"] = old
    (folder,) = [p for p in (root / "runtime").iterdir() if p.is_dir()]
    return folder


@pytest.fixture(scope="module", params=["tiny", "qwen2.5-coder-0.5b"])
def pair(request, tiny_folder):
    from transformers import AutoTokenizer

    folder = tiny_folder if request.param == "tiny" else REAL
    if not (folder / "tokenizer.json").exists():
        pytest.skip(f"no converted {request.param} in the user's cache")
    assert supported(folder)
    return FastTokenizer(folder), AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def test_the_same_pipeline_and_special_tokens(pair):
    fast, hf = pair
    # the backend transformers builds (its Qwen2Tokenizer adds an NFC normalizer the file lacks)
    assert json.loads(fast.backend_tokenizer.to_str()) == json.loads(hf.backend_tokenizer.to_str())
    for attr in ("unk_token_id", "bos_token_id", "eos_token_id", "pad_token_id", "all_special_ids",
                 "all_special_tokens", "chat_template"):
        assert getattr(fast, attr) == getattr(hf, attr), attr
    assert len(fast) == len(hf)
    assert {i: str(t) for i, t in fast.added_tokens_decoder.items()} == \
        {i: str(t) for i, t in hf.added_tokens_decoder.items()}
    ids = list(range(len(hf)))
    assert fast.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids)
    assert fast.convert_ids_to_tokens(ids, skip_special_tokens=True) == hf.convert_ids_to_tokens(ids, skip_special_tokens=True)
    assert fast.convert_ids_to_tokens(7) == hf.convert_ids_to_tokens(7)
    names = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|endoftext|>", "<|im_end|>",
             "<|file_sep|>", "<|repo_name|>", "no such token", "Ġreturn", "a"]
    assert fast.convert_tokens_to_ids(names) == hf.convert_tokens_to_ids(names)
    assert [fast.convert_tokens_to_ids(n) for n in names] == [hf.convert_tokens_to_ids(n) for n in names]


def test_the_same_ids_and_text(pair):
    fast, hf = pair
    rng = random.Random(7)
    for text in corpus():
        for special in (True, False):
            ids = fast.encode(text, add_special_tokens=special)
            assert ids == hf.encode(text, add_special_tokens=special), (text[:60], special)
        for skip in (False, True):
            assert fast.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False) == \
                hf.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)
        assert fast.decode(ids) == hf.decode(ids)
    specials = sorted(hf.added_tokens_decoder)
    for _ in range(200):  # any ids: byte pieces cut inside a character, special tokens among them
        ids = [rng.choice(specials) if rng.random() < 0.1 else rng.randrange(len(hf)) for _ in range(rng.randrange(1, 12))]
        for skip in (False, True):
            assert fast.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), ids
        assert fast.decode(ids[0]) == hf.decode(ids[0])


def test_prompt_byte_tables_match_a_byte_by_byte_reference(pair):
    fast, hf = pair

    def reference(tok):  # core/prompt/__init__.py's _vocab_bytes before it used str.translate
        special = set(tok.all_special_ids) | set(tok.added_tokens_decoder)
        out: dict = {}
        for i, piece in enumerate(tok.convert_ids_to_tokens(list(range(len(tok))))):
            if piece is None or i in special:
                continue
            try:
                b = bytes(prompt._BYTE_OF[c] for c in piece)
            except KeyError:
                return None
            if b:
                out.setdefault(b[0], []).append((i, b))
        return out

    assert prompt._vocab_bytes(fast) == reference(hf)
    assert prompt._vocab_bytes(fast) is not None
    assert prompt.after_indent(fast, "    ").allowed == prompt.after_indent(hf, "    ").allowed


def test_not_byte_level_vocabularies_are_still_told_apart():
    class Pieces:  # a SentencePiece-style vocabulary: "▁" is no byte-level character
        all_special_ids: list = []
        added_tokens_decoder: dict = {}

        def __len__(self):
            return 3

        def convert_ids_to_tokens(self, ids):
            return ["a", "▁b", "c"]

    class Spaces(Pieces):  # a plain space (byte-level BPE writes it as "Ġ") is no stand-in either
        def convert_ids_to_tokens(self, ids):
            return ["a", " b", "c"]

    assert prompt._vocab_bytes(Pieces()) is None
    assert prompt._vocab_bytes(Spaces()) is None


def test_other_tokenizer_classes_load_through_transformers(tmp_path, tiny_folder):
    import shutil

    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_folder / name, tmp_path / name)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert not supported(tmp_path)
    assert type(load_tokenizer(tmp_path)).__name__ != "FastTokenizer"


def test_what_it_does_not_implement_comes_from_transformers(pair):
    fast, hf = pair
    if not hf.chat_template:
        pytest.skip("no chat template")
    messages = [{"role": "user", "content": "rewrite this"}]
    assert fast.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert fast.model_max_length == hf.model_max_length  # any other attribute: the transformers tokenizer's


def test_prompt_tables_kept_between_starts_equal_built_ones(pair, tmp_path):
    """prepare_tokenizer saves the byte tables once and a later start reads them (no 152k-token
    loop); what it reads equals what it builds; a damaged file is built and written again."""
    from completiond.models.tokenizer import TableStore

    fast, hf = pair
    folder = Path(fast.folder)
    built = FastTokenizer(folder)
    built.prompt_tables = None  # no store: built from the vocabulary
    prompt.prepare_tokenizer(built)
    store = TableStore(tmp_path / "tables.marshal")
    first = FastTokenizer(folder)
    first.prompt_tables = store
    prompt.prepare_tokenizer(first)  # builds and saves
    assert store.path.exists()
    again = FastTokenizer(folder)
    again.prompt_tables = store
    read = store.load()
    assert read is not None

    def refuse(*a, **k):
        raise AssertionError("the tables were built, not read")

    again.convert_ids_to_tokens = refuse  # the 152k-token walk that builds them
    prompt.prepare_tokenizer(again)
    assert prompt._VOCAB[again] == read[0]
    assert prompt._VOCAB[again] == prompt._vocab_bytes(built)
    assert prompt.after_indent(again, "    ").allowed == prompt.after_indent(built, "    ").allowed
    assert prompt.after_indent(again, "\t").allowed == prompt.after_indent(built, "\t").allowed
    data = bytearray(store.path.read_bytes())
    data[100] ^= 1
    store.path.write_bytes(bytes(data))
    assert store.load() is None
    damaged = FastTokenizer(folder)
    damaged.prompt_tables = store
    prompt.prepare_tokenizer(damaged)
    assert prompt._VOCAB[damaged] == prompt._vocab_bytes(built) and store.load() is not None
    assert TableStore.of(folder) is not None and TableStore.of(tmp_path) is None  # no digests, no store
