"""scripts/image_envs.py: which environment each image gets (from the lock and the workloads' start installs), where
its Python comes from, and the refusals (a missing Python, an environment not built or built for other pins)."""

from __future__ import annotations

from pathlib import Path

import pytest

from k8s.images import ImageLock
from k8s.nvrx_spec import NvrxFsdpJob
from tests.image_envs import module

image_envs = module()
LOCK = ImageLock.load()


def test_each_image_gets_its_python_and_every_version_the_lock_records() -> None:
    envs = {e.image: e for e in image_envs.image_envs(LOCK)}
    assert sorted(envs) == sorted(n for n, i in LOCK.images.items() if i.runtime is not None)
    for name, env in envs.items():
        runtime = LOCK.get(name).runtime
        assert runtime is not None
        assert env.python == runtime.python
        pins = {r.split("[")[0].partition("==")[0]: r.partition("==")[2] for r in env.requirements}
        for package, version in runtime.packages.items():
            if package in env.skipped:
                continue
            assert pins[package] == version, (name, package)
    # What the NVRx pods install at start is part of that image's environment; Ray gets the dashboard and Train.
    nvrx = envs["nvrx-train"]
    assert set(NvrxFsdpJob().pip) <= set(nvrx.requirements)
    assert (nvrx.python, "torch==2.13.0" in nvrx.requirements) == ("3.12", True)
    assert "ray[default,train]==2.58.0" in envs["ray-train"].requirements
    # GPU-only builds are named with the reason, never silently dropped.
    assert set(envs["ray-train"].skipped) == {"flash-attn", "transformer-engine", "deepspeed"}


def test_a_start_install_that_disagrees_with_the_lock_is_refused() -> None:
    with pytest.raises(image_envs.ImageEnvError, match=r"installs torch==2.10.0 at start where the lock records"):
        image_envs.image_envs(LOCK, {"nvrx-train": ("torch==2.10.0",)})


def _python(root: Path, version: str) -> Path:
    path = root / "versions" / version / "bin" / "python3"
    path.parent.mkdir(parents=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_the_newest_pyenv_patch_release_of_the_images_minor_version(tmp_path: Path) -> None:
    _python(tmp_path, "3.12.1")
    newest = _python(tmp_path, "3.12.10")
    _python(tmp_path, "3.13.0")
    assert image_envs.find_python("3.12", tmp_path, path="") == newest


def test_a_missing_python_names_the_image_version_and_the_fix(tmp_path: Path) -> None:
    _python(tmp_path, "3.11.7")
    with pytest.raises(image_envs.ImageEnvError) as info:
        image_envs.find_python("3.12", tmp_path, path=str(tmp_path))
    message = str(info.value)
    assert "no CPython 3.12 here" in message
    assert "`pyenv install 3.12`" in message
    assert message.endswith("run make image-envs again")


def test_an_environment_not_built_or_built_for_other_pins_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(image_envs, "ROOT", tmp_path)
    with pytest.raises(image_envs.ImageEnvError, match=r"\.venv-nvrx-train is not built; run make image-envs"):
        image_envs.built_interpreter("nvrx-train", LOCK)
    venv = tmp_path / ".venv-nvrx-train"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / image_envs.STAMP).write_text('{"digest": "older pins"}')
    with pytest.raises(image_envs.ImageEnvError, match=r"was built for other pins; run make image-envs"):
        image_envs.built_interpreter("nvrx-train", LOCK)
    with pytest.raises(image_envs.ImageEnvError, match=r"image 'nope' has no runtime facts"):
        image_envs.built_interpreter("nope", LOCK)


def test_the_cli_exits_2_naming_an_unknown_image(capsys: pytest.CaptureFixture[str]) -> None:
    assert image_envs.main(["build", "nope"]) == 2
    assert "unknown image(s) ['nope']" in capsys.readouterr().err


def test_nvrx_is_installed_as_the_makefile_installs_it_and_the_other_images_as_before() -> None:
    """NVRx 0.7.0's only wheel is cp312 manylinux_2_39, which a plain `pip install` refuses on this glibc (2.36):
    it goes, without its dependencies, into a folder of the environment's own (--target with the wheel's platform),
    and what its modules import goes with the other pins."""
    envs = {e.image: e for e in image_envs.image_envs(LOCK)}
    nvrx = envs["nvrx-train"]
    pip = [str(nvrx.interpreter), "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    plain, target = image_envs.pip_argvs(nvrx)
    assert "nvidia-resiliency-ext==0.7.0" not in plain
    assert plain[: len(pip) + 1] == [*pip, "--only-binary=:all:"]
    runtime = LOCK.get("nvrx-train").runtime
    assert runtime is not None
    torch_pin = f"torch=={runtime.packages['torch']}"  # the base image's, from the lock
    assert set(plain) >= {torch_pin, "transformers==5.23.0", "httpx>=0.24.0", "defusedxml", "protobuf>=6.31.1"}
    assert not {"fastapi", "uvicorn", "slowapi", "pydantic-settings", "grpcio-tools"} & {
        a.split(">")[0].split("[")[0] for a in plain
    }
    assert target == [
        *pip, "--no-deps", "--only-binary=:all:", "--platform", "manylinux_2_39_x86_64", "--python-version", "3.12",
        "--implementation", "cp", "--target", str(nvrx.venv / "nvrx"), "nvidia-resiliency-ext==0.7.0",
    ]  # fmt: skip
    ray = envs["ray-train"]
    assert image_envs.pip_argvs(ray) == [[str(ray.interpreter), *pip[1:], "--only-binary=:all:", *ray.requirements]]
    assert "nvidia-resiliency-ext==0.7.0" in nvrx.requirements  # verify still checks its version


def test_nvrxs_imports_are_its_requirements_less_what_the_job_never_imports() -> None:
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    from tests.training.test_gpu_bundle import gb

    install = image_envs.TARGET_INSTALLS["nvidia-resiliency-ext"]
    declared = {canonicalize_name(Requirement(r).name) for r in metadata.requires("nvidia-resiliency-ext") or []
                if Requirement(r).marker is None}  # fmt: skip
    left_behind = set(gb.LEFT_BEHIND["nvidia-resiliency-ext"])
    assert {canonicalize_name(Requirement(r).name) for r in install.imports} == declared - left_behind - {"torch"}
    assert set(gb.ADDED_REQUIRES["nvidia-resiliency-ext"]) <= set(install.imports)
