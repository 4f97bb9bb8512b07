"""The tiny model of the tests: rehearse/tiny_model.py (one home, also used by `trainctl rehearse --scale small`)."""

from __future__ import annotations

from rehearse.tiny_model import (
    OBJECTS,
    SPECIAL_TOKENS,
    SUBJECTS,
    VERBS,
    VOCAB_SIZE,
    build_tokenizer,
    corpus_lines,
    save_tiny_model,
    tiny_config,
)

__all__ = [
    "OBJECTS",
    "SPECIAL_TOKENS",
    "SUBJECTS",
    "VERBS",
    "VOCAB_SIZE",
    "build_tokenizer",
    "corpus_lines",
    "save_tiny_model",
    "tiny_config",
]
