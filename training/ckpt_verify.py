"""Verified publication of a step checkpoint: hashing what each rank writes, reading it back, and setting aside
a save that does not read back.

Each rank records the sha256 and size of every file it wrote into the step directory (manifest-rank{R}.json):
for the torch savers, of the bytes as DCP's writer hands them to the file (hash_writes wraps its file system);
for NVRx's writer, which writes in a process of its own, of the files as read once its write has finished.
Verifying a rank re-reads every file its manifest lists and compares; rank 0 also loads the DCP metadata and
checks that every item it records lies inside a file that exists. Only a step whose every rank verified gets
its COMMITTED marker (training/checkpointing.py); one that fails is renamed to quarantine/step_N.REASON.

Standard library and torch only: it ships to the pods in the training-code ConfigMap (k8s/charts/ray.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Generator, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemReader, FileSystemWriter

MANIFEST = "manifest-rank{rank}.json"
METADATA = ".metadata"
QUARANTINE = "quarantine"
CHUNK = 8 * 1024 * 1024
# Why a save failed verification; also the suffix of its quarantine name.
REASONS = ("hash-mismatch", "torn", "missing-file", "no-manifest", "metadata-unloadable", "write-failed")


@dataclass(frozen=True)
class FileDigest:
    sha256: str
    size: int


@dataclass(frozen=True)
class Verdict:
    """ok, or why not: reason (one of REASONS, "verified" when ok) and detail (which file, what differed)."""

    ok: bool
    reason: str
    detail: str
    files: int
    bytes: int
    seconds: float


def manifest_name(rank: int) -> str:
    return MANIFEST.format(rank=rank)


# --- hashing -----------------------------------------------------------------------------------------------------


class _HashingStream:
    """A binary file whose writes also feed a sha256; everything else is the file's."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        written = self._raw.write(view)
        self.digest.update(view[:written])
        self.size += written
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


class HashingFileSystem(FileSystem):
    """DCP's local file system, recording the digest of every file written through it, by file name."""

    def __init__(self) -> None:
        super().__init__()
        self.digests: dict[str, FileDigest] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[Any, None, None]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with Path(path).open(mode) as raw:
            hashing = _HashingStream(raw)
            yield hashing
        with self._lock:
            self.digests[Path(path).name] = FileDigest(hashing.digest.hexdigest(), hashing.size)

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        super().rename(path, new_path)
        with self._lock:
            digest = self.digests.pop(Path(path).name, None)
            if digest is not None:
                self.digests[Path(new_path).name] = digest


def hash_writes(writer: FileSystemWriter) -> HashingFileSystem:
    """Makes `writer` hash every file it writes; the returned file system holds the digests once it has."""
    fs = HashingFileSystem()
    writer.fs = fs
    return fs


def hash_bytes(data: bytes) -> FileDigest:
    return FileDigest(hashlib.sha256(data).hexdigest(), len(data))


def hash_file(path: Path) -> FileDigest:
    """The file as storage returns it: the pages it has cached are dropped first where the OS allows (they are
    clean once DCP has fsynced the file), so the read is not answered from the writer's own page cache."""
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as stream:
        if hasattr(os, "posix_fadvise"):
            with contextlib.suppress(OSError):
                os.posix_fadvise(stream.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        while chunk := stream.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return FileDigest(digest.hexdigest(), size)


# --- manifests ---------------------------------------------------------------------------------------------------


def write_manifest(directory: Path, rank: int, digests: Mapping[str, FileDigest], *, source: str) -> None:
    """source: "write" (hashed as written) or "read-after-write" (hashed from the file once written)."""
    payload = {
        "rank": rank,
        "source": source,
        "files": {name: {"sha256": d.sha256, "size": d.size} for name, d in sorted(digests.items())},
    }
    path = directory / manifest_name(rank)
    tmp = directory / f".{path.name}.tmp-{os.getpid()}"
    with tmp.open("w", encoding="utf-8") as out:
        json.dump(payload, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def read_manifest(directory: Path, rank: int) -> dict[str, FileDigest] | None:
    try:
        raw = json.loads((directory / manifest_name(rank)).read_text(encoding="utf-8"))
        return {name: FileDigest(str(d["sha256"]), int(d["size"])) for name, d in raw["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


# --- verification ------------------------------------------------------------------------------------------------


def _fail(reason: str, detail: str, started: float, files: int = 0, size: int = 0) -> Verdict:
    return Verdict(False, reason, detail, files, size, time.perf_counter() - started)


def check_files(directory: Path, expected: Mapping[str, FileDigest], started: float | None = None) -> Verdict:
    """Re-reads every file of `expected` and compares size, then sha256."""
    started = time.perf_counter() if started is None else started
    files, total = 0, 0
    for name, want in sorted(expected.items()):
        path = directory / name
        if not path.is_file():
            return _fail("missing-file", f"{name} is missing", started, files, total)
        got = hash_file(path)
        files, total = files + 1, total + got.size
        if got.size != want.size:
            return _fail("torn", f"{name} holds {got.size} bytes, {want.size} were written", started, files, total)
        if got.sha256 != want.sha256:
            return _fail("hash-mismatch", f"{name}: sha256 {got.sha256[:12]}…, written {want.sha256[:12]}…", started)
    return Verdict(True, "verified", "", files, total, time.perf_counter() - started)


def check_sizes(directory: Path, world_size: int) -> Verdict:
    """At resume, without reading the data: every rank's manifest is there and every file it names still exists with
    the size it was written with (a file deleted or truncated after the save was verified). Bit flips are left to the
    load."""
    started = time.perf_counter()
    files = 0
    for rank in range(world_size):
        expected = read_manifest(directory, rank)
        if expected is None:
            return _fail("no-manifest", f"{manifest_name(rank)} is missing or unreadable", started, files)
        for name, want in sorted(expected.items()):
            path = directory / name
            if not path.is_file():
                return _fail("missing-file", f"{name} is missing", started, files)
            size = path.stat().st_size
            if size != want.size:
                return _fail("torn", f"{name} holds {size} bytes, {want.size} were written", started, files)
            files += 1
    return Verdict(True, "verified", "", files, 0, time.perf_counter() - started)


def check_metadata(directory: Path, started: float | None = None) -> Verdict:
    """The DCP metadata loads, and every item it records lies inside a file that exists."""
    started = time.perf_counter() if started is None else started
    try:
        metadata = FileSystemReader(directory).read_metadata()
        extents: dict[str, int] = {}
        for info in (metadata.storage_data or {}).values():
            extents[info.relative_path] = max(extents.get(info.relative_path, 0), info.offset + info.length)
    except Exception as exc:  # whatever unpickling a damaged file raises
        return _fail("metadata-unloadable", f"{METADATA}: {type(exc).__name__}: {exc}", started)
    for name, end in sorted(extents.items()):
        path = directory / name
        if not path.is_file():
            return _fail("missing-file", f"{name}, named by {METADATA}, is missing", started)
        size = path.stat().st_size
        if size < end:
            return _fail("torn", f"{name} holds {size} bytes, {METADATA} places data up to {end} bytes", started)
    return Verdict(True, "verified", "", 0, 0, time.perf_counter() - started)


def verify_rank(directory: Path, rank: int, expected: Mapping[str, FileDigest] | None = None) -> Verdict:
    """Rank `rank`'s part of a save: its files against `expected` (default: its manifest), and for rank 0 the
    metadata as well."""
    started = time.perf_counter()
    if expected is None:
        expected = read_manifest(directory, rank)
        if expected is None:
            return _fail("no-manifest", f"rank {rank}: {manifest_name(rank)} is missing or unreadable", started)
    verdict = check_files(directory, expected, started)
    if verdict.ok and rank == 0:
        meta = check_metadata(directory, started)
        if not meta.ok:
            verdict = Verdict(False, meta.reason, meta.detail, verdict.files, verdict.bytes, meta.seconds)
    if verdict.ok:
        return verdict
    detail = f"rank {rank}: {verdict.detail}"
    return Verdict(False, verdict.reason, detail, verdict.files, verdict.bytes, verdict.seconds)


def combine(verdicts: Iterable[Verdict]) -> Verdict:
    """One verdict for the whole save: the first rank's failure, else verified; its time the slowest rank's."""
    every = list(verdicts)
    failed = next((v for v in every if not v.ok), None)
    files, total = sum(v.files for v in every), sum(v.bytes for v in every)
    seconds = max((v.seconds for v in every), default=0.0)
    if failed is not None:
        return Verdict(False, failed.reason, failed.detail, files, total, seconds)
    return Verdict(True, "verified", "", files, total, seconds)


def quarantine(directory: Path, reason: str) -> Path:
    """Renames a step directory to ROOT/quarantine/STEP_NAME.REASON (.1, .2, ... if taken): out of the
    step_* names resumption and cleanup look at, kept for a person to inspect."""
    target_dir = directory.parent / QUARANTINE
    target_dir.mkdir(exist_ok=True)
    base = f"{directory.name}.{reason}"
    target, n = target_dir / base, 0
    while target.exists():
        n += 1
        target = target_dir / f"{base}.{n}"
    os.replace(directory, target)
    return target


def quarantined(root: Path) -> list[str]:
    folder = root / QUARANTINE
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def _aside_order(name: str) -> tuple[int, int]:
    """(step, the .N suffix quarantine adds when the name is taken) of a quarantined save's name."""
    head, _, rest = name.partition(".")
    last = rest.rpartition(".")[2]
    step = head.removeprefix("step_")
    return (int(step) if step.isdigit() else -1, int(last) if last.isdigit() else 0)


def prune_quarantine(root: Path, keep: int) -> list[str]:
    """Deletes all but the newest `keep` quarantined saves: each is a whole save, and a file system that fails
    every read-back would otherwise fill up with them. Returns the names deleted."""
    names = sorted(quarantined(root), key=_aside_order)
    doomed = names[:-keep] if keep > 0 else names
    for name in doomed:
        shutil.rmtree(root / QUARANTINE / name, ignore_errors=True)
    return doomed


# --- fault injection (tests and benchmarks) ----------------------------------------------------------------------


def corrupt(path: Path) -> None:
    """Flips every bit of the byte in the middle of the file, in place."""
    with path.open("r+b") as stream:
        size = stream.seek(0, os.SEEK_END)
        middle = size // 2
        stream.seek(middle)
        byte = stream.read(1)
        stream.seek(middle)
        stream.write(bytes([byte[0] ^ 0xFF]))
        stream.flush()
        os.fsync(stream.fileno())


def truncate(path: Path) -> None:
    """Cuts the file to half its length, as a save torn by a full or failing file system leaves it."""
    size = path.stat().st_size
    os.truncate(path, size // 2)
