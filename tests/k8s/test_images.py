"""The image lock: format, validation, pinning errors, atomic writes."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from k8s.images import LOCK_PATH, ImageLock, ImageLockError, ImageRuntime, LockedImage, UnpinnedImagesError

# A digest computed from content this test creates, never an invented one.
DIGEST = "sha256:" + hashlib.sha256(b'{"schemaVersion":2,"test":"ray-train"}').hexdigest()
REF = "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1.0"


def _lock(**entry: object) -> ImageLock:
    return ImageLock.from_dict({"version": 1, "images": {"ray-train": {"reference": REF, "digest": None, **entry}}})


def test_committed_lock_loads_and_holds_no_invented_digest() -> None:
    lock = ImageLock.load(LOCK_PATH)
    assert "ray-train" in lock.images
    for image in lock.images.values():
        assert image.digest is None, "digests are resolved by `trainctl pin`, never committed by hand"
    assert lock.get("ray-train").reference == REF


def test_pinned_reference_keeps_the_tag_and_adds_the_digest() -> None:
    lock = _lock(digest=DIGEST)
    assert lock.pinned("ray-train") == f"{REF}@{DIGEST}"
    assert lock.get("ray-train").repository == "public.ecr.aws/deep-learning-containers/ray"
    assert lock.get("ray-train").tag == "train-ml-cuda-v1.1.0"


def test_unpinned_image_error_lists_each_image_and_both_remedies() -> None:
    lock = ImageLock.from_dict(
        {
            "version": 1,
            "images": {
                "ray-train": {"reference": REF, "digest": None},
                "nccl-tests": {"reference": "public.ecr.aws/hpc/nccl-tests:2.23", "digest": None},
            },
        }
    )
    with pytest.raises(UnpinnedImagesError) as err:
        lock.require_pinned()
    text = str(err.value)
    assert "2 image(s)" in text
    assert f"ray-train: {REF} has no digest" in text
    assert "nccl-tests: public.ecr.aws/hpc/nccl-tests:2.23 has no digest" in text
    assert "`trainctl pin`" in text
    assert "`trainctl pin --set NAME=REF@sha256:<digest>`" in text


def test_unknown_image_names_the_image_and_the_fix() -> None:
    with pytest.raises(ImageLockError) as err:
        _lock(digest=DIGEST).pinned("pytorch")
    assert "image 'pytorch' is not in k8s/images.lock.json" in str(err.value)
    assert "trainctl pin" in str(err.value)


@pytest.mark.parametrize("reference", ["ray:latest-only-no-registry@x", f"{REF}@{DIGEST}", "public.ecr.aws/x/ray", ""])
def test_tag_only_or_digest_references_are_refused(reference: str) -> None:
    with pytest.raises(ImageLockError, match=r"is not a tag reference"):
        _lock(reference=reference)


@pytest.mark.parametrize(
    "reference",
    [
        "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1",
        "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1",
        "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda",
    ],
)
def test_a_moving_dlc_tag_is_refused_naming_the_frozen_one(reference: str) -> None:
    """The Ray DLC moves its vX and vX.Y tags on every security rebuild; vX.Y.Z stays (DLC release notes), so the
    lock's runtime facts stay true only on a vX.Y.Z tag."""
    with pytest.raises(ImageLockError, match=r"moving DLC tag.*vX\.Y\.Z"):
        _lock(reference=reference)


def test_the_committed_dlc_references_are_frozen_tags() -> None:
    lock = ImageLock.load()
    ray = [image for image in lock.images.values() if image.repository.endswith("deep-learning-containers/ray")]
    assert ray
    assert all(re.search(r"-v\d+\.\d+\.\d+$", image.tag) for image in ray), [i.reference for i in ray]


@pytest.mark.parametrize(
    "reference",
    [
        "public.ecr.aws/deep-learning-containers/pytorch-training:2.9.0-gpu-py312-cu130-ubuntu22.04-ec2",
        "public.ecr.aws/deep-learning-containers/pytorch-training:2.9-gpu-py312-cu130-ubuntu22.04-ec2-v1",
        "public.ecr.aws/deep-learning-containers/pytorch-training:2.9.0-gpu-py312-ec2",
    ],
)
def test_a_moving_pytorch_dlc_tag_is_refused(reference: str) -> None:
    """The PyTorch training DLC's tags without a vX.Y (or with only vX) move with every patch release; the
    -vX.Y and -vX.Y-<timestamp> ones attach to one image (issue 22, image tags)."""
    with pytest.raises(ImageLockError, match=r"moving DLC tag.*-vX\.Y"):
        _lock(reference=reference)


@pytest.mark.parametrize(
    "tag",
    ["2.9.0-gpu-py312-cu130-ubuntu22.04-ec2-v1.11", "2.9.0-gpu-py312-cu130-ubuntu22.04-ec2-v1.2-2025-12-15-22-03-41"],
)
def test_a_frozen_pytorch_dlc_tag_is_accepted(tag: str) -> None:
    _lock(reference=f"public.ecr.aws/deep-learning-containers/pytorch-training:{tag}")


def test_the_committed_pytorch_dlc_reference_names_one_pytorch_release() -> None:
    """The Amazon Linux 2023 PyTorch DLC has no frozen tag (both of its tags are re-pushed twice a week): the lock
    names the full release and pins the digest; the minor-only tag is refused."""
    lock = ImageLock.load()
    (dlc,) = [i for i in lock.images.values() if i.repository.endswith("deep-learning-containers/pytorch")]
    assert re.match(r"^\d+\.\d+\.\d+-cu\d+-amzn2023$", dlc.tag), dlc.reference
    with pytest.raises(ImageLockError, match=r"pin the X.Y.Z-cuNNN-amzn2023 tag"):
        LockedImage(name="x", reference="public.ecr.aws/deep-learning-containers/pytorch:2.13-cu133-amzn2023")


def test_runtime_facts_are_validated_with_the_fix() -> None:
    runtime = ImageLock.load().get("nvrx-train").runtime
    assert runtime is not None
    facts = {**runtime.to_dict()}
    for field, value, says in (
        ("aws_ofi_nccl", "1.21", "expected a release X.Y.Z"),
        ("cuda", "13", "expected CUDA's major.minor"),
        ("aws_ofi_nccl", "1.22.0", "EFA installer 1.49.0 carries aws-ofi-nccl 1.20.0"),
    ):
        with pytest.raises(ImageLockError, match=re.escape(says)):
            ImageRuntime.from_dict("runtime", {**facts, field: value})


@pytest.mark.parametrize("digest", ["sha256:abc", "md5:" + "a" * 64, "sha256:" + "G" * 64, "sha256:" + "A" * 64])
def test_malformed_digest_is_refused(digest: str) -> None:
    with pytest.raises(ImageLockError, match=r"digest=.* is malformed"):
        _lock(digest=digest)


def test_unknown_fields_and_versions_are_refused() -> None:
    with pytest.raises(ImageLockError, match=r"unknown field"):
        _lock(tags=["x"])
    with pytest.raises(ImageLockError, match=r"version=2"):
        ImageLock.from_dict({"version": 2, "images": {}})


def test_write_is_atomic_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "images.lock.json"
    lock = _lock().with_digest("ray-train", DIGEST)
    lock.write(path)
    assert ImageLock.load(path) == lock
    assert json.loads(path.read_text())["images"]["ray-train"]["digest"] == DIGEST
    assert [p.name for p in tmp_path.iterdir()] == ["images.lock.json"]  # no temp file left


def test_failed_write_leaves_the_old_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "images.lock.json"
    _lock().write(path)
    before = path.read_bytes()

    def boom(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", boom)
    with pytest.raises(OSError, match="disk full"):
        _lock(digest=DIGEST).write(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["images.lock.json"]


def test_image_runtime_facts_are_validated_and_round_trip() -> None:
    from k8s.images import ImageLock, ImageRuntime

    lock = ImageLock.load()
    assert ImageLock.from_dict(lock.to_dict()) == lock
    ray = lock.get("ray-train").runtime
    assert ray is not None
    assert (ray.python, ray.packages["transformers"]) == ("3.13", "5.13.0")
    assert ray.wheel_platforms[0] == "manylinux_2_34_x86_64"
    assert "manylinux2014_x86_64" in ray.wheel_platforms
    assert "manylinux_2_35_x86_64" not in ray.wheel_platforms
    for bad, message in (
        ({"python": "3", "glibc": "2.35", "source": "x"}, "runtime.python='3'"),
        ({"python": "3.12", "glibc": "235", "source": "x"}, "runtime.glibc='235'"),
        ({"python": "3.12", "glibc": "2.35", "source": " "}, "runtime.source is empty"),
        ({"python": "3.12", "glibc": "2.35", "source": "x", "packages": {"Torch": "2"}}, "normalized package name"),
        ({"python": "3.12", "glibc": "2.35", "source": "x", "os": "linux"}, "unknown field(s) ['os']"),
    ):
        with pytest.raises(ImageLockError, match=re.escape(message)):
            ImageRuntime.from_dict("images.x.runtime", bad)
