"""The target pass: the runner, its KV cache, the native (lean) layer."""
