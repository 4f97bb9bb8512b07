"""Fine-tune a Hugging Face causal LM with Ray Train's TorchTrainer, sharded with FSDP2.

    python -m training.ray_finetune --model Qwen/Qwen2.5-1.5B --num-workers 8 --steps 100

Connects to the Ray cluster named by RAY_ADDRESS, or starts a local one.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import ray
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from ray.train import Checkpoint
from ray.train.torch import TorchConfig
from ray.train.v2.api.callback import UserCallback
from ray.train.v2.api.config import RunConfig, ScalingConfig
from ray.train.v2.torch.torch_trainer import TorchTrainer
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from training import emf, fabric_gate, fabric_gate_config
from training.data import BatchSource, PackedBatches, SyntheticBatches, read_texts, tokenize_texts
from training.fsdp import load_model, shard_model
from training.rehearsal import cpu_rehearsal

DEFAULT_MODEL = "Qwen/Qwen2.5-1.5B"
WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class DevicePlan:
    use_gpu: bool
    backend: str
    device_type: str
    compute_dtype: torch.dtype
    # Ray Train's ScalingConfig(use_gpu=): one GPU reserved per worker, which is what places the workers (4 per g6
    # node, 8 per p5); false, each worker reserves one CPU and Ray's default PACK strategy fills one node first.
    reserve_gpu: bool = False


def plan_device(use_gpu: bool, *, rehearsal: bool = False) -> DevicePlan:
    """The only place that maps "GPU or not" to device type, collective backend and compute precision.

    Parameters, gradients and optimizer state stay float32 on both; on GPU, FSDP computes in bfloat16. A CPU
    rehearsal of a GPU job (training/rehearsal.py) computes on CPU with gloo but still reserves a GPU per worker:
    its Ray nodes advertise the GPUs KubeRay would (rehearse/kuberay.py), so the gang is placed as it will be.
    """
    if use_gpu and not rehearsal:
        return DevicePlan(True, backend="nccl", device_type="cuda", compute_dtype=torch.bfloat16, reserve_gpu=True)
    return DevicePlan(False, backend="gloo", device_type="cpu", compute_dtype=torch.float32, reserve_gpu=use_gpu)


@dataclass(frozen=True)
class TrainJob:
    """What every worker needs to know; travels to the workers inside the train loop config."""

    model: str
    steps: int
    batch_size: int
    seq_len: int
    lr: float
    seed: int
    data: str
    device: DevicePlan
    gate: fabric_gate_config.GateConfig = field(default_factory=fabric_gate_config.GateConfig)


@dataclass(frozen=True)
class RunSummary:
    metrics: dict[str, Any]
    checkpoint_path: str | None
    history: list[dict[str, Any]]


class StepMetricsLog(UserCallback):
    """Appends rank 0's metrics of every ray.train.report to a JSON-lines file.

    Runs in the Ray Train controller, which Ray pins to the driver's node, so the driver can read the file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Checkpoint | None) -> None:
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(metrics[0]) + "\n")


def worker_device(plan: DevicePlan) -> torch.device:
    if not plan.use_gpu:
        return torch.device("cpu")
    device = ray.train.torch.get_device()
    torch.cuda.set_device(device)
    return device


def load_tokenizer(job: TrainJob) -> PreTrainedTokenizerBase | None:
    if job.data == "synthetic":
        return None
    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(job.model)
    return tokenizer


def batch_source(
    job: TrainJob, tokenizer: PreTrainedTokenizerBase | None, vocab_size: int, rank: int, world_size: int
) -> BatchSource:
    if tokenizer is None:
        return SyntheticBatches(
            vocab_size=vocab_size, batch_size=job.batch_size, seq_len=job.seq_len, seed=job.seed, rank=rank
        )
    tokens = tokenize_texts(read_texts(Path(job.data)), tokenizer, vocab_size)
    return PackedBatches(
        tokens, batch_size=job.batch_size, seq_len=job.seq_len, seed=job.seed, rank=rank, world_size=world_size
    )


def global_mean(value: torch.Tensor, world_size: int) -> float:
    # SUM then divide: gloo has no AVG reduction.
    total = value.detach().float().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return float(total.item()) / world_size


def train_step(
    model: PreTrainedModel, optimizer: torch.optim.Optimizer, source: BatchSource, step: int, device: torch.device
) -> torch.Tensor:
    batch = source.batch(step)
    outputs = model(input_ids=batch.input_ids.to(device), labels=batch.labels.to(device))
    loss: torch.Tensor = outputs.loss
    torch.autograd.backward(loss)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def step_metrics(step: int, loss: float, seconds: float, tokens: int) -> dict[str, Any]:
    return {
        "step": step,
        "loss": loss,
        "step_time_s": seconds,
        "tokens_per_s": tokens / seconds,
        "steps_per_s": 1.0 / seconds,
    }


def total_metrics(steps: int, last_loss: float, seconds: float, tokens_per_step: int) -> dict[str, Any]:
    return {
        "final": True,
        "steps": steps,
        "final_loss": last_loss,
        "train_time_s": seconds,
        "tokens": steps * tokens_per_step,
        "mean_tokens_per_s": steps * tokens_per_step / seconds,
        "mean_steps_per_s": steps / seconds,
    }


def unshared_tensors(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Tied weights (embeddings and LM head) may share storage under two names; safetensors refuses that,
    so every name after the first gets a copy."""
    seen: set[int] = set()
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"state dict entry {name} is a {type(tensor).__name__}, not a tensor")
        ptr = tensor.untyped_storage().data_ptr()
        tensors[name] = tensor.clone().contiguous() if ptr in seen else tensor.contiguous()
        seen.add(ptr)
    return tensors


def save_weights(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, directory: Path) -> None:
    """Gathers the full state dict (a collective: every rank calls this); rank 0 writes a Hugging Face directory."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)
    if dist.get_rank() != 0:
        return
    save_file(unshared_tensors(state), str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    model.config.save_pretrained(directory)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)


def report_final(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, metrics: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        save_weights(model, tokenizer, Path(tmp))
        checkpoint = Checkpoint.from_directory(tmp) if dist.get_rank() == 0 else None
        ray.train.report(metrics, checkpoint=checkpoint)


def train_loop_per_worker(config: dict[str, Any]) -> None:
    job: TrainJob = config["job"]
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    device = worker_device(job.device)
    gate = None
    if job.gate.enabled:
        # Before the model: the gate's sweep needs the GPU memory the model will take. A failed gate raises
        # GateFailedError here; the driver exits with the code the gate wrote to the shared directory.
        os.environ.setdefault("LOCAL_RANK", str(context.get_local_rank()))
        gate = fabric_gate.run_gate(job.gate, backend=job.device.backend, stdout=sys.stdout).outcome.value
    torch.manual_seed(job.seed)
    model = load_model(job.model)
    tokenizer = load_tokenizer(job)
    source = batch_source(job, tokenizer, int(model.config.vocab_size), rank, world_size)
    shard_model(
        model, device_type=job.device.device_type, compute_dtype=job.device.compute_dtype, world_size=world_size
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=job.lr)
    model.train()
    tokens_per_step = job.batch_size * job.seq_len * world_size
    # Rank 0 publishes throughput as EMF lines (training/emf.py); the report log gets wall-clock times
    # for the goodput ledger (trainctl goodput).
    started = emf.process_start_time()
    metrics = emf.Emitter() if rank == 0 else None
    identity = emf.identity_from_env(
        model=job.model,
        world_size=world_size,
        local_world_size=context.get_local_world_size(),
        default_job=context.get_experiment_name(),
    )
    train_time, loss = 0.0, math.nan
    for step in range(job.steps):
        start = time.perf_counter()
        # global_mean ends in .item(), which waits for the device, so the step time covers the whole step.
        loss = global_mean(train_step(model, optimizer, source, step, device), world_size)
        seconds = time.perf_counter() - start
        train_time += seconds
        if metrics is not None:
            metrics.emit(
                emf.throughput(
                    identity, step=step + 1, step_time_s=seconds, tokens=tokens_per_step, world_size=world_size
                )
            )
        # The identity and the gate's outcome ride along: `trainctl baseline record` takes a baseline only from a
        # gated run of the group's workload.
        ray.train.report(
            {
                **step_metrics(step + 1, loss, seconds, tokens_per_step),
                "time": time.time(),
                "process_start": started,
                "fabric_gate": gate,
                **identity.report_fields(),
            }
        )
    report_final(model, tokenizer, total_metrics(job.steps, loss, train_time, tokens_per_step))


def cluster_has_gpu() -> bool:
    resources: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]  # Ray leaves it untyped
    return resources.get("GPU", 0.0) >= 1


def build_trainer(
    job: TrainJob, num_workers: int, storage_path: str | None, callbacks: list[UserCallback]
) -> TorchTrainer:
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"job": job},
        torch_config=TorchConfig(backend=job.device.backend),
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=job.device.reserve_gpu),
        run_config=RunConfig(storage_path=storage_path, callbacks=callbacks),
    )


def read_history(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def run(job: TrainJob, num_workers: int, storage_path: str | None = None) -> RunSummary:
    """Runs the fine-tune on the current Ray cluster (ray.init() first, or a local one is started)."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "reports.jsonl"
        result = build_trainer(job, num_workers, storage_path, [StepMetricsLog(log)]).fit()
        history = [entry for entry in read_history(log) if not entry.get("final")]
    checkpoint_path = result.checkpoint.path if result.checkpoint is not None else None
    return RunSummary(metrics=dict(result.metrics or {}), checkpoint_path=checkpoint_path, history=history)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m training.ray_finetune", description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--model", default=DEFAULT_MODEL, help="Hugging Face model id or local directory (default: %(default)s)")
    add("--num-workers", type=int, default=2, help="Ray Train workers, one GPU each on GPU (default: %(default)s)")
    add(
        "--use-gpu",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="CUDA + NCCL, or CPU + gloo (default: GPUs when the Ray cluster has any)",
    )
    add("--steps", type=int, default=20, help="optimizer steps (default: %(default)s)")
    add("--batch-size", type=int, default=4, help="sequences per worker per step (default: %(default)s)")
    add("--seq-len", type=int, default=512, help="tokens per sequence (default: %(default)s)")
    add("--lr", type=float, default=1e-5, help="AdamW learning rate (default: %(default)s)")
    add("--seed", type=int, default=0, help="seeds random tokens or row order, and torch (default: %(default)s)")
    add("--data", default="synthetic", help="'synthetic' or a local .txt/.jsonl file (default: %(default)s)")
    add("--storage-path", default=None, help="Ray Train storage for checkpoints (default: Ray's, ~/ray_results)")
    add("--output-json", type=Path, default=None, help="write the final metrics and checkpoint path here")
    fabric_gate_config.add_gate_arguments(parser)
    args = parser.parse_args(argv)
    try:
        args.gate = fabric_gate_config.gate_config(args)
    except ValueError as exc:
        parser.error(str(exc))
    for name in ("num_workers", "steps", "batch_size", "seq_len"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def absolute_storage(path: str | None) -> str | None:
    # Ray Train wants local storage paths absolute; URIs (s3://...) pass through.
    if path is None or "://" in path:
        return path
    return str(Path(path).expanduser().resolve())


def summary_text(summary: RunSummary) -> str:
    m = summary.metrics
    return (
        f"steps={m['steps']} final_loss={m['final_loss']:.4f} "
        f"tokens/s={m['mean_tokens_per_s']:.1f} steps/s={m['mean_steps_per_s']:.3f}\n"
        f"checkpoint: {summary.checkpoint_path}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not ray.is_initialized():
        ray.init()
    has_gpu = cluster_has_gpu()
    use_gpu = has_gpu if args.use_gpu is None else bool(args.use_gpu)
    rehearsal = cpu_rehearsal()
    if rehearsal and not has_gpu:
        # Nothing to reserve (a rehearsal whose Ray nodes advertise no GPU): a GPU request would wait forever.
        use_gpu = False
    data = args.data if args.data == "synthetic" else str(Path(args.data).resolve())
    model = str(Path(args.model).resolve()) if Path(args.model).is_dir() else args.model
    job = TrainJob(
        model=model,
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        lr=args.lr,
        seed=args.seed,
        data=data,
        device=plan_device(use_gpu, rehearsal=rehearsal),
        gate=args.gate,
    )
    started = time.time()
    try:
        summary = run(job, args.num_workers, absolute_storage(args.storage_path))
    except Exception:
        # Ray Train wraps the workers' GateFailedError; the gate's own verdict on the shared directory says more.
        verdict = fabric_gate.read_shared_verdict(job.gate.state_dir, fabric_gate.run_id(job.gate), since=started)
        if verdict is None:
            raise
        print(verdict["summary"], file=sys.stderr, flush=True)
        return int(verdict["exit_code"])
    print(summary_text(summary))
    if args.output_json is not None:
        args.output_json.write_text(json.dumps(asdict(summary), indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    # Under `python -m` this file is __main__, whose functions Ray would pickle by value (and fail on the
    # objects they reach). The importable module's main makes Ray ship train_loop_per_worker by reference.
    from training.ray_finetune import main as importable_main

    raise SystemExit(importable_main())
