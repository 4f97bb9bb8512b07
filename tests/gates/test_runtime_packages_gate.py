"""The runtime-packages gate against the real lock facts and the committed wheel cache (facts pip gave)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gates.runtime_packages import (
    CACHE_PATH,
    REFRESH,
    check_objects,
    load_cache,
    pip_installs_in,
    run_gate,
    start_installs,
)
from k8s.images import ImageLock

LOCK = ImageLock.load()
RAY_IMAGE = LOCK.get("ray-train").reference + "@sha256:" + "a" * 64
NVRX_IMAGE = LOCK.get("nvrx-train").reference + "@sha256:" + "b" * 64


def rayjob(pip: list[str], image: str = RAY_IMAGE) -> tuple[str, dict[str, Any]]:
    container = {"name": "ray-head", "image": image}
    return (
        "job.yaml#0",
        {
            "kind": "RayJob",
            "spec": {
                "runtimeEnvYAML": yaml.safe_dump({"pip": pip}),
                "rayClusterSpec": {"headGroupSpec": {"template": {"spec": {"containers": [container]}}}},
            },
        },
    )


def job(script: str, image: str = NVRX_IMAGE) -> tuple[str, dict[str, Any]]:
    container = {"name": "trainer", "image": image, "command": ["bash", "-c", script]}
    return ("nvrx.yaml#1", {"kind": "Job", "spec": {"template": {"spec": {"containers": [container]}}}})


def messages(objects: list[tuple[str, dict[str, Any]]], cache: dict[str, Any] | None = None) -> list[str]:
    _, findings = check_objects(objects, LOCK, load_cache() if cache is None else cache)
    return [f.message for f in findings]


def test_the_committed_workloads_pass(dist: Path) -> None:
    checked, findings = run_gate(dist)
    assert [str(f) for f in findings] == []
    assert checked > 0  # the NVRx job installs NVRx at start: there is something to check


def test_nvrx_on_the_ray_image_has_no_wheel() -> None:
    """Issue 17 #1: NVRx 0.4.1 publishes wheels up to CPython 3.12; the Ray DLC is Python 3.13."""
    (message,) = messages([rayjob(["nvidia-resiliency-ext==0.4.1"])])
    assert message.startswith(
        "nvidia-resiliency-ext==0.4.1 has no wheel for image ray-train (Python 3.13, glibc 2.34, x86_64)"
    )
    assert "the pod would exit at start" in message


def test_replacing_a_package_the_image_provides() -> None:
    """Issue 17 #1: transformers 5.23 at start replaces the Ray DLC's 5.13 under its other packages."""
    found = messages([rayjob(["transformers==5.23.0"])])
    assert found == [
        "transformers==5.23.0 replaces transformers 5.13.0 that image ray-train (Python 3.13, glibc 2.34, x86_64) "
        "provides; use the image's version (drop it from the install) or an image built with the one you need"
    ]


def test_the_ray_images_lightning_is_the_pytorch_lightning_distribution() -> None:
    """Issue 22 #10: the Ray DLC ships the distribution pytorch-lightning 2.6.5 (aws/deep-learning-containers
    docker/ray-train/pyproject.toml and uv.lock), not `lightning`: a start install replacing it, or a package that
    needs another version of it, must be found under that name."""
    (replaced,) = messages([rayjob(["pytorch-lightning==2.5.0"])], {"pytorch-lightning==2.5.0": {}})[:1]
    assert replaced.startswith("pytorch-lightning==2.5.0 replaces pytorch-lightning 2.6.5 that image ray-train")
    cache = {"some-lib==1.0": {"cp313-x86_64-glibc2.34": {"wheel": "x.whl", "requires": ["pytorch-lightning>=2.7"]}}}
    (message,) = messages([rayjob(["some-lib==1.0"])], cache)
    assert message.startswith("some-lib==1.0 requires pytorch-lightning>=2.7 but image ray-train (Python 3.13")


def test_a_requirement_the_image_does_not_meet() -> None:
    cache = {"some-lib==1.0": {"cp313-x86_64-glibc2.34": {"wheel": "x.whl", "requires": ["torch>=2.14", "ray"]}}}
    (message,) = messages([rayjob(["some-lib==1.0"])], cache)
    assert message.startswith("some-lib==1.0 requires torch>=2.14 but image ray-train (Python 3.13")
    assert message.endswith("has 2.13.0: pip would replace it under the image's other packages")


def test_a_requirement_under_a_marker_for_another_python_is_ignored() -> None:
    cache = {
        "some-lib==1.0": {
            "cp313-x86_64-glibc2.34": {
                "wheel": "x.whl",
                "requires": ['torch<2; python_version < "3.9"', 'torch>=9; extra == "gpu"'],
            }
        }
    }
    assert messages([rayjob(["some-lib==1.0"])], cache) == []


def test_unpinned_uncached_and_unknown_images_are_findings() -> None:
    assert messages([rayjob(["transformers"])]) == ["'transformers' is not pinned; write NAME==VERSION"]
    (uncached,) = messages([rayjob(["tqdm==4.60.0"])], {})
    assert uncached.endswith(f"is not in {CACHE_PATH.name}; run `{REFRESH}`")
    (unknown,) = messages([rayjob(["tqdm==4.60.0"], image="registry.example.com/x/y:v1@sha256:" + "c" * 64)])
    assert "an image outside the lock" in unknown
    assert "add `runtime` to its entry in k8s/images.lock.json" in unknown


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        (
            "python -c 'import x' 2>/dev/null || python -m pip install --no-cache-dir a==1 b==2",
            [["--no-cache-dir", "a==1", "b==2"]],
        ),
        ("set -e\npip3 install -q c==3 && exec python -m t", [["-q", "c==3"]]),
        ("/usr/bin/pip install d==4; echo done", [["d==4"]]),
        ("echo pip install is not run here # pip install e==5", []),
    ],
)
def test_pip_installs_in_a_start_script(script: str, expected: list[list[str]]) -> None:
    assert pip_installs_in(script) == expected


def test_the_nvrx_start_script_is_read_from_the_manifest(dist: Path) -> None:
    from gates import outputs

    installs, findings = start_installs(outputs.manifests(dist))
    nvrx = [i for i in installs if "nvrx-fsdp" in i.where]
    assert findings == []
    assert nvrx, "the NVRx job's start-time install was not found in its manifest"
    assert all("nvidia-resiliency-ext==0.4.1" in i.packages for i in nvrx)
    assert all(LOCK.by_reference(i.image) == LOCK.get("nvrx-train") for i in nvrx)


def test_requirement_files_cannot_be_checked() -> None:
    assert messages([job("pip install -r requirements.txt")]) == [
        "`pip install -r` cannot be checked; list pinned packages instead"
    ]
