"""The data path and the small pure pieces of the trainer, without a Ray cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from ray.train.torch import TorchConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from tests.training.tiny import VOCAB_SIZE, corpus_lines
from training.data import PackedBatches, SyntheticBatches, read_texts, tokenize_texts
from training.ray_finetune import DEFAULT_MODEL, TrainJob, build_trainer, parse_args, plan_device, unshared_tensors


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerBase:
    loaded: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(tiny_model_dir)
    return loaded


def test_synthetic_batch_shape_range_and_labels() -> None:
    batch = SyntheticBatches(vocab_size=50, batch_size=3, seq_len=7, seed=0, rank=0).batch(0)
    assert batch.input_ids.shape == (3, 7)
    assert batch.input_ids.dtype == torch.long
    assert int(batch.input_ids.min()) >= 0
    assert int(batch.input_ids.max()) < 50
    assert torch.equal(batch.labels, batch.input_ids)
    assert batch.labels.data_ptr() != batch.input_ids.data_ptr()
    assert batch.num_tokens == 21


def test_synthetic_batches_depend_on_seed_rank_and_step_only() -> None:
    def ids(seed: int, rank: int, step: int) -> torch.Tensor:
        return SyntheticBatches(vocab_size=1000, batch_size=2, seq_len=16, seed=seed, rank=rank).batch(step).input_ids

    assert torch.equal(ids(0, 0, 3), ids(0, 0, 3))
    assert not torch.equal(ids(0, 0, 3), ids(1, 0, 3))
    assert not torch.equal(ids(0, 0, 3), ids(0, 1, 3))
    assert not torch.equal(ids(0, 0, 3), ids(0, 0, 4))


def test_read_texts_txt_and_jsonl(tmp_path: Path) -> None:
    txt = tmp_path / "a.txt"
    txt.write_text("first line\n\n  \nsecond line\n", encoding="utf-8")
    jsonl = tmp_path / "b.jsonl"
    jsonl.write_text(json.dumps({"text": "one doc", "id": 1}) + "\n\n" + json.dumps({"text": "two"}) + "\n")
    assert read_texts(txt) == ["first line", "second line"]
    assert read_texts(jsonl) == ["one doc", "two"]


def test_tokenize_texts_ends_each_document_with_eos(tokenizer: PreTrainedTokenizerBase) -> None:
    tokens = tokenize_texts(["the cat reads", "a dog"], tokenizer, VOCAB_SIZE)
    eos = tokenizer.eos_token_id
    assert tokens.tolist() == [*tokenizer.encode("the cat reads"), eos, *tokenizer.encode("a dog"), eos]
    assert tokens.tolist().count(eos) == 2


def test_tokenize_texts_rejects_ids_outside_the_vocabulary(tokenizer: PreTrainedTokenizerBase) -> None:
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        tokenize_texts(corpus_lines(), tokenizer, vocab_size=5)


def packed_epoch(seed: int) -> list[torch.Tensor]:
    """Every batch of one epoch of 100 tokens (20 rows of 5, batches of 2 rows, 2 ranks), in step-then-rank order."""
    ranks = [PackedBatches(torch.arange(100), batch_size=2, seq_len=5, seed=seed, rank=r, world_size=2) for r in (0, 1)]
    return [ranks[r].batch(s).input_ids for s in range(5) for r in (0, 1)]


def test_packed_batches_cover_every_row_once_per_epoch() -> None:
    batches = packed_epoch(seed=0)
    assert all(b.shape == (2, 5) for b in batches)
    rows = torch.cat(batches)
    # Each row is a contiguous slice of the stream, and together the ranks see each row exactly once.
    assert all(torch.equal(row, torch.arange(int(row[0]), int(row[0]) + 5)) for row in rows)
    assert sorted(int(row[0]) for row in rows) == list(range(0, 100, 5))


def test_packed_batches_order_follows_the_seed_and_wraps_around() -> None:
    assert all(torch.equal(a, b) for a, b in zip(packed_epoch(3), packed_epoch(3), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(packed_epoch(3), packed_epoch(4), strict=True))
    rank0 = PackedBatches(torch.arange(100), batch_size=2, seq_len=5, seed=3, rank=0, world_size=2)
    assert torch.equal(rank0.batch(5).input_ids, rank0.batch(0).input_ids)
    batch = rank0.batch(2)
    assert torch.equal(batch.labels, batch.input_ids)


def test_packed_batches_repeat_a_corpus_shorter_than_a_row() -> None:
    batch = PackedBatches(torch.tensor([7, 8, 9]), batch_size=1, seq_len=8, seed=0, rank=0, world_size=1).batch(0)
    assert batch.input_ids.tolist() == [[7, 8, 9, 7, 8, 9, 7, 8]]


def test_labels_are_what_the_model_shifts_itself(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    batch = SyntheticBatches(vocab_size=VOCAB_SIZE, batch_size=2, seq_len=12, seed=3, rank=0).batch(0)
    with torch.no_grad():
        out = model(input_ids=batch.input_ids, labels=batch.labels)
        logits = out.logits[:, :-1].reshape(-1, VOCAB_SIZE)
        expected = torch.nn.functional.cross_entropy(logits, batch.input_ids[:, 1:].reshape(-1))
        unshifted = torch.nn.functional.cross_entropy(out.logits.reshape(-1, VOCAB_SIZE), batch.input_ids.reshape(-1))
    assert torch.allclose(out.loss, expected, rtol=1e-5)
    assert not torch.allclose(out.loss, unshifted, rtol=1e-3)


def test_device_plan_pairs_cuda_with_nccl_and_cpu_with_gloo() -> None:
    gpu, cpu = plan_device(True), plan_device(False)
    assert (gpu.use_gpu, gpu.device_type, gpu.backend, gpu.compute_dtype) == (True, "cuda", "nccl", torch.bfloat16)
    assert (cpu.use_gpu, cpu.device_type, cpu.backend, cpu.compute_dtype) == (False, "cpu", "gloo", torch.float32)


def test_a_cpu_rehearsal_of_a_gpu_job_reserves_a_gpu_per_worker_and_computes_on_cpu_with_gloo() -> None:
    # The rehearsal's Ray nodes advertise the GPUs KubeRay would (rehearse/kuberay.py); reserving one per worker
    # places the workers as on the GPU cluster (4 per g6 node), where one CPU each packed all of them onto one node.
    rehearsal = plan_device(True, rehearsal=True)
    assert (rehearsal.use_gpu, rehearsal.reserve_gpu) == (False, True)
    assert (rehearsal.device_type, rehearsal.backend, rehearsal.compute_dtype) == ("cpu", "gloo", torch.float32)
    assert plan_device(True).reserve_gpu
    assert not plan_device(False).reserve_gpu
    assert plan_device(False, rehearsal=True) == plan_device(False)
    trainer = build_trainer(
        TrainJob(model="m", steps=1, batch_size=1, seq_len=8, lr=1e-5, seed=0, data="synthetic", device=rehearsal),
        num_workers=8,
        storage_path=None,
        callbacks=[],
    )
    assert trainer.scaling_config.use_gpu is True
    assert isinstance(trainer.backend_config, TorchConfig)
    assert trainer.backend_config.backend == "gloo"


def test_unshared_tensors_copies_tied_weights() -> None:
    shared = torch.ones(3)
    out = unshared_tensors({"embed": shared, "head": shared, "other": torch.zeros(2)})
    assert out["embed"].untyped_storage().data_ptr() != out["head"].untyped_storage().data_ptr()
    assert torch.equal(out["embed"], out["head"])
    with pytest.raises(TypeError, match="not a tensor"):
        unshared_tensors({"step": 3})


def test_cli_defaults_and_validation(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse_args([])
    assert (args.model, args.use_gpu, args.data, args.output_json) == (DEFAULT_MODEL, None, "synthetic", None)
    assert parse_args(["--no-use-gpu"]).use_gpu is False
    assert parse_args(["--use-gpu"]).use_gpu is True
    with pytest.raises(SystemExit):
        parse_args(["--steps", "0"])
    assert "--steps must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as help_exit:
        parse_args(["--help"])
    assert help_exit.value.code == 0
    usage = capsys.readouterr().out
    for flag in ("--model", "--num-workers", "--use-gpu", "--storage-path", "--output-json", "--data", "--seq-len"):
        assert flag in usage
