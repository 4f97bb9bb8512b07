"""make test-image only (IMAGE_ENVS=1): the rehearsal's pods of each training image really run that image's
environment, the Python and package versions k8s/images.lock.json records, so the NVRx and Ray rehearsals of the
same run exercise the training code on the versions the cluster will have."""

from __future__ import annotations

from pathlib import Path

import pytest

from k8s.check_lock import check_lock
from k8s.images import ImageLock
from tests.image_envs import image_pythons, module
from tests.rehearse.test_harness import job, python_container, rehearse

pytestmark = [pytest.mark.rehearsal, pytest.mark.image_env, pytest.mark.usefixtures("namespaces")]

REPORT = """
import importlib.metadata as m, sys
print("python", "%d.%d" % sys.version_info[:2])
for name in sys.argv[1:]:
    print("package", name, m.version(name).split("+")[0])
"""


def test_each_images_pods_run_its_python_and_the_locks_versions(tmp_path: Path) -> None:
    lock = check_lock(ImageLock.load())
    pythons = image_pythons(lock)
    assert pythons, "IMAGE_ENVS=1 is not set: run this through make test-image"
    # image -> (its Python, the versions its environment must have: the lock's and its start installs')
    expected = {
        env.image: (env.python, dict(r.split("[")[0].split("==") for r in env.requirements))
        for env in module().image_envs(lock)
    }
    obj = job("image-envs", "")
    obj["spec"]["template"]["spec"]["containers"] = [
        {**(c := python_container(REPORT, name=image, image=lock.pinned(image))), "command": [*c["command"], *pins]}
        for image, (_, pins) in sorted(expected.items())
    ]
    w = rehearse(tmp_path, obj, image_python=pythons, timeout_s=120.0).workload("image-envs")
    assert w.state == "Complete", (w.message, [p.log() for p in w.pods])
    for image, (python, pins) in expected.items():
        log = w.pods[0].log(image)
        assert f"python {python}\n" in log, log
        for package, version in pins.items():
            assert f"package {package} {version}\n" in log, log
