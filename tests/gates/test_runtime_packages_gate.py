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
    # Nothing is installed at start any more: the NVRx job runs its environment's built image (issue 22).
    assert checked == 0


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


def test_the_nvrx_job_in_the_manifests_is_checked_against_nvrx_support(dist: Path) -> None:
    """The NVRx job's image (the built one: NVRx among its packages, no start install) meets the support rules; the
    same manifests on an image whose Python NVRx does not support are refused."""
    from gates import outputs
    from gates.runtime_packages import nvrx_combinations
    from k8s.check_lock import check_lock

    installs, findings = start_installs(outputs.manifests(dist))
    assert (installs, findings) == ([], [])
    lock = check_lock(LOCK)
    assert nvrx_combinations(outputs.manifests(dist), lock) == []
    data = lock.to_dict()
    for env in ("dev", "prod"):
        data["images"][f"nvrx-train-{env}"]["runtime"]["python"] = "3.13"
    bad = nvrx_combinations(outputs.manifests(dist), ImageLock.from_dict(data))
    assert sorted({f.where.split("/")[-2] for f in bad}) == ["dev", "prod"], [str(f) for f in bad]
    assert all("the image has Python 3.13" in f.message for f in bad)


def test_requirement_files_cannot_be_checked() -> None:
    assert messages([job("pip install -r requirements.txt")]) == [
        "`pip install -r` cannot be checked; list pinned packages instead"
    ]


# --- known-bad NVRx combinations (issue 22): NVRx's own support table, k8s/nvrx_support.py ---------------------------

NVRX_START = "python -m pip install --no-cache-dir nvidia-resiliency-ext==0.4.1 transformers==5.23.0"
NVRX_RUN = "exec ft_launcher --ft-restart-policy=min-healthy -m training.nvrx_fsdp --inprocess"


def lock_with(**runtime: Any) -> ImageLock:
    """The committed lock with the nvrx-train image's runtime facts changed."""
    data = LOCK.to_dict()
    data["images"]["nvrx-train"]["runtime"] |= runtime
    return ImageLock.from_dict(data)


def nvrx_messages(script: str, lock: ImageLock) -> list[str]:
    image = lock.get("nvrx-train").reference + "@sha256:" + "b" * 64
    _, findings = check_objects([job(script, image)], lock, load_cache())
    return [f.message for f in findings]


def test_the_lock_records_the_nvrx_image_nccl() -> None:
    runtime = LOCK.get("nvrx-train").runtime
    assert runtime is not None
    assert runtime.nccl == "2.29.7"


# --- aws-ofi-nccl before 1.21.0 leaks on every communicator teardown (k8s/ofi_nccl.py) -----------------------------

FT_RUN = "exec ft_launcher --max-restarts=3 -m training.nvrx_fsdp"


def test_the_nvrx_base_image_on_glibc_2_34_has_no_nvrx_0_7_wheel_and_the_fix_is_the_built_image() -> None:
    """NVRx 0.7.0 publishes only manylinux_2_39 wheels; the AL2023 DLC has glibc 2.34: a start install is refused,
    naming the built image as the fix."""
    found = nvrx_messages(
        "python -m pip install --no-cache-dir nvidia-resiliency-ext==0.7.0 transformers==5.23.0", LOCK
    )
    (no_wheel,) = [m for m in found if "has no wheel" in m]
    assert no_wheel.startswith(
        "nvidia-resiliency-ext==0.7.0 has no wheel for image nvrx-train (Python 3.12, glibc 2.34"
    )
    assert "images/nvrx/Dockerfile" in no_wheel
    assert "built image" in no_wheel


def test_aws_ofi_nccl_before_1_21_with_any_restart_mechanism_is_refused() -> None:
    install = "pip install nvidia-resiliency-ext==0.7.0"
    for run in (FT_RUN, "exec ft_launcher --max-restarts=0 -m training.nvrx_fsdp --inprocess"):
        found = nvrx_messages(f"{install}\n{run}", lock_with(aws_ofi_nccl="1.20.0", efa_installer="1.49.0"))
        leak = [m for m in found if "aws-ofi-nccl 1.20.0" in m]
        assert leak, found
        assert "EFA installer >= 1.50.0" in leak[0], leak
        assert "images/nvrx/Dockerfile" in leak[0], leak
    # No restart mechanism: a leak per teardown never adds up.
    found = nvrx_messages(
        f"{install}\nexec ft_launcher --max-restarts=0 -m training.nvrx_fsdp", lock_with(aws_ofi_nccl="1.20.0")
    )
    assert not any("aws-ofi-nccl" in m for m in found), found
    found = nvrx_messages(f"{install}\n{FT_RUN}", lock_with(aws_ofi_nccl="1.21.1", efa_installer="1.50.0"))
    assert not any("aws-ofi-nccl" in m for m in found), found


def test_restarts_on_an_image_whose_aws_ofi_nccl_is_not_recorded() -> None:
    data = LOCK.to_dict()
    data["images"]["nvrx-train"]["runtime"].pop("aws_ofi_nccl", None)
    data["images"]["nvrx-train"]["runtime"].pop("efa_installer", None)
    found = nvrx_messages(f"pip install nvidia-resiliency-ext==0.7.0\n{FT_RUN}", ImageLock.from_dict(data))
    assert any("aws-ofi-nccl version is not recorded (runtime.aws_ofi_nccl" in m for m in found), found


def test_inprocess_restart_on_an_nccl_that_crashes_with_it() -> None:
    found = nvrx_messages(f"{NVRX_START}\n{NVRX_RUN}", lock_with(nccl="2.28.5"))
    assert any("NCCL 2.28.5 crashes with NVRx in-process restart (NCCL 2.28.3 to 2.28.8" in m for m in found), found

    # 2.28.9 is the first fixed release; without in-process restart any NCCL will do. (0.4.1 has no wheel for this
    # base's glibc 2.34 and its aws-ofi-nccl leaks with restarts: those findings are other tests'.)
    def crashes(found: list[str]) -> list[str]:
        return [m for m in found if "crashes with NVRx in-process restart" in m]

    assert crashes(nvrx_messages(f"{NVRX_START}\n{NVRX_RUN}", lock_with(nccl="2.28.9"))) == []
    assert (
        crashes(nvrx_messages(f"{NVRX_START}\nexec ft_launcher -m training.nvrx_fsdp", lock_with(nccl="2.28.5"))) == []
    )


def test_inprocess_restart_on_an_image_whose_nccl_is_not_recorded() -> None:
    data = LOCK.to_dict()
    data["images"]["nvrx-train"]["runtime"].pop("nccl", None)
    found = nvrx_messages(f"{NVRX_START}\n{NVRX_RUN}", ImageLock.from_dict(data))
    assert any("NCCL version is not recorded (runtime.nccl" in m for m in found), found


def test_nvrx_0_6_and_later_refuse_min_healthy_and_keep_in_process_restart() -> None:
    """0.4.1's in-process command line (min-healthy) ends ft_launcher 0.6+ with exit 2; in-process restart itself is
    deprecated there but works, so it alone is not refused."""
    for version in ("0.6.0", "0.7.0"):
        found = nvrx_messages(f"pip install nvidia-resiliency-ext=={version}\n{NVRX_RUN}", LOCK)
        assert any(m.startswith(f"NVRx {version} removed --ft-restart-policy=min-healthy") for m in found), found
        run = NVRX_RUN.replace(" --ft-restart-policy=min-healthy", "")
        found = nvrx_messages(f"pip install nvidia-resiliency-ext=={version}\n{run}", LOCK)
        assert not any("in-process" in m and "deprecat" in m for m in found), found


def test_nvrx_baked_into_an_image_outside_its_python_range() -> None:
    lock = lock_with(python="3.13", packages={"torch": "2.9.0", "nvidia-resiliency-ext": "0.4.1"})
    found = nvrx_messages(NVRX_RUN, lock)
    assert any(m.startswith("NVRx 0.4.1 supports Python <3.13,>=3.10, the image has Python 3.13") for m in found), found
