"""images/nvrx/Dockerfile and its build script: one fact each (the pins are NvrxFsdpJob.pip, the base is the lock's
nvrx-train reference), and the build-time import check names modules that exist in the pinned NVRx. Nobody can run
docker here: the image itself has never been built in this project's CI."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

from k8s.images import ImageLock
from k8s.nvrx_spec import NVRX_IMAGE, NvrxFsdpJob
from tests.conftest import ROOT

DOCKERFILE = ROOT / "images/nvrx/Dockerfile"
BUILD = ROOT / "scripts/build_nvrx_image.sh"


def _instructions() -> list[str]:
    """Dockerfile instructions with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_image_installs_exactly_the_jobs_pinned_packages() -> None:
    (install,) = [i for i in _instructions() if i.startswith("RUN python -m pip install")]
    packages = [a for a in shlex.split(install.removeprefix("RUN ")) if "==" in a]
    assert tuple(packages) == NvrxFsdpJob().pip


def test_the_base_is_the_locks_nvrx_train_reference() -> None:
    instructions = _instructions()
    (arg,) = [i for i in instructions if i.startswith("ARG BASE=")]
    assert arg.removeprefix("ARG BASE=") == ImageLock.load().get(NVRX_IMAGE).reference
    assert "FROM ${BASE}" in instructions


def test_the_build_time_import_check_passes_against_the_pinned_nvrx() -> None:
    (check,) = [i for i in _instructions() if i.startswith('RUN python -c "')]
    code = shlex.split(check.removeprefix("RUN "))[2]
    for name in ("inprocess import Wrapper", "TorchAsyncCheckpoint", "AsyncCallsQueue", "LocalCheckpointManager"):
        assert name in code
    # nvidia-resiliency-ext 0.4.1 is in this environment: the same statement must import here.
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout.strip()) == (0, "nvrx imports ok"), result.stderr


def test_the_build_script_parses_and_pins_through_trainctl() -> None:
    assert subprocess.run(["bash", "-n", str(BUILD)], capture_output=True, text=True).returncode == 0
    text = BUILD.read_text()
    assert 'docker build --build-arg "BASE=$base"' in text
    assert 'trainctl pin --set "nvrx-train-$env=' in text
    assert 'python3 -m k8s.built_images add "$env" "$account"' in text
    usage = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=30)
    assert (usage.returncode, usage.stderr.strip()) == (2, f"usage: {BUILD} ENV ACCOUNT")


def test_the_built_image_entry_is_added_unpinned_with_the_dockerfile_packages() -> None:
    from infra.spec import ENVIRONMENTS
    from k8s.built_images import built_image, built_reference
    from k8s.images import ImageLock
    from k8s.nvrx_spec import NvrxFsdpJob

    lock = ImageLock.load()
    prod = ENVIRONMENTS["prod"]
    entry = built_image(lock, prod, reference=built_reference(prod, "123456789012"), digest=None)
    assert entry.name == "nvrx-train-prod"
    assert entry.reference.startswith("123456789012.dkr.ecr.us-east-2.amazonaws.com/ml-prod/nvrx-train:nvrx-")
    assert entry.runtime is not None
    base = lock.get(NVRX_IMAGE).runtime
    assert base is not None
    assert (entry.runtime.python, entry.runtime.nccl) == (base.python, base.nccl)
    assert {f"{n}=={v}" for n, v in entry.runtime.packages.items()} >= set(NvrxFsdpJob().pip)
