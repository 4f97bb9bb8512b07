"""A tiny Qwen2 model, a word-level tokenizer and a small corpus, all built offline: what `trainctl rehearse
--scale small` trains instead of a hub model, and what the tests train (tests/training/tiny.py re-exports it)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch and transformers load in seconds; the corpus and the constants need neither
    from transformers import PreTrainedTokenizerFast, Qwen2Config

VOCAB_SIZE = 512
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[EOS]"]

SUBJECTS = ["the cat", "a dog", "the old sailor", "my neighbour", "the small robot", "a quiet student"]
VERBS = ["reads", "paints", "repairs", "watches", "carries", "finds"]
OBJECTS = ["a red boat", "the blue door", "an old map", "the morning paper", "a broken clock", "the tall tree"]


def corpus_lines() -> list[str]:
    """216 short sentences over a vocabulary of about 30 words."""
    return [f"{s} {v} {o} near the river" for s, v, o in itertools.product(SUBJECTS, VERBS, OBJECTS)]


def build_tokenizer(lines: list[str]) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(lines, trainers.WordLevelTrainer(special_tokens=SPECIAL_TOKENS))
    # transformers leaves this constructor unannotated.
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", eos_token="[EOS]"
    )


def tiny_config(eos_token_id: int, pad_token_id: int) -> Qwen2Config:
    from transformers import Qwen2Config

    # Qwen2.5-1.5B's shape in miniature: grouped-query attention and tied input/output embeddings.
    return Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )


def save_tiny_model(directory: Path, lines: list[str]) -> Path:
    """Tokenizer and randomly initialised (seeded) model in one Hugging Face directory."""
    import torch
    from transformers import Qwen2ForCausalLM

    tokenizer = build_tokenizer(lines)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    assert isinstance(eos, int)
    assert isinstance(pad, int)
    torch.manual_seed(1234)
    Qwen2ForCausalLM(tiny_config(eos, pad)).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
