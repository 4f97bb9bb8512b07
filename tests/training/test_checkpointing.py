"""Checkpoint layout, commit markers and cleanup; save/load round trips of an FSDP2 model with every saver.

The round trips run in this process, in a one-rank gloo world (the multi-rank behaviour is covered by the real
ft_launcher runs in test_nvrx_fsdp.py).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import HashStore
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from training import checkpointing as ckpt
from training import ckpt_verify, savers
from training.checkpointing import MARKER, Commit, TrainState


def commit_dir(root: Path, step: int, *, world_size: int = 2) -> Path:
    directory = ckpt.step_dir(root, step)
    directory.mkdir(parents=True)
    (directory / "__0_0.distcp").write_bytes(b"shard")
    digests = {"__0_0.distcp": ckpt_verify.hash_file(directory / "__0_0.distcp")}
    for rank in range(world_size):
        ckpt_verify.write_manifest(directory, rank, digests if rank == 0 else {}, source="write")
    ckpt.write_marker(
        directory, Commit(step=step, world_size=world_size, finalized_at=time.time(), saver="sync", verified=True)
    )
    return directory


def partial_dir(root: Path, step: int) -> Path:
    directory = ckpt.step_dir(root, step)
    directory.mkdir(parents=True)
    (directory / "__0_0.distcp").write_bytes(b"half a shard")
    return directory


def test_step_directory_names() -> None:
    assert ckpt.step_dir(Path("/c"), 123) == Path("/c/step_000000123")
    assert ckpt.parse_step("step_000000123") == 123
    for name in (
        "step_123",
        "step_00000012a",
        "step_" + "\uff10" * 7 + "\uff11\uff12",
        "tmp",
        "step_",
        "xstep_000000001",
    ):
        assert ckpt.parse_step(name) is None, name


def test_marker_is_written_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    commit = Commit(step=4, world_size=2, finalized_at=1.5, saver="torch-async", verified=True)
    directory = partial_dir(tmp_path, 4)
    ckpt.write_marker(directory, commit)
    assert ckpt.read_marker(directory) == commit
    assert json.loads((directory / MARKER).read_text()) == {
        "step": 4,
        "world_size": 2,
        "finalized_at": 1.5,
        "saver": "torch-async",
        "verified": True,
    }
    assert sorted(p.name for p in directory.iterdir()) == [MARKER, "__0_0.distcp"], "no temporary file left behind"

    # A crash between writing the temporary file and renaming it leaves no marker, only the temporary file.
    other = partial_dir(tmp_path, 6)

    def crash(src: Any, dst: Any) -> None:
        raise OSError("power cut")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="power cut"):
        ckpt.write_marker(other, Commit(step=6, world_size=2, finalized_at=2.0, saver="sync", verified=True))
    assert not (other / MARKER).exists()
    assert ckpt.read_marker(other) is None
    assert ckpt.latest_complete(tmp_path) == directory


def test_latest_complete_ignores_partial_and_stray_entries(tmp_path: Path) -> None:
    assert ckpt.latest_complete(tmp_path / "missing") is None
    assert ckpt.latest_complete(tmp_path) is None
    commit_dir(tmp_path, 2)
    newest = commit_dir(tmp_path, 4)
    partial_dir(tmp_path, 6)  # a save cut short: shards, no marker
    truncated = partial_dir(tmp_path, 8)
    (truncated / MARKER).write_text('{"step": 8, "world')  # torn marker (written without the atomic rename)
    mismatched = partial_dir(tmp_path, 10)
    (mismatched / MARKER).write_text(json.dumps({"step": 9, "world_size": 2, "finalized_at": 0, "saver": "x"}))
    (tmp_path / "step_000000012").write_text("a file, not a directory")
    (tmp_path / "step_abc").mkdir()
    (tmp_path / "lost+found").mkdir()
    (tmp_path / "journal.jsonl").write_text("{}\n")

    assert ckpt.latest_complete(tmp_path) == newest
    assert ckpt.committed_steps(tmp_path) == [2, 4]
    assert ckpt.incomplete_steps(tmp_path) == [6, 8, 10]


def test_resume_takes_the_newest_verified_step_and_says_what_it_skipped(tmp_path: Path) -> None:
    commit_dir(tmp_path, 2)
    newest = commit_dir(tmp_path, 4)
    # A marker written before saves were verified (no `verified`): committed, never read back.
    legacy = partial_dir(tmp_path, 6)
    (legacy / MARKER).write_text(json.dumps({"step": 6, "world_size": 2, "finalized_at": 0, "saver": "sync"}))
    partial_dir(tmp_path, 8)
    quarantined = commit_dir(tmp_path, 10)
    ckpt_verify.quarantine(quarantined, "hash-mismatch")

    assert ckpt.latest_complete(tmp_path) == newest
    found = ckpt.take_survey(tmp_path)
    assert found.latest == 4
    assert found.incomplete == (8,)
    assert found.skipped == (
        "step 6: committed before saves were verified, and its metadata does not check out (metadata-unloadable)",
        "step 8: no COMMITTED marker (a save cut short)",
        "step 10: quarantined as quarantine/step_000000010.hash-mismatch",
    )
    assert found.chosen_because == "step 4 is the newest checkpoint whose read-back verified"
    assert ckpt.take_survey(tmp_path / "empty").chosen_because == "no verified checkpoint: starting from step 0"


def test_a_verified_step_whose_files_shrank_or_went_since_is_passed_over_at_resume(tmp_path: Path) -> None:
    """Verified when saved, damaged after (a file deleted or truncated on the file system): the resume checks every
    file's size against the save's manifests and takes the newest step that is still whole."""
    commit_dir(tmp_path, 2)
    torn, gone, lost = commit_dir(tmp_path, 4), commit_dir(tmp_path, 6), commit_dir(tmp_path, 8)
    (torn / "__0_0.distcp").write_bytes(b"sh")
    (gone / "__0_0.distcp").unlink()
    (lost / ckpt_verify.manifest_name(1)).unlink()
    found = ckpt.take_survey(tmp_path)
    assert found.latest == 2
    assert found.skipped == (
        "step 4: verified when saved, but torn now: __0_0.distcp holds 2 bytes, 5 were written",
        "step 6: verified when saved, but missing-file now: __0_0.distcp is missing",
        "step 8: verified when saved, but no-manifest now: manifest-rank1.json is missing or unreadable",
    )
    assert found.chosen_because == "step 2 is the newest checkpoint whose read-back verified"


def legacy_dir(root: Path, step: int) -> Path:
    """A save committed by the code before verification: a real DCP checkpoint, a marker without `verified`."""
    from torch.distributed.checkpoint.state_dict_saver import save

    directory = ckpt.step_dir(root, step)
    directory.mkdir(parents=True)
    save({"w": torch.ones(4, 4), "step": step}, storage_writer=FileSystemWriter(directory), no_dist=True)
    (directory / MARKER).write_text(json.dumps({"step": step, "world_size": 1, "finalized_at": 0, "saver": "sync"}))
    return directory


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_an_upgrade_resumes_from_the_newest_checkpoint_saved_before_verification(tmp_path: Path) -> None:
    """Saves from before verification have no hashes to compare, but their metadata and files can be checked: a job
    upgraded mid-run resumes from them instead of from step 0; a newer verified save still wins."""
    commit_dir(tmp_path, 2)
    legacy_dir(tmp_path, 6)
    found = ckpt.take_survey(tmp_path)
    assert found.latest == 6
    assert found.chosen_because == (
        "step 6 was committed before saves were verified: its metadata loads and every file it names is whole "
        "(no hashes to compare)"
    )
    assert ckpt.latest_complete(tmp_path) == ckpt.step_dir(tmp_path, 6)
    commit_dir(tmp_path, 8)
    assert ckpt.take_survey(tmp_path).latest == 8
    shard = next(ckpt.step_dir(tmp_path, 6).glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:8])  # torn after the fact: not loadable, not chosen
    (ckpt.step_dir(tmp_path, 8) / MARKER).unlink()
    torn = ckpt.take_survey(tmp_path)
    assert torn.latest == 2
    assert any(
        reason.startswith("step 6: committed before saves were verified, and its metadata does not check out (torn")
        for reason in torn.skipped
    ), torn.skipped


def test_cleanup_keeps_the_newest_committed(tmp_path: Path) -> None:
    for step in (2, 4, 6):
        commit_dir(tmp_path, step)
    partial_dir(tmp_path, 3)  # older than the newest committed: a dead save
    partial_dir(tmp_path, 8)  # newer: maybe a save in progress
    assert ckpt.cleanup(tmp_path, keep=2) == [2, 3]
    assert ckpt.committed_steps(tmp_path) == [4, 6]
    assert ckpt.incomplete_steps(tmp_path) == [8]
    assert ckpt.cleanup(tmp_path, keep=1) == [4]
    assert ckpt.committed_steps(tmp_path) == [6]
    assert ckpt.cleanup(tmp_path, keep=1) == []
    assert ckpt.latest_complete(tmp_path) == ckpt.step_dir(tmp_path, 6)
    with pytest.raises(ValueError, match="keep must be at least 1"):
        ckpt.cleanup(tmp_path, keep=0)
    assert ckpt.committed_steps(tmp_path) == [6]


def test_cleanup_keeps_only_the_newest_quarantined_saves(tmp_path: Path) -> None:
    """A file system failing every read-back would otherwise fill up with quarantined saves, each a full one."""
    for step, reason in ((2, "torn"), (4, "hash-mismatch"), (4, "hash-mismatch"), (10, "torn")):
        ckpt_verify.quarantine(commit_dir(tmp_path, step), reason)
    commit_dir(tmp_path, 12)
    ckpt.cleanup(tmp_path, keep=2)
    assert ckpt_verify.quarantined(tmp_path) == ["step_000000004.hash-mismatch.1", "step_000000010.torn"]


# --- round trips in a one-rank gloo world ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ckpt_group() -> Iterator[dist.ProcessGroup]:
    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        yield dist.new_group(backend="gloo")
    finally:
        dist.destroy_process_group()


def make_state() -> TrainState:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    mesh = init_device_mesh("cpu", (1,))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    state = TrainState(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2))
    train(state)
    return state


def train(state: TrainState) -> None:
    loss = state.model(torch.randn(4, 8)).square().mean()
    loss.backward()
    state.optimizer.step()
    state.optimizer.zero_grad()


def full(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().clone()


def snapshot(state: TrainState) -> dict[str, torch.Tensor]:
    out = {f"param.{name}": full(p) for name, p in state.model.named_parameters()}
    for index, param in enumerate(state.model.parameters()):
        for key, value in state.optimizer.state[param].items():
            out[f"optim.{index}.{key}"] = full(value)
    return out


def assert_same(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> None:
    assert left.keys() == right.keys()
    for key in left:
        assert torch.equal(left[key], right[key]), key


def draw() -> tuple[list[float], float, float]:
    return torch.rand(3).tolist(), random.random(), float(np.random.rand())


def new_saver(name: str, root: Path, group: dist.ProcessGroup, **kwargs: Any) -> savers.Saver:
    mode: Literal["async", "sync"] = "sync" if name == "sync" else "async"
    backend: Literal["torch", "nvrx"] = "nvrx" if name == "nvrx-async" else "torch"
    return savers.make_saver(mode, backend, root, keep=2, group=group, device=torch.device("cpu"), **kwargs)


@pytest.mark.timeout(120)
# NVRx's async writer starts a process of its own (and a multiprocessing manager): a training process.
@pytest.mark.parametrize("name", ["sync", "torch-async"])
def test_round_trip_restores_model_optimizer_and_rng(ckpt_group: dist.ProcessGroup, tmp_path: Path, name: str) -> None:
    state = make_state()
    commits: list[int] = []
    saver = new_saver(name, tmp_path, ckpt_group, on_commit=lambda record: commits.append(record.step))
    assert saver.name == name
    try:
        torch.manual_seed(11)
        random.seed(12)
        np.random.seed(13)
        saver.save(5, state)
        expected_draws = draw()
        saved = snapshot(state)
        assert saver.finalize() in (5, None)  # None: the sync saver had already committed
        assert commits == [5]
        assert saver.last_committed == 5
        record = saver.records[-1]
        assert record.step == 5
        assert record.stall_s > 0
        assert record.committed_at is not None
    finally:
        saver.close()
    marker = ckpt.read_marker(ckpt.step_dir(tmp_path, 5))
    assert marker is not None
    assert (marker.step, marker.world_size, marker.saver) == (5, 1, name)
    assert marker.finalized_at <= record.committed_at

    train(state)  # the model and optimizer move on, and the RNGs with them
    assert not torch.equal(snapshot(state)["param.0.weight"], saved["param.0.weight"])
    partial_dir(tmp_path, 6)  # a newer save that never finished
    restored = ckpt.load(tmp_path, state, ckpt_group)
    assert restored is not None
    assert (restored.step, restored.saver, restored.rng_restored) == (5, name, True)
    assert_same(snapshot(state), saved)
    assert draw() == expected_draws


@pytest.mark.timeout(60)
def test_the_torch_async_save_copies_the_state_while_the_next_step_runs(
    ckpt_group: dist.ProcessGroup, tmp_path: Path
) -> None:
    """save() returns before the copy to CPU memory ends; the optimizer step waits for it (before_update), so what
    is written is the state at save(), although the model moved on before the write finished."""
    state = make_state()
    saver = new_saver("torch-async", tmp_path, ckpt_group, slow_write_s=0.5)
    try:
        saver.save(3, state)
        saved = snapshot(state)
        record = saver.before_update()
        assert record is not None
        assert record.step == 3
        assert record.staged_wait_s >= 0
        assert saver.before_update() is None  # once per save
        train(state)  # the optimizer step the copy had to wait for, before the slow write has ended
        assert saver.finalize() == 3
    finally:
        saver.close()
    assert ckpt.load(tmp_path, state, ckpt_group) is not None
    assert_same(snapshot(state), saved)


def test_a_saves_stall_includes_the_wait_for_its_copy() -> None:
    from training.journal import Event, summarize

    context = {"run_id": "r", "restart": 0, "iteration": 0}
    events = [
        {"event": Event.SAVE, "step": 2, "saver": "torch-async", "stall_s": 0.01, "time": 1.0, **context},
        {"event": Event.STAGED, "step": 2, "wait_s": 0.03, "time": 1.1, **context},
        {"event": Event.SAVE, "step": 4, "saver": "torch-async", "stall_s": 0.02, "time": 2.0, **context},
    ]
    saves = summarize(events)["saves"]
    assert [(s["step"], round(s["stall_s"], 6)) for s in saves] == [(2, 0.04), (4, 0.02)]


def test_the_nvrx_saver_is_refused_on_cpu_naming_the_fix(ckpt_group: dist.ProcessGroup, tmp_path: Path) -> None:
    """NVRx 0.7.0 finalizes async saves with CUDA tensors (0.4.1 ran this round trip on CPU); the GPU smoke runs it."""
    with pytest.raises(ValueError, match=r"--ckpt-saver nvrx needs --device cuda.*use --ckpt-saver torch or auto"):
        new_saver("nvrx-async", tmp_path, ckpt_group)


def test_a_dead_nvrx_writer_fails_the_wait_instead_of_hanging_it() -> None:
    """NVRx's own blocking wait polls a queue only its writer answers; ours looks at the writer too."""
    import multiprocessing
    from types import SimpleNamespace

    writer = multiprocessing.get_context("spawn").Process(target=os._exit, args=(3,))
    writer.start()
    writer.join()
    saver = savers.NvrxAsyncSaver.__new__(savers.NvrxAsyncSaver)
    saver._queue = SimpleNamespace(persistent_caller=SimpleNamespace(process=writer))
    with pytest.raises(RuntimeError, match=rf"writer \(pid {writer.pid}\) exited with code 3 before .* step 7"):
        saver._require_writer(savers.SaveRecord(step=7, saver="nvrx-async"))


def test_load_without_a_committed_checkpoint_returns_none(ckpt_group: dist.ProcessGroup, tmp_path: Path) -> None:
    partial_dir(tmp_path, 2)
    assert ckpt.load(tmp_path, make_state(), ckpt_group) is None
    found = ckpt.survey(tmp_path, ckpt_group)
    assert (found.latest, found.incomplete) == (None, (2,))


@pytest.mark.timeout(60)
def test_async_save_commits_only_after_the_write_finished(ckpt_group: dist.ProcessGroup, tmp_path: Path) -> None:
    state = make_state()
    saver = new_saver("torch-async", tmp_path, ckpt_group, slow_write_s=1.0)
    saver.save(2, state)
    assert saver.poll() is None, "the write is still sleeping: nothing to commit yet"
    assert ckpt.latest_complete(tmp_path) is None
    assert ckpt.incomplete_steps(tmp_path) == [2]
    deadline = time.monotonic() + 30
    while saver.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ckpt.committed_steps(tmp_path) == [2]

    # A new save first finalizes the previous one; keep=2 then drops the oldest.
    for step in (4, 6):
        saver.save(step, state)
    assert ckpt.committed_steps(tmp_path) == [2, 4]
    assert saver.finalize() == 6
    assert ckpt.committed_steps(tmp_path) == [4, 6]
    assert [r.step for r in saver.records if r.committed_at is not None] == [2, 4, 6]
    saver.close()


@pytest.mark.timeout(60)
def test_abandoned_save_is_never_committed(ckpt_group: dist.ProcessGroup, tmp_path: Path) -> None:
    state = make_state()
    saver = new_saver("torch-async", tmp_path, ckpt_group, slow_write_s=0.5)
    saver.save(3, state)
    saver.abandon()  # what a fault in the middle of the write leads to
    assert saver.finalize() is None
    assert ckpt.latest_complete(tmp_path) is None
    assert ckpt.incomplete_steps(tmp_path) == [3]
    assert ckpt.load(tmp_path, state, ckpt_group) is None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["sync", "torch-async"])
@pytest.mark.parametrize("damage", [ckpt_verify.corrupt, ckpt_verify.truncate])
def test_a_save_damaged_before_its_read_back_is_quarantined_and_the_previous_one_resumed(
    ckpt_group: dist.ProcessGroup, tmp_path: Path, name: str, damage: Any
) -> None:
    """The corrupt-shard and torn-save faults: the shard changes after the write, before verification."""
    state = make_state()
    published: list[int] = []
    failed: list[savers.SaveRecord] = []

    def before_verify(step: int, directory: Path) -> None:
        if step == 4:
            damage(next(directory.glob("__0_*.distcp")))

    saver = new_saver(
        name,
        tmp_path,
        ckpt_group,
        on_commit=lambda record: published.append(record.step),
        on_verify_failed=failed.append,
        before_verify=before_verify,
    )
    try:
        saver.save(2, state)
        saved = snapshot(state)
        saver.finalize()
        train(state)
        saver.save(4, state)
        saver.finalize()
    finally:
        saver.close()
    assert published == [2]
    (record,) = failed
    reason = "hash-mismatch" if damage is ckpt_verify.corrupt else "torn"
    assert record.verdict is not None
    assert (record.step, record.verdict.reason) == (4, reason)
    assert "__0_0.distcp" in record.verdict.detail
    assert record.quarantined == tmp_path / "quarantine" / f"step_000000004.{reason}"
    assert saver.last_committed == 2
    assert ckpt.committed_steps(tmp_path) == [2]
    assert not ckpt.step_dir(tmp_path, 4).exists()
    restored = ckpt.load(tmp_path, state, ckpt_group)
    assert restored is not None
    assert restored.step == 2
    assert_same(snapshot(state), saved)


def test_every_published_save_was_verified_first(ckpt_group: dist.ProcessGroup, tmp_path: Path) -> None:
    state = make_state()
    saver = new_saver("torch-async", tmp_path, ckpt_group)
    try:
        saver.save(2, state)
        saver.finalize()
    finally:
        saver.close()
    record = saver.records[-1]
    assert record.verdict is not None
    assert record.verdict.ok
    assert record.verdict.files == 3  # the shard, .metadata, the extras
    assert record.verify_s > 0
    marker = ckpt.read_marker(ckpt.step_dir(tmp_path, 2))
    assert marker is not None
    assert marker.verified
    assert ckpt_verify.verify_rank(ckpt.step_dir(tmp_path, 2), 0).ok, "the manifest stays for a later audit"


@pytest.mark.timeout(60)
def test_an_async_save_whose_write_fails_is_quarantined_not_raised(
    ckpt_group: dist.ProcessGroup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full file system: every rank gets a failed verdict, so all agree, and training goes on to the next save."""
    state = make_state()
    failed: list[savers.SaveRecord] = []
    saver = new_saver("torch-async", tmp_path, ckpt_group, on_verify_failed=failed.append)

    def no_space(*args: Any, **kwargs: Any) -> Any:
        raise OSError(28, "No space left on device")

    try:
        with monkeypatch.context() as patch:
            patch.setattr(FileSystemWriter, "write_data", no_space)
            saver.save(2, state)
            assert saver.finalize() == 2
        saver.save(4, state)
        assert saver.finalize() == 4
    finally:
        saver.close()
    (record,) = failed
    assert record.verdict is not None
    assert (record.step, record.verdict.reason) == (2, "write-failed")
    assert record.verdict.detail == "rank 0: OSError: [Errno 28] No space left on device"
    assert ckpt_verify.quarantined(tmp_path) == ["step_000000002.write-failed"]
    assert ckpt.committed_steps(tmp_path) == [4]
