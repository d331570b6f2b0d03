"""Bounds the wire states and the engine obeys, torch-free: the protocol validates requests with them
(service/protocol.py re-exports them) and the prompt and sampling code below it applies them."""

MIN_TEMPERATURE = 1e-5  # a temperature under this is greedy decoding
MAX_PROMPT_TOKENS = 3072  # one prompt, completion or rewrite (selection + instruction + context): prefill time
# A completion's full prompt, in the daemon and in `bench` (--prompt-tokens): what the bench scores is what
# the editor gets. 3,072 was right at 1 more of 80 positions of two packages (docs/shown-quality.md) for
# 1.5x the prefill: a document opened on 2 cores was warm only after ~30 s.
COMPLETION_PROMPT_TOKENS = 2048
