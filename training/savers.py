"""The savers of training/checkpointing.py's step checkpoints, behind one interface (`Saver`): each writes a step,
reads it back (training/ckpt_verify.py) off the step loop, and publishes it with the COMMITTED marker or quarantines it.

  * TorchAsyncSaver: torch.distributed.checkpoint.async_save (stages to CPU memory in a thread while the next step's
    forward and backward run, writes in another); CPU and GPU.
  * NvrxAsyncSaver: NVRx's async_ckpt (FileSystemWriterAsync + a persistent writer process); NVRx's cross-rank
    completion checks allocate CUDA tensors, so on CPU it only finalizes blocking (at the next save or the end).
  * SyncSaver: dcp.save and commit before returning; the baseline for stall measurements.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse, async_save, save
from torch.futures import Future as TorchFuture

from training import ckpt_verify
from training.checkpointing import (
    EXTRA_FILE,
    Commit,
    SaverName,
    TrainState,
    capture_rng,
    cleanup,
    dcp_state,
    step_dir,
    write_marker,
)
from training.nvrx_config import NVRX_SAVER_NEEDS_CUDA


@dataclass
class SaveRecord:
    """One save. stall_s: how long save() blocked the step loop (for async: waiting for the previous save, state
    dict, planning), plus staged_wait_s: how long the next optimizer step waited for the copy to CPU memory to end;
    commit_wait_s: later blocking spent committing it (completion checks, marker)."""

    step: int
    saver: str
    stall_s: float = 0.0
    staged_wait_s: float = 0.0
    started_at: float = 0.0
    commit_wait_s: float = 0.0
    committed_at: float | None = None
    verify_s: float = 0.0
    written_at: float | None = None
    verdict: ckpt_verify.Verdict | None = None
    quarantined: Path | None = None


class Saver(Protocol):
    name: SaverName
    records: list[SaveRecord]
    last_committed: int | None

    def save(self, step: int, state: TrainState) -> None:
        """Starts saving step; finalizes the previous save first."""

    def before_update(self) -> SaveRecord | None:
        """Called before every optimizer step: blocks until the pending save no longer reads the live parameters and
        optimizer state; returns its record the first time it did (its staged_wait_s set), else None."""

    def poll(self) -> int | None:
        """Commits a finished save without blocking on the write; every rank must call it at the same point."""

    def finalize(self) -> int | None:
        """Blocks until the pending save, if any, is published or quarantined; returns its step."""

    def close(self) -> None: ...

    def abandon(self) -> None:
        """Drops a pending save after a fault, without committing it (its directory stays incomplete)."""


class SlowFileSystemWriter(FileSystemWriter):
    """Test-only: writes the shard files, then waits before reporting them written, so a save can be observed
    (and killed) half-written: data files present, no .metadata, no COMMITTED."""

    def __init__(self, path: Path, delay_s: float) -> None:
        super().__init__(path)
        self.delay_s = delay_s

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> TorchFuture[list[Any]]:
        future = super().write_data(plan, planner)
        time.sleep(self.delay_s)
        return future


def _writer(directory: Path, slow_write_s: float) -> tuple[FileSystemWriter, ckpt_verify.HashingFileSystem]:
    writer = SlowFileSystemWriter(directory, slow_write_s) if slow_write_s > 0 else FileSystemWriter(directory)
    return writer, ckpt_verify.hash_writes(writer)


def in_background(work: Callable[[], ckpt_verify.Verdict]) -> Future[ckpt_verify.Verdict]:
    """Runs `work` in a daemon thread: a read-back stuck on a dead file system never keeps the process alive."""
    future: Future[ckpt_verify.Verdict] = Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(work())
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=run, name="ckpt-verify", daemon=True).start()
    return future


class _SaverBase:
    name: SaverName

    def __init__(
        self,
        root: Path,
        *,
        keep: int,
        group: dist.ProcessGroup,
        device: torch.device,
        slow_write_s: float = 0.0,
        on_commit: Callable[[SaveRecord], None] | None = None,
        on_verify_failed: Callable[[SaveRecord], None] | None = None,
        before_verify: Callable[[int, Path], None] | None = None,
        atomic: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    ) -> None:
        """on_commit: a save was verified and published; on_verify_failed: it was quarantined (record.verdict
        says why). before_verify(step, directory): runs on every rank between the write and its read-back (the
        corrupt-shard and torn-save faults)."""
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.root = root
        self.keep = keep
        self.group = group
        self.device = device
        self.slow_write_s = slow_write_s
        self.on_commit = on_commit
        self.on_verify_failed = on_verify_failed
        self.before_verify = before_verify
        self.atomic = atomic
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.records: list[SaveRecord] = []
        self.last_committed: int | None = None
        self._extra: dict[str, ckpt_verify.FileDigest] = {}
        # A save written and being read back in the background, with the verdict to come.
        self._verifying: tuple[SaveRecord, Future[ckpt_verify.Verdict]] | None = None

    def _prepare(self, step: int) -> Path:
        """Empties the step directory (a leftover of an interrupted save of the same step), writes this rank's
        extras. Collective: no rank writes before rank 0 has cleared the directory."""
        directory = step_dir(self.root, step)
        if self.rank == 0:
            if directory.exists():
                shutil.rmtree(directory)
            directory.mkdir(parents=True)
        dist.barrier()
        extra = {"step": step, "data_step": step, "world_size": self.world_size, "rng": capture_rng()}
        buffer = io.BytesIO()
        torch.save(extra, buffer)
        name = EXTRA_FILE.format(rank=self.rank)
        with (directory / name).open("wb") as out:
            out.write(buffer.getbuffer())
            out.flush()
            os.fsync(out.fileno())
        self._extra = {name: ckpt_verify.hash_bytes(buffer.getvalue())}
        return directory

    def _read_back(
        self,
        record: SaveRecord,
        written: Callable[[], dict[str, ckpt_verify.FileDigest]],
        source: str,
        wait: Future[Any] | None = None,
    ) -> ckpt_verify.Verdict:
        """This rank's verdict on its part of the save (background thread, or inline for the sync saver): waits
        for the write (a failed write is a failed verdict, so every rank still agrees on the outcome), records the
        manifest, reads every file back."""
        extra = dict(self._extra)  # this save's: the next save replaces it only after this one is settled
        if wait is not None:
            try:
                wait.result()
            except (Exception, CheckpointException) as exc:  # DCP's exception derives from BaseException
                # DCP's exception carries every failed rank's traceback: its last line names the error.
                lines = str(exc).strip().splitlines() or [type(exc).__name__]
                detail = f"rank {self.rank}: {lines[-1]}"
                return ckpt_verify.Verdict(False, "write-failed", detail, 0, 0, 0.0)
        record.written_at = time.time()
        directory = step_dir(self.root, record.step)
        expected = {**extra, **written()}
        ckpt_verify.write_manifest(directory, self.rank, expected, source=source)
        if self.before_verify is not None:
            self.before_verify(record.step, directory)
        return ckpt_verify.verify_rank(directory, self.rank, expected)

    def _verify_done(self, blocking: bool) -> int | None:
        """Publishes (or quarantines) the save being read back once every rank has its verdict; without
        `blocking`, only if every rank already has. Every rank must call it at the same point."""
        if self._verifying is None:
            return None
        record, future = self._verifying
        if not blocking:
            # All ranks must agree that their read-back is done before any publishes (MIN of "done" flags).
            done = torch.tensor([1 if future.done() else 0], dtype=torch.int32, device=self.device)
            dist.all_reduce(done, op=dist.ReduceOp.MIN)
            if int(done.item()) == 0:
                return None
        self._verifying = None
        self._publish(record, future.result())
        return record.step

    def _publish(self, record: SaveRecord, mine: ckpt_verify.Verdict) -> None:
        """Every rank's verdict to every rank; rank 0 then writes COMMITTED if all verified, or renames the step
        directory to DIR/quarantine/step_N.REASON. Collective."""
        verdicts: list[ckpt_verify.Verdict | None] = [None] * self.world_size
        dist.all_gather_object(verdicts, mine, group=self.group)
        verdict = ckpt_verify.combine(v for v in verdicts if v is not None)
        record.verdict, record.verify_s = verdict, verdict.seconds
        directory = step_dir(self.root, record.step)
        if self.rank == 0:
            with self.atomic():
                if verdict.ok:
                    commit = Commit(
                        step=record.step,
                        world_size=self.world_size,
                        finalized_at=time.time(),
                        saver=self.name,
                        verified=True,
                    )
                    write_marker(directory, commit)
                else:
                    record.quarantined = ckpt_verify.quarantine(directory, verdict.reason)
            cleanup(self.root, self.keep)
        dist.barrier()
        if not verdict.ok:
            if self.on_verify_failed is not None:
                self.on_verify_failed(record)
            return
        record.committed_at = time.time()
        self.last_committed = record.step
        if self.on_commit is not None:
            self.on_commit(record)

    def before_update(self) -> SaveRecord | None:
        return None

    def _start_record(self, step: int) -> SaveRecord:
        record = SaveRecord(step=step, saver=self.name, started_at=time.time())
        self.records.append(record)
        return record


class SyncSaver(_SaverBase):
    name: SaverName = "sync"

    def save(self, step: int, state: TrainState) -> None:
        start = time.perf_counter()
        record = self._start_record(step)
        directory = self._prepare(step)
        writer, hashed = _writer(directory, self.slow_write_s)
        save(dcp_state(state), storage_writer=writer, process_group=self.group)
        # Sync: the read-back blocks like the write (the baseline the async savers are measured against).
        self._publish(record, self._read_back(record, lambda: dict(hashed.digests), "write"))
        record.stall_s = time.perf_counter() - start

    def poll(self) -> int | None:
        return None

    def finalize(self) -> int | None:
        return None

    def close(self) -> None:
        pass

    def abandon(self) -> None:
        pass


class TorchAsyncSaver(_SaverBase):
    """dcp.async_save in background threads over `group`, which must be a gloo group used by nothing else:
    the threads' collectives would otherwise interleave with the training loop's on the same group.

    The state is copied to CPU memory in a thread of its own (torch's DefaultStager with use_async_staging) while the
    next step's forward and backward run; the state dict holds the live parameters and optimizer state, so the
    optimizer step waits for that copy first (before_update)."""

    name: SaverName = "torch-async"

    def __init__(self, root: Path, **kwargs: Any) -> None:
        super().__init__(root, **kwargs)
        self._upload: Future[Any] | None = None
        self._staging: tuple[SaveRecord, Future[Any]] | None = None
        cuda = self.device.type == "cuda"
        # Pinned memory and non-blocking copies need an accelerator (torch staging.py StagingOptions); shared memory
        # is for a writer in another process, and the writer here is a thread.
        self._stager = DefaultStager(
            StagingOptions(
                use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=True, use_non_blocking_copy=cuda
            )
        )

    def save(self, step: int, state: TrainState) -> None:
        start = time.perf_counter()
        self.finalize()
        record = self._start_record(step)
        directory = self._prepare(step)
        writer, hashed = _writer(directory, self.slow_write_s)
        response = async_save(
            dcp_state(state), storage_writer=writer, process_group=self.group, async_stager=self._stager
        )
        if not isinstance(response, AsyncSaveResponse):
            raise TypeError(f"async_save with a stager returned {type(response).__name__}, not AsyncSaveResponse")
        upload = response.upload_completion
        self._upload = upload
        verdict = in_background(lambda: self._read_back(record, lambda: dict(hashed.digests), "write", wait=upload))
        self._verifying = (record, verdict)
        self._staging = (record, response.staging_completion)
        record.stall_s = time.perf_counter() - start

    def before_update(self) -> SaveRecord | None:
        if self._staging is None:
            return None
        record, future = self._staging
        self._staging = None
        start = time.perf_counter()
        future.result()
        record.staged_wait_s = time.perf_counter() - start
        return record

    def poll(self) -> int | None:
        return self._settle(blocking=False)

    def finalize(self) -> int | None:
        return self._settle(blocking=True)

    def _settle(self, blocking: bool) -> int | None:
        if self._verifying is None:
            return None
        record = self._verifying[0]
        start = time.perf_counter()
        step = self._verify_done(blocking)
        if step is not None:
            self._upload = None
            self._staging = None  # the write began after the copy ended
        record.commit_wait_s += time.perf_counter() - start
        return step

    def close(self) -> None:
        self.finalize()
        self._stager.close()

    def abandon(self) -> None:
        self._staging = None
        self._verifying = None
        future, self._upload = self._upload, None
        if future is None:
            return
        # The write's collectives fail once the process groups are torn down; do not hang on it.
        with contextlib.suppress(Exception):
            future.exception(timeout=5.0)


# How often a blocking finalize looks for NVRx's writer's answer (and at the writer).
WRITER_POLL_S = 0.05


class NvrxAsyncSaver(_SaverBase):
    """NVRx async_ckpt: FileSystemWriterAsync plans the save on the training thread, a persistent spawned process
    writes it (after copying GPU tensors to host memory itself, via preload_fn), and the finalize function (DCP
    metadata, then starting our read-back) runs on every rank through AsyncCallsQueue.maybe_finalize_async_calls;
    the read-back runs in a thread and is published at a later poll, as with the torch saver. The writer process's
    bytes cannot be hashed as written here: the manifest hashes the files once NVRx reports them written
    (source "read-after-write"), and the read-back then catches what changes after that and, through the metadata,
    any file shorter than the data it should hold.

    CUDA only: NVRx 0.7.0 checks completion across ranks, and finalizes, with tensors on torch.cuda.current_device()
    (async_ckpt/core.py, state_dict_saver.py save_state_dict_async_finalize), and its writer takes
    `rank % torch.cuda.device_count()` first (core.py async_process_target).

    NVRx's blocking wait polls a queue the writer answers on and never looks at the writer itself: a writer that
    died (the OOM killer, a CUDA error) leaves the rank waiting until ft_launcher's heartbeat timeout.
    Waits here poll without blocking and fail at once, naming the exit code, once the writer is gone."""

    name: SaverName = "nvrx-async"

    def __init__(self, root: Path, **kwargs: Any) -> None:
        super().__init__(root, **kwargs)
        if self.slow_write_s > 0:
            raise ValueError("the slow-write test knob is only supported by the torch savers")
        if self.device.type != "cuda":
            raise ValueError(NVRX_SAVER_NEEDS_CUDA)
        from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncCallsQueue

        self._queue = AsyncCallsQueue(persistent=True)
        self._pending: SaveRecord | None = None

    def save(self, step: int, state: TrainState) -> None:
        from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncRequest
        from nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async import FileSystemWriterAsync
        from nvidia_resiliency_ext.checkpointing.async_ckpt.state_dict_saver import (
            save_state_dict_async_finalize,
            save_state_dict_async_plan,
        )

        start = time.perf_counter()
        self.finalize()
        record = self._start_record(step)
        directory = self._prepare(step)
        writer = FileSystemWriterAsync(str(directory), thread_count=1)
        plan = save_state_dict_async_plan(dcp_state(state), writer, self.group, 0, planner=DefaultSavePlanner())
        save_fn, preload_fn, save_args = writer.get_save_function_and_args()

        def finalize_fn() -> None:
            save_state_dict_async_finalize(*plan)
            self._verifying = (record, in_background(lambda: self._read_back(record, written, "read-after-write")))

        def written() -> dict[str, ckpt_verify.FileDigest]:
            names = [p.name for p in directory.glob(f"__{self.rank}_*")]
            if self.rank == 0:
                names.append(ckpt_verify.METADATA)
            return {name: ckpt_verify.hash_file(directory / name) for name in names}

        request = AsyncRequest(save_fn, save_args, [finalize_fn], preload_fn=preload_fn)
        self._queue.schedule_async_request(request)
        self._pending = record
        record.stall_s = time.perf_counter() - start

    def _finalize(self, blocking: bool) -> int | None:
        record = self._pending
        if record is None:
            return None
        start = time.perf_counter()
        # Each poll's verdict is all-reduced, so every rank goes round this loop equally often.
        self._queue.maybe_finalize_async_calls(blocking=False, no_dist=False)
        while blocking and self._queue.get_num_unfinalized_calls() > 0:
            self._require_writer(record)
            time.sleep(WRITER_POLL_S)
            self._queue.maybe_finalize_async_calls(blocking=False, no_dist=False)
        step = None
        if self._queue.get_num_unfinalized_calls() == 0:
            step = self._verify_done(blocking)
        record.commit_wait_s += time.perf_counter() - start
        if step is None:
            return None
        self._pending = None
        return step

    def _require_writer(self, record: SaveRecord) -> None:
        caller = self._queue.persistent_caller
        process = getattr(caller, "process", None)
        if process is not None and not process.is_alive():
            raise RuntimeError(
                f"NVRx's checkpoint writer (pid {process.pid}) exited with code {process.exitcode} before finishing "
                f"the save of step {record.step}; the save is not committed (its output is in this rank's log)"
            )

    def poll(self) -> int | None:
        return self._finalize(blocking=False)

    def finalize(self) -> int | None:
        return self._finalize(blocking=True)

    def close(self) -> None:
        self.finalize()
        self._queue.close()

    def abandon(self) -> None:
        self._pending = None
        self._verifying = None
        caller = self._queue.persistent_caller
        if caller is not None and caller.process is not None:
            caller.process.kill()
            caller.process = None
        self._queue.async_calls.clear()


def make_saver(
    mode: Literal["async", "sync"], backend: Literal["auto", "torch", "nvrx"], root: Path, **kwargs: Any
) -> Saver:
    """sync: SyncSaver. async: NVRx's saver on CUDA (or when asked for), torch's async_save otherwise."""
    if mode == "sync":
        return SyncSaver(root, **kwargs)
    device: torch.device = kwargs["device"]
    if backend == "nvrx" or (backend == "auto" and device.type == "cuda"):
        return NvrxAsyncSaver(root, **kwargs)
    return TorchAsyncSaver(root, **kwargs)
