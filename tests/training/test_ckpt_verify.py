"""training.ckpt_verify on a tiny DCP checkpoint written in this process (no process group: dcp.save no_dist):
hashes taken as the bytes are written, the read-back that must match them, the metadata that must load and
cover what it points at, and the quarantine a failed save is renamed into."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict_saver import save

from training import ckpt_verify as cv

# dcp.save(no_dist=True) says it assumes one process: that is the point here.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def write_tiny(directory: Path) -> dict[str, cv.FileDigest]:
    """A one-rank DCP checkpoint of two tensors and a scalar, with rank 0's manifest; returns its digests."""
    directory.mkdir(parents=True)
    writer = FileSystemWriter(directory)
    hashed = cv.hash_writes(writer)
    state = {"w": torch.arange(64, dtype=torch.float32).reshape(8, 8), "b": torch.ones(8), "step": 3}
    save(state, storage_writer=writer, no_dist=True)
    digests = dict(hashed.digests)
    cv.write_manifest(directory, 0, digests, source="write")
    return digests


def shard(directory: Path) -> Path:
    (path,) = directory.glob("__0_*.distcp")
    return path


def test_the_hashes_are_those_of_the_bytes_written(tmp_path: Path) -> None:
    digests = write_tiny(tmp_path / "step")
    assert set(digests) == {shard(tmp_path / "step").name, ".metadata"}, "the temporary metadata name is not kept"
    for name, digest in digests.items():
        data = (tmp_path / "step" / name).read_bytes()
        assert digest == cv.FileDigest(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
    manifest = json.loads((tmp_path / "step" / "manifest-rank0.json").read_text())
    assert manifest["source"] == "write"
    assert cv.read_manifest(tmp_path / "step", 0) == digests


def test_a_good_checkpoint_verifies(tmp_path: Path) -> None:
    write_tiny(tmp_path / "step")
    verdict = cv.verify_rank(tmp_path / "step", 0)
    assert verdict.ok, verdict
    assert verdict.reason == "verified"
    assert verdict.files == 2
    written = [p for p in (tmp_path / "step").iterdir() if p.name != cv.manifest_name(0)]
    assert verdict.bytes == sum(p.stat().st_size for p in written)


def test_one_flipped_byte_in_a_shard_fails_naming_the_file(tmp_path: Path) -> None:
    write_tiny(tmp_path / "step")
    cv.corrupt(shard(tmp_path / "step"))
    verdict = cv.verify_rank(tmp_path / "step", 0)
    assert (verdict.ok, verdict.reason) == (False, "hash-mismatch")
    assert shard(tmp_path / "step").name in verdict.detail


def test_a_truncated_shard_fails_as_torn(tmp_path: Path) -> None:
    write_tiny(tmp_path / "step")
    cv.truncate(shard(tmp_path / "step"))
    verdict = cv.verify_rank(tmp_path / "step", 0)
    assert (verdict.ok, verdict.reason) == (False, "torn")
    assert "bytes" in verdict.detail


def test_a_torn_shard_fails_the_metadata_check_even_without_hashes(tmp_path: Path) -> None:
    """The metadata records every item's offset and length: a file shorter than that is torn, whatever it hashes."""
    write_tiny(tmp_path / "step")
    cv.truncate(shard(tmp_path / "step"))
    verdict = cv.check_metadata(tmp_path / "step")
    assert (verdict.ok, verdict.reason) == (False, "torn")


def test_metadata_that_does_not_load_fails(tmp_path: Path) -> None:
    directory = tmp_path / "step"
    write_tiny(directory)
    (directory / ".metadata").write_bytes(b"not a pickle")
    # the manifest is rewritten to match, so only the load can tell
    digests = {name: cv.hash_file(directory / name) for name in cv.read_manifest(directory, 0) or {}}
    cv.write_manifest(directory, 0, digests, source="write")
    verdict = cv.verify_rank(directory, 0)
    assert (verdict.ok, verdict.reason) == (False, "metadata-unloadable")


def test_a_rank_without_its_manifest_fails(tmp_path: Path) -> None:
    write_tiny(tmp_path / "step")
    verdict = cv.verify_rank(tmp_path / "step", 1)
    assert (verdict.ok, verdict.reason) == (False, "no-manifest")


def test_combined_verdicts_fail_on_any_rank_and_name_it() -> None:
    good = cv.Verdict(ok=True, reason="verified", detail="", files=2, bytes=10, seconds=0.5)
    bad = cv.Verdict(ok=False, reason="hash-mismatch", detail="rank 1: __1_0.distcp", files=1, bytes=4, seconds=0.25)
    assert cv.combine([good, good]) == cv.Verdict(True, "verified", "", files=4, bytes=20, seconds=0.5)
    combined = cv.combine([good, bad])
    assert (combined.ok, combined.reason, combined.detail) == (False, "hash-mismatch", "rank 1: __1_0.distcp")


def test_quarantine_moves_the_step_aside_under_a_name_that_says_why(tmp_path: Path) -> None:
    for _ in range(2):
        step = tmp_path / "step_000000006"
        step.mkdir()
        (step / "__0_0.distcp").write_bytes(b"x")
        moved = cv.quarantine(step, "hash-mismatch")
        assert not step.exists()
        assert (moved / "__0_0.distcp").read_bytes() == b"x"
    assert sorted(p.name for p in (tmp_path / "quarantine").iterdir()) == [
        "step_000000006.hash-mismatch",
        "step_000000006.hash-mismatch.1",
    ]
