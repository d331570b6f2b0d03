"""completiond: local code completion with lossless speculative decoding."""

__version__ = "0.1.0"
