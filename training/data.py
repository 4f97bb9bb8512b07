"""Training batches: synthetic random tokens, or a local text/jsonl file packed into fixed-length rows.

Every batch is a pure function of (seed or file, rank, world size, step), so any worker can rebuild any
step's batch and two runs with the same inputs see the same data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class Batch:
    input_ids: torch.Tensor
    labels: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return self.input_ids.numel()


class BatchSource(Protocol):
    def batch(self, step: int) -> Batch: ...


def causal_lm_labels(input_ids: torch.Tensor) -> torch.Tensor:
    # Hugging Face causal LMs shift labels inside the model (logits[:, :-1] predict labels[:, 1:]),
    # so labels are the input ids themselves, not ids shifted by one.
    return input_ids.clone()


class SyntheticBatches:
    """Uniform random token ids, distinct per rank and per step."""

    def __init__(self, *, vocab_size: int, batch_size: int, seq_len: int, seed: int, rank: int) -> None:
        self.vocab_size = vocab_size
        self.shape = (batch_size, seq_len)
        self.seed = seed
        self.rank = rank

    def batch(self, step: int) -> Batch:
        state = int(np.random.SeedSequence([self.seed, self.rank, step]).generate_state(1, dtype=np.uint64)[0])
        generator = torch.Generator().manual_seed(state)
        input_ids = torch.randint(0, self.vocab_size, self.shape, generator=generator, dtype=torch.long)
        return Batch(input_ids=input_ids, labels=causal_lm_labels(input_ids))


class PackedBatches:
    """A token stream cut into rows of seq_len, shuffled by seed; step s on rank r takes the (s * world + r)-th
    block of rows, so the ranks share one row order and never see the same row in an epoch."""

    def __init__(
        self, tokens: torch.Tensor, *, batch_size: int, seq_len: int, seed: int, rank: int, world_size: int
    ) -> None:
        if tokens.dim() != 1 or tokens.numel() == 0:
            raise ValueError("tokens must be a non-empty 1-D tensor")
        repeats = -(-seq_len // tokens.numel())  # a corpus shorter than one row is repeated to fill it
        stream = tokens.repeat(repeats)
        num_rows = stream.numel() // seq_len
        order = torch.randperm(num_rows, generator=torch.Generator().manual_seed(seed))
        self.rows = stream[: num_rows * seq_len].view(num_rows, seq_len)[order]
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size

    def batch(self, step: int) -> Batch:
        first = (step * self.world_size + self.rank) * self.batch_size
        index = torch.arange(first, first + self.batch_size) % self.rows.shape[0]
        input_ids = self.rows[index].clone()
        return Batch(input_ids=input_ids, labels=causal_lm_labels(input_ids))


def read_texts(path: Path) -> list[str]:
    """Documents of a file: the "text" field of each line of a .jsonl file, else each non-empty line."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if path.suffix == ".jsonl":
        return [str(json.loads(line)["text"]) for line in lines]
    return lines


def tokenize_texts(texts: list[str], tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> torch.Tensor:
    """One stream of token ids, documents separated by the tokenizer's EOS token when it has one."""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer.encode(text, add_special_tokens=False))
        if isinstance(eos, int):
            ids.append(eos)
    if not ids:
        raise ValueError("the data file holds no tokens")
    tokens = torch.tensor(ids, dtype=torch.long)
    if int(tokens.max()) >= vocab_size:
        raise ValueError(f"tokenizer produced id {int(tokens.max())}, outside the model's vocabulary of {vocab_size}")
    return tokens
