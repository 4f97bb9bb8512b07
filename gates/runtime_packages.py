"""Gate `runtime-packages`: what a workload installs when it starts must fit the image it starts in.

A package installed at start (a RayJob's `runtimeEnvYAML` pip list, a `pip install` in a container's command) must
1. be pinned (NAME==VERSION),
2. have a wheel for the image's Python and platform (`runtime` in k8s/images.lock.json): pip on Python 3.13 finds
   no distribution of nvidia-resiliency-ext 0.4.1 (cp310-cp312 wheels only, no sdist), so the pod exits 1,
3. not replace a package the image provides (another version of it), and
4. not require a version of an image package that the image does not have (pip would replace that one: transformers
   5.23 needs tokenizers >= 0.23.1 where the Ray DLC's transformers 5.13 pins tokenizers <= 0.23.0).

And a workload that runs NVRx (installed at start or in the image) must fit NVRx's own support table
(k8s/nvrx_support.py): its Python range, no in-process restart on NCCL 2.28.3 to 2.28.8, no min-healthy on NVRx 0.6+;
and no restart mechanism (ft_launcher with --max-restarts above 0, in-process restart) on an image whose aws-ofi-nccl
leaks on every communicator teardown (< 1.21.0, k8s/ofi_nccl.py).

Facts about wheels and their Requires-Dist come from the committed offline cache k8s/runtime_wheels.json, so the gate
is deterministic and needs no network. Refresh it where the package index is reachable (pip's configured index;
nothing is named here):

    python -m gates.runtime_packages --refresh [--cache k8s/runtime_wheels.json] [--dist .check/dist]

which runs `pip download --isolated --no-deps --only-binary=:all: --python-version X.Y --platform ...` per package
and image, and records the wheel found (or none) and its Requires-Dist.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from gates import outputs
from gates.report import Finding, GateError
from k8s.check_lock import check_lock
from k8s.images import ImageLock, ImageRuntime
from k8s.nvrx_support import NVRX_DISTRIBUTION, NVRX_SUPPORT
from k8s.ofi_nccl import restart_mechanisms, restart_problems

GATE = "runtime-packages"
ROOT = Path(__file__).resolve().parent.parent
CACHE_PATH = ROOT / "k8s" / "runtime_wheels.json"
REFRESH = "python -m gates.runtime_packages --refresh"
PINNED = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[0-9][0-9A-Za-z.+!-]*)$")
_SHELL_BREAKS = re.compile(r"\|\||&&|;|\||\n|\(|\)")


@dataclass(frozen=True)
class StartInstall:
    """Packages one workload installs at start, in one image."""

    where: str
    image: str
    packages: tuple[str, ...]


def target(runtime: ImageRuntime) -> str:
    return f"cp{runtime.python.replace('.', '')}-{runtime.arch}-glibc{runtime.glibc}"


# --- what the manifests install at start ---------------------------------------------------------------------------


def _containers(spec: Any) -> Iterator[dict[str, Any]]:
    """Every container of every pod template below `spec` (Job, RayCluster head/worker groups, RayJob's cluster)."""
    if isinstance(spec, dict):
        for key, value in spec.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                yield from (c for c in value if isinstance(c, dict))
            else:
                yield from _containers(value)
    elif isinstance(spec, list):
        for value in spec:
            yield from _containers(value)


def pip_installs_in(script: str) -> list[list[str]]:
    """The arguments of each `pip install` in a shell script (each simple command split on ; && || | and newlines)."""
    found = []
    for segment in _SHELL_BREAKS.split(script):
        try:
            words = shlex.split(segment, comments=True)
        except ValueError:
            continue
        while words and (words[0] in ("exec", "command", "sudo") or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0])):
            words = words[1:]
        if not words:
            continue
        program = words[0].rsplit("/", 1)[-1]
        if re.match(r"^pip(3(\.\d+)?)?$", program) and words[1:2] == ["install"]:
            found.append(words[2:])
        elif re.match(r"^python(3(\.\d+)?)?$", program) and words[1:4] == ["-m", "pip", "install"]:
            found.append(words[4:])
    return found


def _requirements(arguments: list[str], where: str) -> tuple[list[str], list[Finding]]:
    packages, findings = [], []
    skip = False
    for arg in arguments:
        if skip:
            skip = False
            continue
        if arg in ("-r", "--requirement", "-c", "--constraint", "-e", "--editable"):
            findings.append(
                Finding(GATE, where, f"`pip install {arg}` cannot be checked; list pinned packages instead")
            )
            skip = True
        elif arg in ("-i", "--index-url", "--extra-index-url", "-f", "--find-links", "--target", "-t", "--prefix"):
            skip = True
        elif not arg.startswith("-"):
            packages.append(arg)
    return packages, findings


def start_installs(objects: Iterable[tuple[str, dict[str, Any]]]) -> tuple[list[StartInstall], list[Finding]]:
    installs: list[StartInstall] = []
    findings: list[Finding] = []
    for where, obj in objects:
        if not isinstance(obj, dict):
            continue
        spec = obj.get("spec") or {}
        containers = list(_containers(spec))
        if obj.get("kind") == "RayJob" and spec.get("runtimeEnvYAML"):
            runtime_env = yaml.safe_load(spec["runtimeEnvYAML"]) or {}
            pip = runtime_env.get("pip") or []
            if isinstance(pip, dict):
                pip = pip.get("packages") or []
            # Ray installs runtime_env packages on every node that runs the job's workers.
            for image in sorted({c.get("image", "") for c in containers}):
                installs.append(StartInstall(f"{where} runtimeEnvYAML", image, tuple(str(p) for p in pip)))
        for container in containers:
            script = "\n".join(
                str(part) for part in [*(container.get("command") or []), *(container.get("args") or [])]
            )
            label = f"{where} container {container.get('name', '?')}"
            for arguments in pip_installs_in(script):
                packages, problems = _requirements(arguments, label)
                findings += problems
                installs.append(StartInstall(label, str(container.get("image", "")), tuple(packages)))
    return [i for i in installs if i.packages], findings


# --- the offline cache -----------------------------------------------------------------------------------------------


def load_cache(path: Path = CACHE_PATH) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as exc:
        raise GateError(f"{path}: not valid JSON ({exc}); refresh it with `{REFRESH}`") from None
    if not isinstance(data, dict):
        raise GateError(f"{path}: expected a mapping of NAME==VERSION -> targets; refresh it with `{REFRESH}`")
    return data


def _image_environment(runtime: ImageRuntime) -> dict[str, str]:
    env: dict[str, str] = {key: str(value) for key, value in default_environment().items()}
    env.update(
        python_version=runtime.python,
        python_full_version=f"{runtime.python}.0",
        platform_machine=runtime.arch,
        sys_platform="linux",
        platform_system="Linux",
        os_name="posix",
        implementation_name="cpython",
        platform_python_implementation="CPython",
    )
    return env


def check_install(install: StartInstall, lock: ImageLock, cache: dict[str, Any]) -> list[Finding]:
    image = lock.by_reference(install.image)
    where = install.where
    if image is None or image.runtime is None:
        name = "an image outside the lock" if image is None else f"image {image.name}"
        return [
            Finding(
                GATE,
                where,
                f"installs {', '.join(install.packages)} at start in {name} ({install.image}) whose Python, platform "
                "and packages are not recorded: add `runtime` to its entry in k8s/images.lock.json",
            )
        ]
    runtime = image.runtime
    provided = {canonicalize_name(n): v for n, v in runtime.packages.items()}
    env = _image_environment(runtime)
    findings = []
    for spec in install.packages:
        pinned = PINNED.match(spec)
        if pinned is None:
            findings.append(Finding(GATE, where, f"{spec!r} is not pinned; write NAME==VERSION"))
            continue
        name, version = canonicalize_name(pinned["name"]), pinned["version"]
        on_image = f"image {image.name} (Python {runtime.python}, glibc {runtime.glibc}, {runtime.arch})"
        if name in provided and Version(provided[name]) != Version(version):
            findings.append(
                Finding(
                    GATE,
                    where,
                    f"{spec} replaces {name} {provided[name]} that {on_image} provides; use the image's version "
                    "(drop it from the install) or an image built with the one you need",
                )
            )
        entry = cache.get(f"{name}=={version}", {}).get(target(runtime))
        if entry is None:
            findings.append(Finding(GATE, where, f"{spec} on {on_image} is not in {CACHE_PATH.name}; run `{REFRESH}`"))
            continue
        if entry.get("wheel") is None:
            pip_said = f": {entry['note']}" if entry.get("note") else ""
            # NVRx without a wheel for the image's C library (0.7.0: manylinux_2_39 only) is built from its source
            # tag into the environment's built image.
            baked = (
                "; NVRx: run the environment's built image instead (images/nvrx/Dockerfile builds it from source), "
                "nvrx.start_install off"
                if name == NVRX_DISTRIBUTION
                else ""
            )
            findings.append(
                Finding(
                    GATE,
                    where,
                    f"{spec} has no wheel for {on_image} (pip: no matching distribution); the pod would exit at "
                    f"start. Use an image on a Python and C library it has wheels for{baked}{pip_said}",
                )
            )
            continue
        for text in entry.get("requires", []):
            try:
                requirement = Requirement(text)
            except InvalidRequirement:
                continue
            if requirement.marker is not None and not requirement.marker.evaluate(env):
                continue
            dependency = canonicalize_name(requirement.name)
            have = provided.get(dependency)
            if have is not None and not requirement.specifier.contains(have, prereleases=True):
                findings.append(
                    Finding(
                        GATE,
                        where,
                        f"{spec} requires {requirement.name}{requirement.specifier} but {on_image} has {have}: pip "
                        f"would replace it under the image's other packages",
                    )
                )
    return findings


def _max_restarts(words: set[str]) -> int:
    """ft_launcher's --max-restarts (torchrun's default: 0)."""
    values = [int(w.split("=", 1)[1]) for w in words if re.match(r"^--max-restarts=\d+$", w)]
    return max(values, default=0)


def nvrx_combinations(objects: Iterable[tuple[str, dict[str, Any]]], lock: ImageLock) -> list[Finding]:
    """Each container that runs NVRx (installed by its script, else in its image's packages), against NVRx's support
    table: the image's Python and NCCL, in-process restart (`--inprocess`) and the min-healthy restart policy; and
    its restarts (`--max-restarts=N`, `--inprocess`) against the image's aws-ofi-nccl (k8s/ofi_nccl.py)."""
    findings = []
    for where, obj in objects:
        if not isinstance(obj, dict):
            continue
        for container in _containers(obj.get("spec") or {}):
            image = lock.by_reference(str(container.get("image", "")))
            if image is None or image.runtime is None:
                continue  # check_install names an install into an image without facts
            script = "\n".join(
                str(part) for part in [*(container.get("command") or []), *(container.get("args") or [])]
            )
            installed = [
                pinned["version"]
                for arguments in pip_installs_in(script)
                for spec in arguments
                if (pinned := PINNED.match(spec)) and canonicalize_name(pinned["name"]) == NVRX_DISTRIBUTION
            ]
            provided = {canonicalize_name(n): v for n, v in image.runtime.packages.items()}.get(
                canonicalize_name(NVRX_DISTRIBUTION)
            )
            nvrx = installed[-1] if installed else provided
            if nvrx is None:
                continue
            words = set(script.split())
            inprocess = "--inprocess" in words
            problems = NVRX_SUPPORT.problems(
                nvrx=nvrx,
                python=image.runtime.python,
                nccl=image.runtime.nccl,
                inprocess=inprocess,
                min_healthy="--ft-restart-policy=min-healthy" in words,
            )
            problems += restart_problems(
                image=image.name,
                aws_ofi_nccl=image.runtime.aws_ofi_nccl,
                mechanisms=restart_mechanisms(max_restarts=_max_restarts(words), inprocess=inprocess),
            )
            for problem in problems:
                findings.append(
                    Finding(GATE, f"{where} container {container.get('name', '?')}", f"{problem} (image {image.name})")
                )
    return findings


def check_objects(
    objects: Iterable[tuple[str, dict[str, Any]]], lock: ImageLock, cache: dict[str, Any]
) -> tuple[int, list[Finding]]:
    objects = list(objects)
    installs, findings = start_installs(objects)
    for install in installs:
        findings += check_install(install, lock, cache)
    findings += nvrx_combinations(objects, lock)
    return sum(len(i.packages) for i in installs), findings


def run_gate(dist: Path, lock: ImageLock | None = None, cache_path: Path = CACHE_PATH) -> tuple[int, list[Finding]]:
    """The default lock is the one `make check` synthesizes with (k8s/check_lock.py: the committed lock, with
    placeholders only where it pins nothing), so the environments' built images have their facts here too."""
    return check_objects(outputs.manifests(dist), lock or check_lock(ImageLock.load()), load_cache(cache_path))


# --- refresh -------------------------------------------------------------------------------------------------------


def _wheel_metadata(wheel: Path) -> tuple[list[str], str | None]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(name).decode("utf-8", errors="replace")
    requires = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]
    python = next(
        (line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Python:")), None
    )
    return requires, python


def probe(spec: str, runtime: ImageRuntime) -> dict[str, Any]:
    """pip's own answer: is there a wheel of `spec` for this image's Python and platform, and what does it require."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable, "-m", "pip", "download", "--isolated", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--quiet", "--dest", tmp,
            "--python-version", runtime.python, "--implementation", "cp",
            *[arg for platform in runtime.wheel_platforms for arg in ("--platform", platform)],
            spec,
        ]  # fmt: skip
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=600, env={**os.environ, "PIP_CONSTRAINT": ""}
        )
        wheels = sorted(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            last = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
            return {"wheel": None, "note": last.removeprefix("ERROR: ")}
        requires, python = _wheel_metadata(wheels[0])
        return {"wheel": wheels[0].name, "requires": requires, "requires_python": python}


def refresh(dist: Path, cache_path: Path, lock: ImageLock) -> int:
    installs, _ = start_installs(outputs.manifests(dist))
    cache = load_cache(cache_path)
    for install in installs:
        image = lock.by_reference(install.image)
        if image is None or image.runtime is None:
            continue
        for spec in install.packages:
            pinned = PINNED.match(spec)
            if pinned is None:
                continue
            key = f"{canonicalize_name(pinned['name'])}=={pinned['version']}"
            result = probe(spec, image.runtime)
            cache.setdefault(key, {})[target(image.runtime)] = result
            print(f"{key} on {target(image.runtime)}: {result.get('wheel') or 'no wheel'}")
    text = json.dumps(dict(sorted(cache.items())), indent=2, sort_keys=True) + "\n"
    tmp = cache_path.with_name(f".{cache_path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, cache_path)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gates.runtime_packages", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--dist", type=Path, default=ROOT / ".check" / "dist", help="the synthesized manifests")
    parser.add_argument("--cache", type=Path, default=CACHE_PATH)
    parser.add_argument("--refresh", action="store_true", help="ask pip's index and rewrite the cache")
    args = parser.parse_args(argv)
    lock = ImageLock.load()
    if args.refresh:
        return refresh(args.dist, args.cache, lock)
    checked, findings = check_objects(outputs.manifests(args.dist), lock, load_cache(args.cache))
    for finding in findings:
        print(finding, file=sys.stderr)
    print(f"{GATE}: {checked} package(s) checked, {len(findings)} finding(s)")
    return 1 if findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
