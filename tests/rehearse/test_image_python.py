"""Options.image_python: an image's containers run the environment built for that image (its Python and package
versions, scripts/image_envs.py), the other images this process's; a missing interpreter is refused up front."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rehearse import Options, RehearsalError
from tests.rehearse.test_harness import job, python_container, rehearse

PRINT_PREFIX = "import sys; print('prefix', sys.prefix)"


@pytest.mark.rehearsal
@pytest.mark.usefixtures("namespaces")
def test_an_images_containers_run_its_own_python_and_the_others_this_one(tmp_path: Path) -> None:
    # Under /tmp, which every pod hides behind its own tmpfs: the runtime must show the environment to the pods.
    image_env = tmp_path / "image-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(image_env)], check=True, timeout=120)
    obj = job("two-images", "")
    obj["spec"]["template"]["spec"]["containers"] = [
        python_container(PRINT_PREFIX, name="imaged", image="example.invalid/with-env:1"),
        python_container(PRINT_PREFIX, name="plain", image="example.invalid/other:1"),
    ]
    python = image_env / "bin" / "python"
    result = rehearse(tmp_path, obj, image_python={"example.invalid/with-env:1@sha256:" + "0" * 64: python})
    w = result.workload("two-images")
    assert w.state == "Complete", (w.message, [(p.exit_codes, p.log()) for p in w.pods])
    pod = w.pods[0]
    assert f"prefix {image_env}" in pod.log("imaged"), pod.log("imaged")
    assert f"prefix {sys.prefix}" in pod.log("plain"), pod.log("plain")


def test_an_image_python_that_is_not_there_is_refused_naming_the_fix(tmp_path: Path) -> None:
    missing = tmp_path / ".venv-nvrx-train" / "bin" / "python"
    with pytest.raises(RehearsalError, match=r"image_python\['nvrx:1'\].*make image-envs"):
        Options(image_python={"nvrx:1": missing})
