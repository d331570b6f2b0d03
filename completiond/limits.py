"""Bounds the wire states and the engine obeys, torch-free: the protocol validates requests with them
(service/protocol.py re-exports them) and the prompt and sampling code below it applies them."""

MIN_TEMPERATURE = 1e-5  # a temperature under this is greedy decoding
MAX_PROMPT_TOKENS = 3072  # one prompt, completion or rewrite (selection + instruction + context): prefill time
