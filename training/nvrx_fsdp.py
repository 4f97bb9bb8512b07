"""Fault-tolerant FSDP2 causal-LM training under NVIDIA Resiliency Extension (NVRx) 0.7.0.

    ft_launcher --nproc-per-node 8 --max-restarts 3 --ft-rank-heartbeat-timeout 300 \\
        -m training.nvrx_fsdp --model Qwen/Qwen2.5-1.5B --ckpt-dir /fsx/ckpt --steps 1000 --ckpt-every 50

Every start resumes from the latest complete checkpoint in --ckpt-dir (model, optimizer, step, data position, RNG).
Under ft_launcher (detected by its rank-monitor socket variable) each rank sends a heartbeat every step, so a hung
rank is killed by its rank monitor and the worker group restarted. With --inprocess, NVRx's inprocess.Wrapper
re-runs the training function in the same processes after a fault, with a fresh process group each iteration.
Data is a pure function of (seed, rank, step), so an interrupted and resumed run reproduces an uninterrupted one.
"""

# No `from __future__ import annotations` here: NVRx's Wrapper finds the parameter to inject its CallWrapper into by
# comparing the evaluated annotation (inspect.signature) with its CallWrapper class; string annotations break that.

if __name__ == "__main__":
    # A --check-args run on CPU answers before torch and transformers are imported (training/nvrx_config.py).
    from training.nvrx_config import exit_if_check_only_on_cpu

    exit_if_check_only_on_cpu()

import contextlib
import datetime
import functools
import gc
import hashlib
import json
import math
import os
import random
import socket
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store, TCPStore
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from transformers import AutoTokenizer, PreTrainedModel

from training import checkpointing as ckpt
from training import ckpt_verify, emf, fabric_gate, savers
from training import deadline as capacity
from training.data import BatchSource, PackedBatches, SyntheticBatches, read_texts, tokenize_texts
from training.faults import PHASE, FaultInjector, FaultKind, FaultSpec, check_rank
from training.fsdp import load_model, shard_model
from training.journal import Event, Journal, commit_fields, read_journal, summarize
from training.nvrx_config import (
    DeviceChoice,
    InprocessConfig,
    Job,
    StoreAddress,
    arguments_ok,
    default_store_addr,
)
from training.nvrx_config import (
    parse_command as parse_command,  # re-exported: tests/training/test_gpu_smoke_script.py parses with it
)
from training.rehearsal import cpu_rehearsal

# ft_launcher hands every rank the socket of its rank monitor in this variable (nvidia_resiliency_ext
# fault_tolerance.data.FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR); RankMonitorClient cannot work without it.
FT_RANK_MONITOR_ENV = "FT_RANK_MONITOR_IPC_SOCKET"
EXIT_BAD_ARGUMENTS = 2

# The job's configuration and command line are training/nvrx_config.py (no torch), its journal training/journal.py.


# --- device ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DevicePlan:
    device_type: str
    backend: str
    compute_dtype: torch.dtype


def plan_device(choice: DeviceChoice) -> DevicePlan:
    """CUDA + NCCL computing in bfloat16, or CPU + gloo in float32; parameters and optimizer state stay float32.
    A CPU rehearsal (training/rehearsal.py) is CPU + gloo whatever was asked."""
    if cpu_rehearsal():
        choice = "cpu"
    use_cuda = torch.cuda.is_available() if choice == "auto" else choice == "cuda"
    if use_cuda and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is visible; use --device cpu or --device auto")
    if use_cuda:
        return DevicePlan(device_type="cuda", backend="nccl", compute_dtype=torch.bfloat16)
    return DevicePlan(device_type="cpu", backend="gloo", compute_dtype=torch.float32)


def pg_timeout(job: Job, plan: DevicePlan) -> datetime.timedelta:
    if job.pg_timeout_s is not None:
        return datetime.timedelta(seconds=job.pg_timeout_s)
    cfg = job.inprocess
    if cfg.enabled and plan.backend == "gloo":
        # A rank blocked in a gloo collective only unwinds when the op fails; it must fail before NVRx's hard
        # timeout terminates the rank (which would turn the in-process restart into a launcher restart).
        return datetime.timedelta(seconds=(cfg.soft_timeout_s + cfg.hard_timeout_s) / 2)
    if cfg.enabled:
        # NCCL's watchdog tears the process down on timeout; it must outlast NVRx's hard timeout.
        return datetime.timedelta(seconds=cfg.hard_timeout_s + cfg.barrier_timeout_s)
    return datetime.timedelta(minutes=30)


# --- command line ------------------------------------------------------------------------------------------------


def check_job(job: Job) -> int:
    """--check-args: the arguments parsed and validated (parse_command); the device they ask for must exist."""
    try:
        plan = plan_device(job.device)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_BAD_ARGUMENTS
    print(arguments_ok(job, plan.device_type, plan.backend))
    return 0


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


# --- model, data, steps ------------------------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"[nvrx_fsdp rank {os.environ.get('RANK', '0')}] {message}", flush=True)


def batch_source(job: Job, vocab_size: int, rank: int, world_size: int) -> BatchSource:
    if job.data is None:
        return SyntheticBatches(
            vocab_size=vocab_size, batch_size=job.batch_size, seq_len=job.seq_len, seed=job.seed, rank=rank
        )
    tokenizer = AutoTokenizer.from_pretrained(job.model)
    tokens = tokenize_texts(read_texts(job.data), tokenizer, vocab_size)
    return PackedBatches(
        tokens, batch_size=job.batch_size, seq_len=job.seq_len, seed=job.seed, rank=rank, world_size=world_size
    )


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    source: BatchSource,
    step: int,
    device: torch.device,
    before_update: Callable[[], object] = lambda: None,
) -> float:
    """Global step `step` (from 1) on batch step-1; returns the loss averaged over ranks. `before_update` runs
    between backward and the optimizer step (a checkpoint still copying the parameters is waited for there)."""
    batch = source.batch(step - 1)
    outputs = model(input_ids=batch.input_ids.to(device), labels=batch.labels.to(device))
    loss: torch.Tensor = outputs.loss
    torch.autograd.backward(loss)
    before_update()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    # SUM then divide: gloo has no AVG. .item() waits for the device, so step times cover the whole step.
    total = loss.detach().float().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return float(total.item()) / dist.get_world_size()


def param_fingerprint(model: torch.nn.Module) -> tuple[str, int]:
    """sha256 over the full (unsharded) parameters in name order, and their element count; rank 0 only.
    Collective: every rank must call it."""
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    digest, numel = hashlib.sha256(), 0
    for name in sorted(full):
        tensor = full[name]
        if not isinstance(tensor, torch.Tensor):
            continue
        flat = tensor.detach().contiguous().reshape(-1)
        digest.update(f"{name}:{flat.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
        numel += flat.numel()
    return digest.hexdigest(), numel


def damage_shard(directory: Path, rank: int, kind: FaultKind) -> None:
    """corrupt-shard / torn-save: flips a byte of, or truncates, this rank's first shard file."""
    shard = min(directory.glob(f"__{rank}_*"))
    (ckpt_verify.truncate if kind is FaultKind.TORN_SAVE else ckpt_verify.corrupt)(shard)


def shard_written(directory: Path, rank: int) -> bool:
    """Whether DCP's FileSystemWriter has written this rank's shard file(s) (__RANK_N.distcp) in directory."""
    return any(directory.glob(f"__{rank}_*"))


# --- heartbeats --------------------------------------------------------------------------------------------------


class Heartbeats:
    """NVRx RankMonitorClient heartbeats when started by ft_launcher; a no-op otherwise."""

    def __init__(self) -> None:
        self.client: Any = None

    @staticmethod
    def available() -> bool:
        return FT_RANK_MONITOR_ENV in os.environ

    def start(self) -> None:
        if not self.available() or self.client is not None:
            return
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

        client = RankMonitorClient()
        client.init_workload_monitoring()
        self.client = client

    def beat(self) -> None:
        if self.client is not None:
            self.client.send_heartbeat()

    def stop(self) -> None:
        client, self.client = self.client, None
        if client is not None and client.is_initialized:
            client.shutdown_workload_monitoring()


# --- one run of the training function ----------------------------------------------------------------------------


class Session:
    """One run of the training function: an attempt started by the launcher, or one in-process iteration. It owns
    everything that references the process group, so `abandon` can drop it all after a fault."""

    def __init__(
        self,
        job: Job,
        plan: DevicePlan,
        *,
        iteration: int = 0,
        base_store: Store | None = None,
        call_wrapper: Any = None,
    ) -> None:
        self.job = job
        self.plan = plan
        self.iteration = iteration
        self.base_store = base_store
        self.call_wrapper = call_wrapper
        self.restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.run_id = os.environ.get("TORCHELASTIC_RUN_ID", f"pid-group-{os.getpgrp()}")
        self.heartbeats = Heartbeats()
        self.model: PreTrainedModel | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.saver: savers.Saver | None = None
        self.ckpt_group: dist.ProcessGroup | None = None
        # The Capacity Block clock's own gloo group: the async saver's threads run collectives on ckpt_group.
        self.clock_group: dist.ProcessGroup | None = None
        self.source: BatchSource | None = None
        self.emf: emf.Emitter | None = None
        self.identity: emf.JobIdentity | None = None
        self.injector: FaultInjector | None = None

    def _init_process_group(self) -> None:
        timeout = pg_timeout(self.job, self.plan)
        if self.plan.device_type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        if self.base_store is None:
            dist.init_process_group(self.plan.backend, timeout=timeout)
            return
        # In-process restart: a fresh process group per Wrapper iteration, over its own key prefix of one store
        # that outlives the iterations (keys of an aborted iteration must not leak into the next rendezvous).
        store = PrefixStore(str(self.iteration), self.base_store)
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group(self.plan.backend, store=store, rank=rank, world_size=world_size, timeout=timeout)

    def _atomic(self) -> contextlib.AbstractContextManager[Any]:
        # Keeps NVRx's restart procedure from interrupting a commit halfway (it raises asynchronously otherwise).
        if self.call_wrapper is None:
            return contextlib.nullcontext()
        atomic: contextlib.AbstractContextManager[Any] = self.call_wrapper.atomic()
        return atomic

    def _ping(self) -> None:
        if self.call_wrapper is not None:
            self.call_wrapper.ping()

    def run(self) -> None:
        job = self.job
        self._init_process_group()
        # The gate's outcome goes into rank 0's start event: a throughput baseline is taken only from a gated run
        # (trainctl baseline record). None: the gate is off, or this is an in-process restart of a gated process.
        gate = self._fabric_gate() if job.gate.enabled and self.iteration == 0 else None
        rank, world_size = dist.get_rank(), dist.get_world_size()
        if job.fault is not None:
            check_rank(job.fault, world_size)
        job.ckpt_dir.mkdir(parents=True, exist_ok=True)
        context = {"run_id": self.run_id, "restart": self.restart, "iteration": self.iteration}
        journal = Journal(job.journal, rank, context)
        self._start_metrics(rank, world_size)
        identity = {} if self.identity is None else {**self.identity.report_fields(), "fabric_gate": gate}
        journal.event(Event.START, process_start=emf.process_start_time(), **identity)
        if rank == 0 and (self.restart or self.iteration):
            log(f"restart detected: torchelastic restart {self.restart}, in-process iteration {self.iteration}")
        state, device = self._build(rank, world_size, journal)
        start = self._resume(state, rank, journal)
        block = capacity.from_env()
        if block is not None:
            self.clock_group = dist.new_group(backend="gloo")
            self._refuse_short_block(block, start, journal)
        injector = FaultInjector(job.fault, marker=job.marker, rank=rank, on_fire=self._fault_logger(journal))
        self.injector = injector
        self.heartbeats.start()
        loss = self._train(state, device, start, injector, journal, block)
        saver = self._saver()
        saver.finalize()
        final = saver.records[-1] if saver.records else None
        if final is not None and final.verdict is not None and not final.verdict.ok:
            # Every rank holds the combined verdict: all raise, and the restart resumes from the newest published
            # step and saves the final one again.
            raise RuntimeError(
                f"the final checkpoint (step {final.step}) failed verification ({final.verdict.reason}) and was not "
                f"published; a restart resumes from step {saver.last_committed} and saves it again"
            )
        self.heartbeats.beat()
        fingerprint, numel = param_fingerprint(state.model)
        saver.close()
        if rank == 0:
            journal.event(Event.FINISHED, step=job.steps, loss=loss)
            self._write_metrics(loss, fingerprint, numel, world_size)
        dist.barrier()
        self.heartbeats.stop()
        self._release()

    def _fabric_gate(self) -> str:
        """The fabric gate before the model is built (training/fabric_gate.py); its outcome (PASS, NOT RUN). A failed
        gate ends the process with the gate's code: raised, the NVRx Wrapper would restart this function in-process
        into the same verdict; the pod's supervisor (`python -m training.fabric_gate supervise`) reads the verdict and
        exits the pod with it."""
        try:
            return fabric_gate.run_gate(self.job.gate, backend=self.plan.backend, stdout=sys.stdout).outcome.value
        except fabric_gate.GateFailedError as failed:
            log(f"fabric gate failed: exit {failed.exit_code}")
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(failed.exit_code)

    def _block_clock(self, block: capacity.Deadline, step: int) -> float:
        """Rank 0's clock before step `step + 1`, on every rank: all ranks decide alike and stop at the same step."""
        now = torch.tensor([block.clock(step)], dtype=torch.float64)
        dist.broadcast(now, src=0, group=self.clock_group)
        return float(now.item())

    def _refuse_short_block(self, block: capacity.Deadline, start: int, journal: Journal) -> None:
        job = self.job
        why = block.refusal(self._block_clock(block, start), start=start, every=job.ckpt_every, last=job.steps)
        if why is not None:
            self._block_event(journal, block, "refused", start, start, why)
            self._leave(capacity.EXIT_REFUSED, why)

    @staticmethod
    def _block_event(journal: Journal, block: capacity.Deadline, outcome: str, step: int, saved: int, why: str) -> None:
        if dist.get_rank() == 0:
            at = capacity.iso(block.stop_at)
            journal.event(Event.BLOCK_STOP, outcome=outcome, step=step, resumes_from=saved, stop_at=at, why=why)

    def _stop_for_block(
        self, block: capacity.Deadline, state: ckpt.TrainState, done: int, start: int, journal: Journal
    ) -> None:
        """Saves step `done` (unless its checkpoint is already in flight or it is the resumed one), waits for the
        commit on every rank, and ends the process with EXIT_STOPPED."""
        saver = self._saver()
        if done > start and not self.job.is_checkpoint_step(done):
            saver.save(done, state)
        saver.finalize()
        dist.barrier(group=self.clock_group)
        final = saver.records[-1] if saver.records else None
        if final is not None and final.step == done and final.verdict is not None and not final.verdict.ok:
            # No time is left to save again: say what the next capacity resumes from.
            resumes = start if saver.last_committed is None else saver.last_committed
            why = (
                f"capacity block: the checkpoint of step {done} failed verification ({final.verdict.reason}) and "
                f"was not published; stopped before the block's stop point; the next capacity resumes from step "
                f"{resumes}"
            )
            self._block_event(journal, block, "stopped", done, resumes, why)
            self._leave(capacity.EXIT_STOPPED, why)
        why = (
            f"capacity block: checkpointed step {done} and stopped before the block's stop point; "
            "resume it on the next capacity"
        )
        self._block_event(journal, block, "stopped", done, done, why)
        self._leave(capacity.EXIT_STOPPED, why)

    def _leave(self, code: int, summary: str) -> None:
        """Ends the process with `code`, written first to the pod's verdict for its supervisor. os._exit, as the fabric
        gate does: raised, the NVRx Wrapper would restart the training in-process."""
        fabric_gate.write_stop_verdict(code, summary)
        if dist.get_rank() == 0:
            log(summary)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def _start_metrics(self, rank: int, world_size: int) -> None:
        """Rank 0 publishes EMF lines (training/emf.py): a restart now, throughput every --log-every steps."""
        if rank != 0:
            return
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        self.identity = emf.identity_from_env(
            model=self.job.model, world_size=world_size, local_world_size=local, default_job=self.run_id
        )
        self.emf = emf.Emitter()
        if self.restart or self.iteration:
            self.emf.emit(emf.restart(self.identity, restart_count=self.restart, iteration=self.iteration))

    def _emit_throughput(self, step: int, seconds: float) -> None:
        if self.emf is None or self.identity is None:
            return
        world_size = dist.get_world_size()
        tokens = self._tokens_per_step()
        self.emf.emit(
            emf.throughput(self.identity, step=step, step_time_s=seconds, tokens=tokens, world_size=world_size)
        )

    def _tokens_per_step(self) -> int:
        """Tokens of one optimizer step over every rank."""
        return self.job.batch_size * self.job.seq_len * dist.get_world_size()

    def _saver(self) -> savers.Saver:
        assert self.saver is not None
        return self.saver

    def _build(self, rank: int, world_size: int, journal: Journal) -> tuple[ckpt.TrainState, torch.device]:
        job = self.job
        if self.plan.device_type == "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
        else:
            device = torch.device("cpu")
        # Checkpoint writes run collectives from a background thread: they get a gloo group of their own.
        self.ckpt_group = dist.new_group(backend="gloo")
        torch.manual_seed(job.seed)
        random.seed(job.seed)
        np.random.seed(job.seed)
        model = load_model(job.model)
        self.source = batch_source(job, int(model.config.vocab_size), rank, world_size)
        shard_model(
            model, device_type=self.plan.device_type, compute_dtype=self.plan.compute_dtype, world_size=world_size
        )
        model.train()
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=job.lr)

        def on_commit(record: savers.SaveRecord) -> None:
            if rank == 0:
                verdict = record.verdict
                assert verdict is not None
                assert record.committed_at is not None  # set by the commit
                journal.event(
                    Event.VERIFIED, step=record.step, verify_s=verdict.seconds, files=verdict.files, bytes=verdict.bytes
                )
                journal.event(
                    Event.COMMIT,
                    step=record.step,
                    stall_s=record.stall_s,
                    commit_wait_s=record.commit_wait_s,
                    **commit_fields(
                        ckpt.step_dir(job.ckpt_dir, record.step),
                        started_at=record.started_at,
                        # The write's throughput: up to the end of the write, not of its read-back.
                        committed_at=record.written_at or record.committed_at,
                    ),
                )
                log(
                    f"checkpoint committed step {record.step} (stall {record.stall_s * 1e3:.1f} ms, commit wait "
                    f"{record.commit_wait_s * 1e3:.1f} ms, read back in {verdict.seconds * 1e3:.1f} ms, "
                    f"{record.saver})"
                )

        def on_verify_failed(record: savers.SaveRecord) -> None:
            if rank == 0:
                verdict = record.verdict
                assert verdict is not None
                where = str(record.quarantined.relative_to(job.ckpt_dir)) if record.quarantined else None
                journal.event(
                    Event.VERIFY_FAILED,
                    step=record.step,
                    reason=verdict.reason,
                    detail=verdict.detail,
                    quarantined_to=where,
                    verify_s=verdict.seconds,
                )
                log(
                    f"checkpoint of step {record.step} failed verification ({verdict.reason}: {verdict.detail}); "
                    f"moved to {where}, not published; the newest published checkpoint is still step "
                    f"{self._saver().last_committed}"
                )

        def before_verify(step: int, directory: Path) -> None:
            if self.injector is not None:
                self.injector.before_verify(step, functools.partial(damage_shard, directory, rank))

        self.saver = savers.make_saver(
            job.ckpt_mode,
            job.ckpt_saver,
            job.ckpt_dir,
            keep=job.ckpt_keep,
            group=self.ckpt_group,
            device=device,
            slow_write_s=job.ckpt_slow_write_s,
            on_commit=on_commit,
            on_verify_failed=on_verify_failed,
            before_verify=before_verify,
            atomic=self._atomic,
        )
        return ckpt.TrainState(model=model, optimizer=self.optimizer), device

    def _resume(self, state: ckpt.TrainState, rank: int, journal: Journal) -> int:
        """Loads the latest complete checkpoint, if any; returns the number of steps already done."""
        job = self.job
        found = ckpt.survey(job.ckpt_dir, self.ckpt_group)
        restored = ckpt.load(job.ckpt_dir, state, self.ckpt_group, found)
        start = restored.step if restored is not None else 0
        self._saver().last_committed = restored.step if restored is not None else None
        if rank == 0:
            if found.incomplete:
                steps = ", ".join(str(s) for s in found.incomplete)
                log(f"ignoring incomplete checkpoint(s) at step {steps} (no {ckpt.MARKER} marker)")
            for skipped in found.skipped:
                log(f"skipped {skipped}")
            if restored is not None:
                log(f"resume from step {start} ({restored.path}, saved by {restored.saver}): {found.chosen_because}")
            else:
                log(f"no verified checkpoint in {job.ckpt_dir}: starting from step 0")
            journal.event(
                Event.RESUMED,
                step=start,
                ignored_incomplete=list(found.incomplete),
                chosen_because=found.chosen_because,
                skipped=list(found.skipped),
            )
        return start

    def _fault_logger(self, journal: Journal) -> Callable[[FaultSpec], None]:
        def on_fire(spec: FaultSpec) -> None:
            completed = spec.step if spec.kind in PHASE else spec.step - 1
            last = self._saver().last_committed
            files: list[str] = []
            if spec.kind is FaultKind.KILL_DURING_SAVE:
                files = sorted(p.name for p in ckpt.step_dir(self.job.ckpt_dir, spec.step).iterdir())
            journal.event(
                Event.FAULT,
                fault=spec.kind.value,
                step=spec.step,
                completed_steps=completed,
                last_committed=last,
                files=files,
            )
            log(f"fault injected: {spec} (last committed checkpoint: step {last})")

        return on_fire

    def _train(
        self,
        state: ckpt.TrainState,
        device: torch.device,
        start: int,
        injector: FaultInjector,
        journal: Journal,
        block: capacity.Deadline | None = None,
    ) -> float:
        """Steps start+1..job.steps; returns the last loss."""
        job, saver, source = self.job, self._saver(), self.source
        assert source is not None
        rank = dist.get_rank()
        loss = math.nan

        def before_update() -> None:
            record = saver.before_update()
            if record is not None and rank == 0:
                journal.event(Event.STAGED, step=record.step, wait_s=record.staged_wait_s)

        for step in range(start + 1, job.steps + 1):
            if block is not None and block.must_stop(self._block_clock(block, step - 1)):
                self._stop_for_block(block, state, step - 1, start, journal)
            saver.poll()
            injector.before_step(step)
            began = time.perf_counter()
            loss = train_step(state.model, state.optimizer, source, step, device, before_update)
            seconds = time.perf_counter() - began
            self.heartbeats.beat()
            self._ping()
            if rank == 0:
                journal.event(Event.STEP, step=step, seconds=seconds, loss=loss, tokens=self._tokens_per_step())
                if step % job.log_every == 0 or step == job.steps:
                    log(f"step {step}/{job.steps} loss {loss:.4f} ({seconds * 1e3:.0f} ms)")
                    self._emit_throughput(step, seconds)
            if job.is_checkpoint_step(step):
                saver.save(step, state)
                if rank == 0:
                    journal.event(Event.SAVE, step=step, saver=saver.name, stall_s=saver.records[-1].stall_s)
                self.heartbeats.beat()
                directory = ckpt.step_dir(job.ckpt_dir, step)
                injector.after_save_started(step, written=functools.partial(shard_written, directory, rank))
            if job.min_step_s > 0:
                time.sleep(max(0.0, job.min_step_s - (time.perf_counter() - began)))
        return loss

    def _write_metrics(self, loss: float, fingerprint: str, numel: int, world_size: int) -> None:
        job = self.job
        summary = summarize(read_journal(job.journal))
        if job.metrics_file is None:
            return
        metrics = {
            "job": asdict(job),
            "world_size": world_size,
            "device": self.plan.device_type,
            "saver": self.saver.name if self.saver is not None else None,
            "target_steps": job.steps,
            "final_loss": loss,
            "param_sha256": fingerprint,
            "param_numel": numel,
            **summary,
        }
        _write_json(job.metrics_file, metrics)
        log(f"metrics written to {job.metrics_file}")

    def _release(self) -> None:
        self.model = self.optimizer = self.saver = self.source = None
        self.ckpt_group = self.clock_group = None
        if dist.is_initialized():
            dist.destroy_process_group()

    def abandon(self) -> None:
        """After a fault: drop every reference to the process groups and destroy them. With gloo, peers blocked in
        a collective with this rank only return (with an error) once its connections close, which happens when
        the last reference to the group goes, not on abort() or destroy_process_group() alone."""
        with contextlib.suppress(Exception):
            if self.saver is not None:
                self.saver.abandon()
        with contextlib.suppress(Exception):
            self.heartbeats.stop()
        self.model = self.optimizer = self.saver = self.source = None
        self.ckpt_group = self.clock_group = None
        with contextlib.suppress(Exception):
            if dist.is_initialized():
                dist.destroy_process_group()
        release_mesh_groups()
        gc.collect()


def release_mesh_groups() -> int:
    """DTensor's sharding caches keep DeviceMesh objects alive after a fault, and a process group a mesh still holds
    stays connected (a gloo peer blocked in a collective with this rank never returns). Where a mesh holds its groups
    depends on torch (torch/distributed/device_mesh.py): 2.13 keeps the ProcessGroup objects in `_pg_registry`,
    emptied here; 2.9, the NVRx image's, keeps only their names (`_dim_group_names`) and resolves them through c10d's
    registry, which destroy_process_group empties, so it holds none. A mesh with neither is a layout this code was not
    checked against (tests/training/test_mesh_release.py, on each image's torch): said in the log. Returns the number
    of groups released."""
    released, unknown = 0, 0
    for obj in gc.get_objects():
        if type(obj) is DeviceMesh:
            registry = getattr(obj, "_pg_registry", None)
            if isinstance(registry, dict):
                released += len(registry)
                registry.clear()
            elif not hasattr(obj, "_dim_group_names"):
                unknown += 1
    if unknown:
        log(
            f"torch {torch.__version__}: {unknown} DeviceMesh(es) hold their process groups neither in _pg_registry "
            "nor by name; a group they hold may keep peers blocked after this fault"
        )
    return released


def train_once(
    job: Job, plan: DevicePlan, *, iteration: int = 0, base_store: Store | None = None, call_wrapper: Any = None
) -> None:
    session = Session(job, plan, iteration=iteration, base_store=base_store, call_wrapper=call_wrapper)
    try:
        session.run()
    except BaseException as exc:
        # The traceback's frames hold the model (and so the process group) alive; clear them first.
        traceback.clear_frames(exc.__traceback__)
        session.abandon()
        raise


# --- in-process restart ------------------------------------------------------------------------------------------


class _NvrxBarrierStore:
    """A Wrapper store whose `barrier` is NVRx's StoreMixin.barrier(ranks, group_name, rendezvous_count, timeout).

    NVRx (0.4.1 to 0.7.0) declares `class TCPStore(torch.distributed.TCPStore, StoreMixin)` (and PrefixStore
    likewise), so where torch's Store has a `barrier(key, world_size, timeout)` of its own (torch 2.13 does), it
    precedes the mixin's and FilterCountGroupedByKey's keyword call fails with TypeError. Every other store method is
    the store's own."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def barrier(self, **kwargs: Any) -> None:
        from nvidia_resiliency_ext.inprocess.store import StoreMixin

        StoreMixin.barrier(self._store, **kwargs)


def node_filter(**kwargs: Any) -> Any:
    """NVRx's FilterCountGroupedByKey, run over a store whose barrier is NVRx's own (see _NvrxBarrierStore)."""
    from nvidia_resiliency_ext.inprocess.rank_assignment import FilterCountGroupedByKey

    class NodeFilter(FilterCountGroupedByKey):  # type: ignore[misc]
        def __call__(self, ctx: Any) -> Any:
            store = ctx.store
            ctx.store = _NvrxBarrierStore(store)
            try:
                result = super().__call__(ctx)
            finally:
                ctx.store = store
            result.store = store
            return result

    return NodeFilter(**kwargs)


# The Wrapper's own TCPStore listens next to --store-addr's (k8s/nvrx_spec.py declares both on the pod and Service).
WRAPPER_STORE_PORT_OFFSET = 1


@functools.cache
def wrapper_store_class() -> type[Any]:
    """The Wrapper's `store_factory`: NVRx's TCPStore, but a client on every rank (its monitor processes too).

    NVRx's own TCPStore (0.4.1 to 0.7.0 inprocess/store.py) makes rank 0's Wrapper the server, so the store closes
    when rank 0's Wrapper returns. Its termination barrier does not prevent that: rank 0 waits only until the last
    rank has arrived, while ranks that arrived before the last still read the arrivals back (reentrant_barrier), and
    such a rank fails with "Connection was likely closed"; its Wrapper shutdown then raises and its process never
    exits (the progress-watchdog thread is left running), which ft_launcher takes for a failed worker group and
    restarts a finished job. Here rank 0's process hosts the server outside the Wrapper (host_wrapper_store) and
    keeps it until every rank has left its Wrapper (leave_together); no rank is critical, so none waits in the
    termination barrier."""
    from nvidia_resiliency_ext.inprocess.store import TCPStore as NvrxTCPStore

    class WrapperStore(NvrxTCPStore):  # type: ignore[misc]
        def __init__(self, *, host_name: str, port: int, timeout: datetime.timedelta) -> None:
            TCPStore.__init__(
                self, host_name=host_name, port=port, is_master=False, timeout=timeout, wait_for_workers=False
            )

        @property
        def critical_ranks(self) -> tuple[int, ...]:
            return ()

    return WrapperStore


def host_wrapper_store(addr: StoreAddress, timeout_s: float) -> TCPStore:
    """The server of the Wrapper's store (rank 0 only), at addr's PORT + WRAPPER_STORE_PORT_OFFSET; it lives as long
    as the returned object."""
    return TCPStore(
        addr.host,
        addr.port + WRAPPER_STORE_PORT_OFFSET,
        is_master=True,
        timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=False,
        use_libuv=True,
    )


def build_wrapper(cfg: InprocessConfig, addr: StoreAddress, plan: DevicePlan) -> Any:
    """NVRx inprocess.Wrapper; its internal store is a client of the server that host_wrapper_store starts on rank 0
    at addr's PORT + WRAPPER_STORE_PORT_OFFSET."""
    from nvidia_resiliency_ext import inprocess

    seconds = datetime.timedelta
    health_check = None
    if plan.device_type == "cuda":
        health_check = inprocess.health_check.CudaHealthCheck(timeout=seconds(seconds=cfg.soft_timeout_s))
    # Node-level rank assignment: a node that lost any rank drops out whole, so the Wrapper never runs a node with
    # a missing rank; the lost rank's exit makes ft_launcher restart every worker (any-failed, NVRx 0.7.0).
    # Compose applies right to left: filter, shift, activate.
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    rank_assignment = inprocess.Compose(
        inprocess.rank_assignment.ActivateAllRanks(),
        inprocess.rank_assignment.ShiftRanks(),
        node_filter(
            key_or_fn=lambda _state: socket.gethostname(),
            condition=lambda count: count == local_world_size,
            timeout=seconds(seconds=cfg.barrier_timeout_s),
        ),
    )
    wrapper = inprocess.Wrapper(
        store_factory=wrapper_store_class(),
        store_kwargs={
            "host_name": addr.host,
            "port": addr.port + WRAPPER_STORE_PORT_OFFSET,
            "timeout": seconds(seconds=cfg.barrier_timeout_s),
        },
        rank_assignment=rank_assignment,
        initialize=inprocess.initialize.RetryController(max_iterations=cfg.max_iterations),
        health_check=health_check,
        soft_timeout=seconds(seconds=cfg.soft_timeout_s),
        hard_timeout=seconds(seconds=cfg.hard_timeout_s),
        heartbeat_timeout=seconds(seconds=cfg.heartbeat_timeout_s),
        barrier_timeout=seconds(seconds=cfg.barrier_timeout_s),
        completion_timeout=seconds(seconds=cfg.barrier_timeout_s),
    )
    if plan.device_type != "cuda":
        # NVRx 0.7 chains GPU, NVLink and NIC checks after ours whenever LOCAL_RANK is set (inprocess/wrap.py
        # _construct_restart_health_check); on a machine without NVML the GPU check fails every restart.
        wrapper.restart_health_check = health_check
    return wrapper


def run_inprocess(job: Job, plan: DevicePlan) -> None:
    from nvidia_resiliency_ext import inprocess

    addr = job.store_addr or default_store_addr()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout_s = job.inprocess.barrier_timeout_s
    # Created once, before the Wrapper (which needs torch.distributed uninitialized), and shared by all iterations.
    base_store = TCPStore(
        addr.host,
        addr.port,
        world_size,
        is_master=rank == 0,
        timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=True,
        multi_tenant=True,
        use_libuv=True,
    )
    # Rank 0 hosts both stores until every rank has left its Wrapper (leave_together), not just its own Wrapper.
    wrapper_host = host_wrapper_store(addr, timeout_s) if rank == 0 else None
    wrapper = build_wrapper(job.inprocess, addr, plan)

    def train_iteration(call_wrapper: inprocess.CallWrapper = None) -> None:  # NVRx injects it
        train_once(job, plan, iteration=call_wrapper.iteration, base_store=base_store, call_wrapper=call_wrapper)

    wrapped: Callable[[], None] = wrapper(train_iteration)
    try:
        wrapped()
    finally:
        leave_together(base_store, rank=rank, world_size=world_size, timeout_s=timeout_s)
        del wrapper_host


# Every rank counts itself out here once its Wrapper has returned (or raised).
LEFT_KEY = "platform/left"


def leave_together(store: Store, *, rank: int, world_size: int, timeout_s: float, poll_s: float = 0.05) -> None:
    """Rank 0 hosts the in-process store and the Wrapper's (host_wrapper_store) and leaves last: it waits until
    every rank has counted itself out here after its Wrapper returned or raised, up to `timeout_s` (a rank that died
    never does)."""
    try:
        store.add(LEFT_KEY, 1)
        if rank != 0:
            return
        deadline = time.monotonic() + timeout_s
        while store.add(LEFT_KEY, 0) < world_size and time.monotonic() < deadline:
            time.sleep(poll_s)
    except (RuntimeError, OSError):
        # The store is gone (rank 0 died): nothing is left to protect.
        return


LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def main(argv: Sequence[str] | None = None) -> int:
    job, check_only = parse_command(argv)
    if check_only:
        return check_job(job)
    missing = [name for name in LAUNCHER_VARIABLES if name not in os.environ]
    if missing:
        raise SystemExit(
            f"{', '.join(missing)} not set: start this under ft_launcher or torchrun, e.g. "
            "ft_launcher --nproc-per-node 2 -m training.nvrx_fsdp --ckpt-dir DIR"
        )
    try:
        plan = plan_device(job.device)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    if job.inprocess.enabled:
        run_inprocess(job, plan)
    else:
        train_once(job, plan)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
