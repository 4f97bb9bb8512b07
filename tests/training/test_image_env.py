"""make test-image only (IMAGE_ENVS=1): the NVRx runs of tests/training/nvrx_runs.py start the NVRx image's
ft_launcher, so their ranks run that image's Python, torch and NVRx."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from k8s.images import ImageLock
from tests.image_envs import interpreter
from tests.training.nvrx_runs import FT_LAUNCHER

pytestmark = pytest.mark.image_env


def test_the_nvrx_runs_use_the_nvrx_images_environment() -> None:
    python = interpreter("nvrx-train")
    assert Path(FT_LAUNCHER) == python.with_name("ft_launcher")
    runtime = ImageLock.load().get("nvrx-train").runtime
    assert runtime is not None
    code = "import sys, torch; print('%d.%d' % sys.version_info[:2], torch.__version__.split('+')[0])"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.split() == [runtime.python, runtime.packages["torch"]]
