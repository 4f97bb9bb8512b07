"""Real fine-tunes on a local Ray cluster: 2 CPU workers, gloo, FSDP2, the tiny Qwen2 on a text file.

The runs go through the CLI entry point in-process (so they share one Ray cluster); a second run with the same seed
starts only for the determinism test.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from tests.tiers import starts_training_processes
from training.ray_finetune import WEIGHTS_FILE, main

STEPS = 6
BATCH_SIZE = 2
SEQ_LEN = 32
WORKERS = 2
TOKENS_PER_STEP = BATCH_SIZE * SEQ_LEN * WORKERS

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
@starts_training_processes
def local_ray() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as env:
        # On a busy 2-core machine starting the worker group (mostly imports) takes 15-25 s; Ray gives up at 60 s.
        env.setenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "240")
        # The controller notices the end of a run at a poll (default every 2 s; here it took ~6 s, ~1.5 s at 0.5 s).
        env.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
        ray.init(num_cpus=WORKERS, include_dashboard=False, object_store_memory=128 * 1024**2)
        try:
            yield
        finally:
            ray.shutdown()


def fine_tune(model_dir: Path, corpus: Path, out: Path) -> dict[str, Any]:
    output_json = out / "result.json"
    argv = [
        *("--model", str(model_dir), "--data", str(corpus), "--num-workers", str(WORKERS), "--no-use-gpu"),
        *("--steps", str(STEPS), "--batch-size", str(BATCH_SIZE), "--seq-len", str(SEQ_LEN), "--lr", "3e-3"),
        *("--seed", "7", "--storage-path", str(out / "storage"), "--output-json", str(output_json)),
    ]
    assert main(argv) == 0
    result: dict[str, Any] = json.loads(output_json.read_text())
    result["storage"] = out / "storage"
    return result


@pytest.fixture(scope="module")
def run(
    local_ray: None, tiny_model_dir: Path, corpus_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    return fine_tune(tiny_model_dir, corpus_file, tmp_path_factory.mktemp("run1"))


@pytest.fixture(scope="module")
def runs(
    run: dict[str, Any], tiny_model_dir: Path, corpus_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The first run and a second with the same seed, for the determinism test alone."""
    return run, fine_tune(tiny_model_dir, corpus_file, tmp_path_factory.mktemp("run2"))


def test_every_step_reports_a_finite_loss(run: dict[str, Any]) -> None:
    history = run["history"]
    assert [entry["step"] for entry in history] == list(range(1, STEPS + 1))
    assert all(math.isfinite(entry["loss"]) and entry["loss"] > 0 for entry in history)
    assert run["metrics"]["final_loss"] == history[-1]["loss"]


def test_loss_falls_on_the_repeated_corpus(run: dict[str, Any]) -> None:
    losses = [entry["loss"] for entry in run["history"]]
    # A fresh model starts near ln(vocab); a few steps on ~30 distinct words must go well below that.
    assert abs(losses[0] - math.log(512)) < 1.0
    assert losses[-1] < losses[0] - 0.5


def test_throughput_agrees_with_step_times(run: dict[str, Any]) -> None:
    for entry in run["history"]:
        assert entry["step_time_s"] > 0
        assert entry["tokens_per_s"] == pytest.approx(TOKENS_PER_STEP / entry["step_time_s"])
        assert entry["steps_per_s"] == pytest.approx(1 / entry["step_time_s"])
    metrics = run["metrics"]
    total_time = sum(entry["step_time_s"] for entry in run["history"])
    assert metrics["steps"] == STEPS
    assert metrics["tokens"] == STEPS * TOKENS_PER_STEP
    assert metrics["train_time_s"] == pytest.approx(total_time)
    assert metrics["mean_steps_per_s"] == pytest.approx(STEPS / total_time)
    assert metrics["mean_tokens_per_s"] == pytest.approx(STEPS * TOKENS_PER_STEP / total_time)
    assert metrics["mean_tokens_per_s"] > 0


def test_checkpoint_holds_the_trained_weights(run: dict[str, Any], tiny_model_dir: Path) -> None:
    checkpoint = Path(run["checkpoint_path"])
    assert checkpoint.is_dir()
    assert checkpoint.is_relative_to(run["storage"])
    state = load_file(checkpoint / WEIGHTS_FILE)

    fresh = Qwen2ForCausalLM(Qwen2Config.from_pretrained(checkpoint))
    expected_shapes = {name: tuple(t.shape) for name, t in fresh.state_dict().items()}
    assert {name: tuple(t.shape) for name, t in state.items()} == expected_shapes
    fresh.load_state_dict(state, strict=True)

    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    changed = [name for name, tensor in fresh.state_dict().items() if not torch.equal(tensor, initial[name])]
    assert len(changed) > len(initial) // 2, "training should have moved most weights"

    reloaded = AutoModelForCausalLM.from_pretrained(checkpoint)
    assert all(torch.equal(t, state[name]) for name, t in reloaded.state_dict().items())
    assert (checkpoint / "tokenizer.json").is_file()


def test_same_seed_gives_the_same_losses(runs: tuple[dict[str, Any], dict[str, Any]]) -> None:
    first, second = runs
    # Holds bit for bit on CPU: each worker has 1 CPU, so Ray sets OMP_NUM_THREADS=1 and kernels run in a fixed
    # order, and a two-rank gloo sum (a + b) does not depend on arrival order.
    assert [e["loss"] for e in first["history"]] == [e["loss"] for e in second["history"]]
    assert first["metrics"]["final_loss"] == second["metrics"]["final_loss"]
    assert first["checkpoint_path"] != second["checkpoint_path"]
    weights = [load_file(Path(r["checkpoint_path"]) / WEIGHTS_FILE) for r in runs]
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])
