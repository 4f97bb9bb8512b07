"""Step checkpoints of FSDP2 training, resumable only once complete.

Layout of a checkpoint directory DIR:

    DIR/step_000000120/          torch.distributed.checkpoint (DCP) shards of model + optimizer, .metadata
    DIR/step_000000120/extra-rank0.pt   per-rank extras: RNG states, data position
    DIR/step_000000120/manifest-rank0.json  sha256 and size of every file the rank wrote (training/ckpt_verify.py)
    DIR/step_000000120/COMMITTED JSON {step, world_size, finalized_at, saver, verified}; written last, atomically
    DIR/quarantine/step_000000120.REASON  a save that failed its read-back, renamed aside

A save becomes visible to resumption only through COMMITTED, which rank 0 writes after every rank's part of the
save has finished (for async saves: after the background write has finalized on all ranks) and read back as
written (each rank re-reads its files against the hashes taken as they were written; rank 0 also loads the DCP
metadata). The read-back runs in a background thread once the write is done, like the write itself; the step loop
only polls for its verdict. A save that fails it is renamed to DIR/quarantine/ and never published. A directory
without the marker (a save cut short by a crash) is never loaded, and later cleaned up. A marker written before saves
were verified (no `verified` key) is loaded only if its DCP metadata loads and every file it names is whole.

The savers that write, read back and publish these checkpoints are training/savers.py.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from training import ckpt_verify

STEP_PREFIX = "step_"
STEP_DIGITS = 9
MARKER = "COMMITTED"
EXTRA_FILE = "extra-rank{rank}.pt"

SaverName = Literal["torch-async", "nvrx-async", "sync"]


def step_dir(root: Path, step: int) -> Path:
    return root / f"{STEP_PREFIX}{step:0{STEP_DIGITS}d}"


def parse_step(name: str) -> int | None:
    """The step of a directory name like step_000000120, None for anything else."""
    digits = name.removeprefix(STEP_PREFIX)
    if digits == name or len(digits) != STEP_DIGITS or not (digits.isascii() and digits.isdigit()):
        return None
    return int(digits)


@dataclass(frozen=True)
class Commit:
    step: int
    world_size: int
    finalized_at: float
    saver: str
    verified: bool = False
    legacy: bool = False
    """The marker predates verification (no `verified` key): no hashes to compare; never written."""

    def __post_init__(self) -> None:
        if self.step < 0 or self.world_size < 1:
            raise ValueError(f"invalid commit: step {self.step}, world size {self.world_size}")


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_marker(directory: Path, commit: Commit) -> None:
    """Writes COMMITTED atomically: a reader sees either no marker or the whole one, even across a crash."""
    tmp = directory / f".{MARKER}.tmp-{os.getpid()}"
    with tmp.open("w", encoding="utf-8") as out:
        json.dump({k: v for k, v in asdict(commit).items() if k != "legacy"}, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, directory / MARKER)
    _fsync_dir(directory)


def read_marker(directory: Path) -> Commit | None:
    """The commit of a step directory, or None if it has no valid marker for its own step."""
    try:
        raw = json.loads((directory / MARKER).read_text(encoding="utf-8"))
        commit = Commit(
            step=int(raw["step"]),
            world_size=int(raw["world_size"]),
            finalized_at=float(raw["finalized_at"]),
            saver=str(raw["saver"]),
            verified=raw.get("verified") is True,
            legacy="verified" not in raw,
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return commit if commit.step == parse_step(directory.name) else None


def _step_dirs(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    found = [(parse_step(p.name), p) for p in root.iterdir() if p.is_dir()]
    return sorted((step, path) for step, path in found if step is not None)


def _published(path: Path, commit: Commit | None) -> bool:
    """Whether the step at `path`, whose marker reads `commit`, may be loaded."""
    if commit is None:
        return False
    # A save committed before saves were verified has no hashes; its metadata and the files it names are checked, so
    # that a job upgraded mid-run resumes from it rather than from step 0.
    return commit.verified or (commit.legacy and ckpt_verify.check_metadata(path).ok)


def _partition(root: Path) -> tuple[list[int], list[int]]:
    """(published steps, the others), each marker read once."""
    published: list[int] = []
    others: list[int] = []
    for step, path in _step_dirs(root):
        (published if _published(path, read_marker(path)) else others).append(step)
    return published, others


def committed_steps(root: Path) -> list[int]:
    """Steps resumption may load: verified, or committed before verification with metadata that checks out."""
    return _partition(root)[0]


def incomplete_steps(root: Path) -> list[int]:
    return _partition(root)[1]


def latest_complete(root: Path) -> Path | None:
    """The newest step directory with a valid, verified commit marker; partial saves and stray entries are
    ignored."""
    steps = committed_steps(root)
    return step_dir(root, steps[-1]) if steps else None


def cleanup(root: Path, keep: int) -> list[int]:
    """Deletes all but the newest `keep` committed checkpoints, and incomplete ones older than the newest committed
    (newer incomplete ones may be saves in progress), and all but the newest `keep` quarantined saves. The newest
    committed checkpoint is never deleted."""
    if keep < 1:
        raise ValueError(f"keep must be at least 1 (the newest committed checkpoint is always kept), got {keep}")
    ckpt_verify.prune_quarantine(root, keep)
    committed, incomplete = _partition(root)
    if not committed:
        return []
    newest = committed[-1]
    doomed = committed[:-keep] + [step for step in incomplete if step < newest]
    for step in sorted(doomed):
        shutil.rmtree(step_dir(root, step), ignore_errors=True)
    return sorted(doomed)


# --- per-rank extras: RNG states and data position -------------------------------------------------------------


def capture_rng() -> dict[str, Any]:
    state = np.random.get_state(legacy=True)
    if not isinstance(state, tuple):
        raise TypeError("numpy returned a non-legacy RNG state")
    name, keys, pos, has_gauss, cached = state
    cuda: list[torch.Tensor] = []
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        cuda = torch.cuda.get_rng_state_all()
    return {
        "torch": torch.get_rng_state(),
        "cuda": cuda,
        "python": random.getstate(),
        "numpy": (str(name), torch.from_numpy(np.array(keys, dtype=np.int64)), int(pos), int(has_gauss), float(cached)),
    }


def restore_rng(saved: dict[str, Any]) -> None:
    torch.set_rng_state(saved["torch"])
    if saved["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda"])
    random.setstate(saved["python"])
    name, keys, pos, has_gauss, cached = saved["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))


# --- the state a checkpoint holds ------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainState:
    """What a checkpoint holds besides per-rank extras: the (FSDP2-sharded) model and its optimizer."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer


def dcp_state(state: TrainState) -> dict[str, Any]:
    model_state, optim_state = get_state_dict(state.model, state.optimizer)
    return {"model": model_state, "optim": optim_state}


# --- loading -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Restored:
    step: int
    path: Path
    saver: str
    rng_restored: bool


@dataclass(frozen=True)
class Survey:
    """What rank 0 found in the checkpoint directory before resuming: the newest verified step, the steps
    without a marker, why it chose that step and what newer it passed over, and why."""

    latest: int | None
    incomplete: tuple[int, ...]
    chosen_because: str = ""
    skipped: tuple[str, ...] = ()


def take_survey(root: Path) -> Survey:
    markers = [(step, path, read_marker(path)) for step, path in _step_dirs(root)]
    newer: list[tuple[int, str]] = []
    latest, chosen = None, None
    for step, path, commit in reversed(markers):
        if commit is None or not _published(path, commit):
            continue
        # A save committed before verification had its metadata and files checked by _published.
        whole = ckpt_verify.check_sizes(path, commit.world_size) if commit.verified else None
        if whole is None or whole.ok:
            latest, chosen = step, commit
            break
        newer.append((step, f"step {step}: verified when saved, but {whole.reason} now: {whole.detail}"))
    no_marker: list[int] = []
    for step, path, commit in markers:
        if commit is None:
            no_marker.append(step)
        if latest is not None and step <= latest:
            continue
        if commit is None:
            newer.append((step, f"step {step}: no {MARKER} marker (a save cut short)"))
        elif commit.legacy:
            reason = ckpt_verify.check_metadata(path).reason
            newer.append(
                (
                    step,
                    f"step {step}: committed before saves were verified, and its metadata does not check out "
                    f"({reason})",
                )
            )
        elif not commit.verified:
            newer.append((step, f"step {step}: committed but never verified"))
    for name in ckpt_verify.quarantined(root):
        aside = parse_step(name.split(".", 1)[0])
        if aside is not None and (latest is None or aside > latest):
            newer.append((aside, f"step {aside}: quarantined as {ckpt_verify.QUARANTINE}/{name}"))
    if chosen is None:
        because = "no verified checkpoint: starting from step 0"
    elif chosen.verified:
        because = f"step {latest} is the newest checkpoint whose read-back verified"
    else:
        because = (
            f"step {latest} was committed before saves were verified: its metadata loads and every file it names is "
            "whole (no hashes to compare)"
        )
    return Survey(
        latest=latest,
        incomplete=tuple(no_marker),
        chosen_because=because,
        skipped=tuple(reason for _, reason in sorted(newer)),
    )


def survey(root: Path, group: dist.ProcessGroup | None = None) -> Survey:
    """Rank 0 looks, every rank gets the same answer (a shared filesystem may be listed at different moments)."""
    found: list[Survey | None] = [None]
    if dist.get_rank(group) == 0:
        found[0] = take_survey(root)
    dist.broadcast_object_list(found, group=group, group_src=0)
    result = found[0]
    assert result is not None
    return result


def load(
    root: Path, state: TrainState, group: dist.ProcessGroup | None = None, found: Survey | None = None
) -> Restored | None:
    """Restores the latest complete checkpoint into model and optimizer (resharding if the world size changed),
    and this rank's RNG states if the world size is the one it was saved with. Collective. `found`: a survey
    already taken by all ranks."""
    latest = (found or survey(root, group)).latest
    if latest is None:
        return None
    path = step_dir(root, latest)
    commit = read_marker(path)
    if commit is None:
        raise RuntimeError(f"{path} lost its {MARKER} marker while being loaded")
    target = dcp_state(state)
    dcp_load(target, storage_reader=FileSystemReader(path), process_group=group)
    set_state_dict(state.model, state.optimizer, model_state_dict=target["model"], optim_state_dict=target["optim"])
    rank, world_size = dist.get_rank(), dist.get_world_size()
    rng_restored = False
    if commit.world_size == world_size:
        extra = torch.load(path / EXTRA_FILE.format(rank=rank), weights_only=True)
        if extra["data_step"] != commit.step:
            raise RuntimeError(f"{path}: rank {rank} extras are for step {extra['data_step']}, not {commit.step}")
        restore_rng(extra["rng"])
        rng_restored = True
    return Restored(step=commit.step, path=path, saver=commit.saver, rng_restored=rng_restored)
