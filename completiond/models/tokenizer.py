"""The tokenizer of a converted model, built by the `tokenizers` library straight from the cached
tokenizer.json: ~0.4 CPU-s instead of ~1.8 s for transformers' AutoTokenizer (which rebuilds
Qwen2's BPE from the vocabulary and merges in Python) plus ~2 s of importing transformers.

`FastTokenizer` exposes what completiond reads of a transformers tokenizer (encode, decode,
convert_tokens_to_ids / convert_ids_to_tokens, len, the special token ids, added_tokens_decoder,
chat_template) with transformers' semantics for the tokenizer classes in `SUPPORTED`; anything else
(apply_chat_template, rarely used attributes) is answered by the transformers tokenizer, built on
first use. tests/test_fast_tokenizer.py holds both to the same backend pipeline and the same ids.
"""

from __future__ import annotations

import hashlib
import json
import marshal
import os
import threading
from pathlib import Path
from typing import Any

from ..paths import cache_root

# tokenizer_class -> (its default special tokens when tokenizer_config.json leaves them out, and
# the normalizer transformers' class installs over the file's). Only classes checked against
# AutoTokenizer by the tests belong here; others load through transformers.
SUPPORTED: dict[str, dict[str, Any]] = {
    "Qwen2Tokenizer": {"defaults": {"unk_token": "<|endoftext|>", "bos_token": None, "eos_token": "<|endoftext|>",
                                    "pad_token": "<|endoftext|>"},
                       "normalizer": "NFC"},
}
# transformers' SPECIAL_TOKENS_ATTRIBUTES, in its order (all_special_ids follows it)
SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def supported(folder: Path) -> bool:
    """Whether `folder`'s tokenizer can load without transformers (a known class, a tokenizer.json)."""
    try:
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return cfg.get("tokenizer_class") in SUPPORTED and (folder / "tokenizer.json").is_file()


def _content(tok: Any) -> str | None:
    if isinstance(tok, dict):  # an AddedToken as tokenizer_config.json writes it
        return tok.get("content")
    return tok


class FastTokenizer:
    """A transformers-compatible view of a `tokenizers.Tokenizer` (see the module docstring)."""

    def __init__(self, folder: Path):
        from tokenizers import Tokenizer, normalizers

        self.folder = Path(folder)
        cfg = json.loads((self.folder / "tokenizer_config.json").read_text())
        spec = SUPPORTED[cfg["tokenizer_class"]]
        self._tokenizer = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        if spec.get("normalizer") == "NFC":
            self._tokenizer.normalizer = normalizers.NFC()
        self._tokenizer.encode_special_tokens = bool(cfg.get("split_special_tokens", False))
        self.name_or_path = str(self.folder)
        self.special_tokens: dict[str, str | None] = {}
        for attr in SPECIAL:
            value = _content(cfg[attr]) if attr in cfg else spec["defaults"].get(attr)
            self.special_tokens[attr] = value
        extra = cfg.get("extra_special_tokens", cfg.get("additional_special_tokens")) or []
        self._extra = [_content(t) for t in (extra.values() if isinstance(extra, dict) else extra)]
        template = self.folder / "chat_template.jinja"
        self.chat_template = template.read_text() if template.is_file() else cfg.get("chat_template")
        self.clean_up_tokenization_spaces = bool(cfg.get("clean_up_tokenization_spaces", False))
        self._hf_tokenizer = None
        self._hf_lock = threading.Lock()
        self.prompt_tables = TableStore.of(self.folder)  # core/prompt.prepare_tokenizer reads and fills it

    # the special tokens, as transformers names them
    def _id(self, attr: str) -> int | None:
        tok = self.special_tokens.get(attr)
        return None if tok is None else self.convert_tokens_to_ids(tok)

    unk_token = property(lambda self: self.special_tokens["unk_token"])
    bos_token = property(lambda self: self.special_tokens["bos_token"])
    eos_token = property(lambda self: self.special_tokens["eos_token"])
    pad_token = property(lambda self: self.special_tokens["pad_token"])
    unk_token_id = property(lambda self: self._id("unk_token"))
    bos_token_id = property(lambda self: self._id("bos_token"))
    eos_token_id = property(lambda self: self._id("eos_token"))
    pad_token_id = property(lambda self: self._id("pad_token"))

    @property
    def all_special_tokens(self) -> list[str]:
        out: list[str] = []
        for tok in [self.special_tokens[a] for a in SPECIAL] + self._extra:
            if tok is not None and tok not in out:
                out.append(tok)
        return out

    @property
    def all_special_ids(self) -> list[int | None]:
        return [self.convert_tokens_to_ids(t) for t in self.all_special_tokens]

    @property
    def added_tokens_decoder(self) -> dict:
        return self._tokenizer.get_added_tokens_decoder()

    @property
    def backend_tokenizer(self):
        return self._tokenizer

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self._tokenizer.get_vocab(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True, **kwargs: Any) -> list[int]:
        if kwargs:  # truncation, tensors, pairs...: what only transformers implements
            return self._hf().encode(text, add_special_tokens=add_special_tokens, **kwargs)
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, not {type(text).__name__}")
        return self._tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, token_ids: Any, skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool | None = None, **kwargs: Any) -> str:
        if hasattr(token_ids, "tolist"):  # a tensor or an array
            token_ids = token_ids.tolist()
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        if token_ids and isinstance(token_ids[0], (list, tuple)):  # a batch: transformers' answer
            return self._hf().decode(token_ids, skip_special_tokens=skip_special_tokens,
                                     clean_up_tokenization_spaces=clean_up_tokenization_spaces, **kwargs)
        # transformers skips the clean-up for BPE models (it would strip spaces before punctuation)
        return self._tokenizer.decode([int(i) for i in token_ids], skip_special_tokens=skip_special_tokens)

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> Any:
        if isinstance(tokens, str):
            i = self._tokenizer.token_to_id(tokens)
            return self.unk_token_id if i is None and tokens != self.unk_token else i
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | list[int], skip_special_tokens: bool = False) -> Any:
        if isinstance(ids, int):
            return self._tokenizer.id_to_token(ids)
        skip = set(self.all_special_ids) if skip_special_tokens else set()
        to_token = self._tokenizer.id_to_token
        return [to_token(int(i)) for i in ids if int(i) not in skip]

    def _hf(self):
        """The transformers tokenizer of the same folder, for what this class does not implement."""
        with self._hf_lock:
            if self._hf_tokenizer is None:
                from transformers import AutoTokenizer

                self._hf_tokenizer = AutoTokenizer.from_pretrained(str(self.folder), local_files_only=True)
            return self._hf_tokenizer

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        return self._hf().apply_chat_template(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._hf(), name)

    def __repr__(self) -> str:
        return f"FastTokenizer({self.name_or_path!r}, vocab={len(self)})"


class TableStore:
    """core/prompt/__init__.py's byte tables of one tokenizer (every token's bytes by first byte, the ids
    allowed after an indentation), kept between starts: ~0.35 CPU-s to build from 152k tokens,
    ~0.03 s to read. A file under the cache named by the digests of the tokenizer's files (the
    runtime folder's manifest) and the format; its payload's sha256 heads it. A missing, damaged
    or unreadable file only means building the tables again (and writing them)."""

    FORMAT = 1

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def of(cls, folder: Path) -> TableStore | None:
        from tokenizers import __version__ as tokenizers_version

        from .integrity import read_manifest

        files = read_manifest(folder)
        digests = [files.get(n, {}).get("sha256") for n in ("tokenizer.json", "tokenizer_config.json")]
        if not all(digests):
            return None  # a folder without digests: nothing names its contents
        key = hashlib.sha256(json.dumps([cls.FORMAT, tokenizers_version, *digests]).encode()).hexdigest()[:32]
        return cls(cache_root() / "prompt-tables" / f"{key}.marshal")

    def load(self) -> Any:
        try:
            data = self.path.read_bytes()
            payload = data[64:]
            if hashlib.sha256(payload).hexdigest().encode() != data[:64]:
                return None
            tables = marshal.loads(payload)
        except (OSError, ValueError, EOFError, TypeError):
            return None
        return tables if isinstance(tables, tuple) and len(tables) == 2 else None

    def save(self, tables: Any) -> None:
        payload = marshal.dumps(tables)
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp.write_bytes(hashlib.sha256(payload).hexdigest().encode() + payload)
            os.replace(tmp, self.path)
        except OSError:
            tmp.unlink(missing_ok=True)  # a read-only cache: built again next time


def load_tokenizer(folder: Path):
    """The tokenizer of a converted model's folder: FastTokenizer when its class is supported, else
    transformers' AutoTokenizer."""
    if supported(folder):
        try:
            return FastTokenizer(folder)
        except Exception as e:  # tokenizers raises its own exception types on a malformed file
            raise ValueError(f"{folder / 'tokenizer.json'}: {e}") from None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
