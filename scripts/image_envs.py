"""One virtualenv per training image: the image's Python and the package versions k8s/images.lock.json records.

    python scripts/image_envs.py build [IMAGE...]   create or update .venv-IMAGE (all images with runtime facts)
    python scripts/image_envs.py list              the interpreter and requirements each environment gets
    python scripts/image_envs.py python IMAGE      the built environment's interpreter (exit 2 if not built)

The rehearsals run here on this machine's environment (torch 2.13 on CPython 3.11), not the image's; these
environments let the same tests run the training code on what the pods will have (`make test-image`, docs/testing.md):
each is created with the image's CPython minor version (from pyenv's versions or PATH; refused, naming the fix, where
missing) and gets, pinned and as wheels only, every package the lock records for the image plus what the image's
workload installs at start (NvrxFsdpJob.pip, RayFinetuneJob.pip), less the GPU-only builds in NOT_INSTALLED. The
package index's torch is its CUDA build, with the nvidia-* libraries it links against (several GB, see
docs/testing.md): it runs on CPU. Packages the lock does not record are whatever pip resolves for those pins, written
to the environment's image-env.json with the pins, so a rerun with the same pins installs nothing. NVRx is installed
apart, as the Makefile installs it here (TARGET_INSTALLS says why).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from k8s.images import ImageLock
from k8s.nvrx_spec import NVRX_IMAGE, NvrxFsdpJob
from k8s.ray_spec import RAY_IMAGE
from k8s.workloads import RayFinetuneJob

ROOT = Path(__file__).resolve().parent.parent
STAMP = "image-env.json"

# What each image's workload installs at container start, on top of the image (the charts' defaults).
START_INSTALLS: Mapping[str, tuple[str, ...]] = {NVRX_IMAGE: NvrxFsdpJob().pip, RAY_IMAGE: RayFinetuneJob().pip}
# Extras of a recorded package that the image installs too (docker/ray-train/pyproject.toml of
# aws/deep-learning-containers: ray[default,train,tune,data]; the pods need the dashboard and Ray Train).
EXTRAS: Mapping[str, str] = {"ray": "default,train"}
# Recorded in the lock, not installed here: CUDA builds with no CPU wheel, which the training code never imports.
NOT_INSTALLED: Mapping[str, str] = {
    "flash-attn": "source only on the index; the build needs nvcc and a CUDA toolkit",
    "transformer-engine": "builds its PyTorch extension against CUDA",
    "deepspeed": "source only on the index; its op builder needs CUDA to be useful",
}


@dataclass(frozen=True)
class TargetInstall:
    """A package whose only wheel pip refuses here, installed as the Makefile's NVRX_INSTALL installs NVRx."""

    platform: str  # the wheel's own platform tag, which pip is told to accept
    folder: str  # under the venv, put on its path by a .pth file
    imports: tuple[str, ...]  # what its modules import, installed with the other pins in its stead
    scripts: tuple[str, ...]  # console scripts linked into the venv's bin/


# From 0.6 on NVRx publishes only a cp312 manylinux_2_39 wheel (no sdist), which a plain `pip install` refuses on this
# machine's glibc (2.36). So, as the Makefile's NVRX_INSTALL does: the wheel with --no-deps into a folder of the
# environment's own, pip told the wheel's platform and the image's Python (--target is what lets it take them), a
# .pth file putting the folder on the path. Not its declared dependencies: 0.7.0 requires its optional services'
# packages (fastapi, uvicorn[standard], slowapi, pydantic, pydantic-settings; grpcio-tools at build time), which
# the job never imports (scripts/gpu_bundle.py LEFT_BEHIND, verified there); the rest of its Requires-Dist, which
# its modules do import, goes with the other pins (protobuf at 6.31.1 or later: its generated *_pb2 modules refuse
# older, gpu_bundle ADDED_REQUIRES). Its one compiled module (the straggler detector's CUPTI extension, GLIBC_2.32) is
# not loaded by the job. tests/test_image_envs.py ties `imports` to NVRx's metadata less LEFT_BEHIND.
TARGET_INSTALLS: Mapping[str, TargetInstall] = {
    "nvidia-resiliency-ext": TargetInstall(
        platform="manylinux_2_39_x86_64",
        folder="nvrx",
        imports=(
            "defusedxml",
            "grpcio>=1.76.0,<2.0.0",
            "httpx>=0.24.0",
            "numpy>=1.26",
            "nvidia-ml-py>=12.570.86",
            "packaging",
            "protobuf>=6.31.1",
            "psutil>=6.0.0",
            "pyyaml",
        ),
        scripts=("ft_launcher",),
    )
}


class ImageEnvError(Exception):
    """An environment that cannot be built or is not what the lock records."""


@dataclass(frozen=True)
class ImageEnv:
    image: str
    python: str  # the image's CPython minor version, e.g. 3.12
    requirements: tuple[str, ...]
    skipped: Mapping[str, str] = field(default_factory=dict)

    @property
    def venv(self) -> Path:
        return ROOT / f".venv-{self.image}"

    @property
    def interpreter(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def digest(self) -> str:
        targets = [r for r in self.requirements if _name(r) in TARGET_INSTALLS]
        # The install of TARGET_INSTALLS counts only where there is one (other images' digests stay as they were).
        how = [[r, TARGET_INSTALLS[_name(r)].imports] for r in targets]
        text = json.dumps([self.python, list(self.requirements), *([how] if how else [])])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _name(requirement: str) -> str:
    return re.sub(r"\[.*\]", "", requirement).partition("==")[0]


def pip_argvs(env: ImageEnv) -> list[list[str]]:
    """The pip commands that install env: its pins (with what a TARGET_INSTALLS package imports, in its stead), then
    each TARGET_INSTALLS package by itself."""
    pip = [str(env.interpreter), "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    targets = [r for r in env.requirements if _name(r) in TARGET_INSTALLS]
    imports = [i for r in targets for i in TARGET_INSTALLS[_name(r)].imports]
    plain = [r for r in env.requirements if r not in targets]
    argvs = [[*pip, "--only-binary=:all:", *plain, *imports]]
    for requirement in targets:
        install = TARGET_INSTALLS[_name(requirement)]
        argvs.append(
            [*pip, "--no-deps", "--only-binary=:all:", "--platform", install.platform, "--python-version", env.python,
             "--implementation", "cp", "--target", str(env.venv / install.folder), requirement]
        )  # fmt: skip
    return argvs


def _install_targets(env: ImageEnv, argvs: Sequence[Sequence[str]], pip_env: Mapping[str, str]) -> None:
    """Run the TARGET_INSTALLS commands (pip_argvs after the first) into fresh folders; a .pth puts each on the
    environment's path and its console scripts are linked into bin/ (written with this interpreter's shebang)."""
    purelib = subprocess.run(
        [str(env.interpreter), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip()  # fmt: skip
    for requirement, argv in zip([r for r in env.requirements if _name(r) in TARGET_INSTALLS], argvs, strict=True):
        install = TARGET_INSTALLS[_name(requirement)]
        folder = env.venv / install.folder
        shutil.rmtree(folder, ignore_errors=True)
        subprocess.run(list(argv), check=True, env=dict(pip_env))
        (Path(purelib) / f"{install.folder}.pth").write_text(f"{folder}\n")
        for script in install.scripts:
            link = env.venv / "bin" / script
            link.unlink(missing_ok=True)
            link.symlink_to(folder / "bin" / script)


def image_envs(lock: ImageLock, start_installs: Mapping[str, Sequence[str]] = START_INSTALLS) -> list[ImageEnv]:
    """An environment for every image whose runtime facts the lock records."""
    envs = []
    for name, image in sorted(lock.images.items()):
        if image.runtime is None:
            continue
        pins = dict(image.runtime.packages)
        for spec in start_installs.get(name, ()):
            package, _, version = spec.partition("==")
            package = package.lower()
            if package in pins and pins[package] != version:
                raise ImageEnvError(
                    f"images.{name}: the workload installs {spec} at start where the lock records {package} "
                    f"{pins[package]}; make them agree"
                )
            pins[package] = version
        skipped = {p: NOT_INSTALLED[p] for p in sorted(pins) if p in NOT_INSTALLED}
        kept = sorted((p, v) for p, v in pins.items() if p not in skipped)
        requirements = tuple(f"{p}[{EXTRAS[p]}]=={v}" if p in EXTRAS else f"{p}=={v}" for p, v in kept)
        envs.append(ImageEnv(name, image.runtime.python, requirements, skipped))
    return envs


def find_python(minor: str, pyenv_root: Path | None = None, path: str | None = None) -> Path:
    """The newest CPython `minor` under pyenv's versions, else pythonX.Y on PATH."""
    root = pyenv_root or Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    pattern = re.compile(rf"^{re.escape(minor)}\.(\d+)$")
    found = []
    if (root / "versions").is_dir():
        for version in (root / "versions").iterdir():
            m = pattern.match(version.name)
            if m and (version / "bin" / "python3").exists():
                found.append((int(m.group(1)), version / "bin" / "python3"))
    if found:
        return max(found)[1]
    on_path = shutil.which(f"python{minor}", path=path)
    if on_path:
        return Path(on_path)
    raise ImageEnvError(
        f"no CPython {minor} here (looked for {root}/versions/{minor}.* and python{minor} on PATH); the image runs "
        f"Python {minor} (k8s/images.lock.json). Fix: `pyenv install {minor}` (or install python{minor} from the "
        "distribution), then run make image-envs again"
    )


def _stamp(env: ImageEnv) -> dict[str, object] | None:
    try:
        data: dict[str, object] = json.loads((env.venv / STAMP).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data


def installed_versions(interpreter: Path, names: Sequence[str]) -> dict[str, str | None]:
    code = (
        "import importlib.metadata as m, json, sys\n"
        "def v(n):\n"
        "    try: return m.version(n)\n"
        "    except m.PackageNotFoundError: return None\n"
        "print(json.dumps({n: v(n) for n in sys.argv[1:]}))"
    )
    done = subprocess.run([str(interpreter), "-c", code, *names], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise ImageEnvError(f"{interpreter}: cannot read its packages: {done.stderr.strip()[-500:]}")
    versions: dict[str, str | None] = json.loads(done.stdout)
    return versions


def verify(env: ImageEnv) -> None:
    """Every pin is what the environment has (a local label such as +cpu aside), on the image's Python."""
    names = [_name(r) for r in env.requirements]
    have = installed_versions(env.interpreter, names)
    wrong = []
    for requirement, name in zip(env.requirements, names, strict=True):
        want = requirement.partition("==")[2]
        got = have.get(name)
        if got is None or got.split("+")[0] != want:
            wrong.append(f"{name}: want {want}, have {got or 'nothing'}")
    version = subprocess.run(
        [str(env.interpreter), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip()  # fmt: skip
    if version != env.python:
        wrong.append(f"python: want {env.python}, have {version}")
    if wrong:
        raise ImageEnvError(f"{env.venv.name} is not image {env.image}'s environment: " + "; ".join(wrong))


def build(env: ImageEnv, *, log: bool = True) -> bool:
    """Create or update the environment; False when its stamp says it is already built with these pins."""
    stamp = _stamp(env)
    if stamp is not None and stamp.get("digest") == env.digest and env.interpreter.exists():
        verify(env)
        return False
    base = find_python(env.python)
    if env.interpreter.exists():
        current = subprocess.run(
            [str(env.interpreter), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True, text=True, timeout=60,
        ).stdout.strip()  # fmt: skip
        if current != env.python:
            shutil.rmtree(env.venv)
    if not env.interpreter.exists():
        subprocess.run([str(base), "-m", "venv", str(env.venv)], check=True)
    if log:
        print(f"{env.venv.name}: CPython {env.python} from {base}; {' '.join(env.requirements)}", flush=True)
        for name, reason in env.skipped.items():
            print(f"{env.venv.name}: not installed: {name} ({reason})", flush=True)
    # The project's constraints are for its own environment (torch 2.13 on 3.11), not for the image's.
    pip_env = {**os.environ, "PIP_CONSTRAINT": ""}
    first, *targets = pip_argvs(env)
    subprocess.run(first, check=True, env=pip_env)
    _install_targets(env, targets, pip_env)
    verify(env)
    freeze = subprocess.run(
        [str(env.interpreter), "-m", "pip", "freeze", "--disable-pip-version-check"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    record = {"image": env.image, "python": env.python, "digest": env.digest, "requirements": list(env.requirements),
              "not_installed": dict(env.skipped), "freeze": freeze}  # fmt: skip
    (env.venv / STAMP).write_text(json.dumps(record, indent=1) + "\n")
    return True


def built_interpreter(image: str, lock: ImageLock | None = None) -> Path:
    """The interpreter of image's environment, refused unless it is built with the lock's current pins."""
    envs = {e.image: e for e in image_envs(lock or ImageLock.load())}
    if image not in envs:
        raise ImageEnvError(f"image {image!r} has no runtime facts in k8s/images.lock.json; images: {sorted(envs)}")
    env = envs[image]
    stamp = _stamp(env)
    if stamp is None or stamp.get("digest") != env.digest or not env.interpreter.exists():
        state = "is not built" if stamp is None else "was built for other pins"
        raise ImageEnvError(f"{env.venv.name} {state}; run make image-envs")
    return env.interpreter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/image_envs.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="create or update the environments")
    b.add_argument("images", nargs="*", help="lock image names (default: every image with runtime facts)")
    sub.add_parser("list", help="print each environment's Python and requirements")
    p = sub.add_parser("python", help="print a built environment's interpreter")
    p.add_argument("image")
    args = parser.parse_args(argv)
    try:
        lock = ImageLock.load()
        envs = image_envs(lock)
        if args.command == "list":
            for env in envs:
                skipped = "".join(f"\n  not installed: {n} ({r})" for n, r in env.skipped.items())
                print(f"{env.venv.name}: CPython {env.python}\n  " + "\n  ".join(env.requirements) + skipped)
        elif args.command == "python":
            print(built_interpreter(args.image, lock))
        else:
            unknown = set(args.images) - {e.image for e in envs}
            if unknown:
                raise ImageEnvError(f"unknown image(s) {sorted(unknown)}; images: {[e.image for e in envs]}")
            for env in envs:
                if not args.images or env.image in args.images:
                    changed = build(env)
                    print(f"{env.venv.name}: {'built' if changed else 'up to date'}")
    except ImageEnvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as exc:
        print(f"error: {' '.join(map(str, exc.cmd[:4]))} ... exited {exc.returncode}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
