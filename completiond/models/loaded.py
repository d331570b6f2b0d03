"""A loaded model (loader.py makes it): the HF module, its tokenizer, where it runs and, for drafts
with a pruned output vocabulary, the id maps between the draft's ids and the target's."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# Tokens that end a completion when the tokenizer has them (Qwen2.5-Coder: FIM padding, end of text,
# the next file of a repo prompt, the end of a chat turn).
END_TOKENS = ("<|endoftext|>", "<|fim_pad|>", "<|file_sep|>", "<|im_end|>")


@dataclass
class LoadedModel:
    name: str
    model: torch.nn.Module
    tokenizer: object | None
    device: torch.device
    dtype: torch.dtype
    # What prefill chunks multiply in (quant.bulk): the dtype, or float32 where bf16 matmuls over
    # many rows are slow (device.pick_bulk_dtype).
    bulk_dtype: torch.dtype | None = None
    # Pruned-vocabulary drafts: draft id -> target id, and target id -> draft id (unk for the rest).
    to_target: torch.Tensor | None = None
    from_target: torch.Tensor | None = None
    meta: dict = field(default_factory=dict)

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    @property
    def target_vocab_size(self) -> int:
        """Size of the id space this model reads and proposes in (the target's, for mapped drafts)."""
        if self.to_target is not None:
            return int(self.meta.get("target_vocab_size", int(self.to_target.max()) + 1))
        return self.vocab_size

    def eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for src in (getattr(self.model, "generation_config", None), self.model.config):
            eos = getattr(src, "eos_token_id", None) if src is not None else None
            if isinstance(eos, int):
                ids.add(eos)
            elif eos:
                ids.update(int(e) for e in eos)
        if self.tokenizer is not None:
            vocab_ids = [self.tokenizer.convert_tokens_to_ids(t) for t in END_TOKENS]
            unk = getattr(self.tokenizer, "unk_token_id", None)
            ids.update(i for i in vocab_ids if isinstance(i, int) and i != unk and i < self.vocab_size)
        return ids
