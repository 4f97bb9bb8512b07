"""What only the image has, found before anything starts: the rehearsal runs this machine's filesystem and
Python environment instead of the image, so
- an absolute command (`/submitter`, `/home/ray/anaconda3/bin/ray`) that is not on this machine, nor under a
  volume the container mounts, nor substituted with `--command-path IMAGE_PATH=LOCAL_PATH`;
- a container without a command, whose entrypoint only the image knows (KubeRay's Ray container, index 0 of
  a head or worker group, is exempt: the operator writes its `ray start` command, KubeRay v1.7.0
  ray-operator/controllers/ray/common/pod.go; so is a RayJob submitter without containers, whose command
  the operator writes too, rayjob_controller.go configureSubmitterContainer);
- a RayJob `runtimeEnvYAML` pip requirement that the installed distributions do not satisfy (checked offline
  with importlib.metadata and packaging's specifiers: a pod here cannot install from an index)
are exit 2 naming the container, the command or the package, and the fix.

A relative command that exists nowhere (`pyhton3`) is not refused here: on a cluster it is a StartError of the
pod (exit 128), and so it is in the rehearsal.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from packaging.requirements import InvalidRequirement, Requirement

RAY_CONTAINER = 0


@dataclass(frozen=True)
class Container:
    """A container of a workload, where it sits, and whether the operator writes its command."""

    kind: str
    name: str
    path: str
    spec: dict[str, Any]
    operator_command: bool = False


def containers(obj: Mapping[str, Any]) -> Iterator[Container]:
    kind, spec = str(obj.get("kind")), obj.get("spec") or {}
    name = str((obj.get("metadata") or {}).get("name"))
    pods: list[tuple[str, Mapping[str, Any], bool]] = []
    if kind == "Job":
        pods.append(("spec.template.spec", (spec.get("template") or {}).get("spec") or {}, False))
    elif kind == "Pod":
        pods.append(("spec", spec, False))
    elif kind in ("RayCluster", "RayJob"):
        cluster = spec if kind == "RayCluster" else spec.get("rayClusterSpec") or {}
        at = "spec" if kind == "RayCluster" else "spec.rayClusterSpec"
        head = cluster.get("headGroupSpec") or {}
        pods.append((f"{at}.headGroupSpec.template.spec", (head.get("template") or {}).get("spec") or {}, True))
        for i, group in enumerate(cluster.get("workerGroupSpecs") or []):
            group_spec = (group.get("template") or {}).get("spec") or {}
            pods.append((f"{at}.workerGroupSpecs[{i}].template.spec", group_spec, True))
        if kind == "RayJob":
            submitter = (spec.get("submitterPodTemplate") or {}).get("spec") or {}
            pods.append(("spec.submitterPodTemplate.spec", submitter, False))
    for at, pod, ray in pods:
        for group in ("initContainers", "containers"):
            for index, container in enumerate(pod.get(group) or []):
                operator = ray and group == "containers" and index == RAY_CONTAINER
                if kind == "RayJob" and at.startswith("spec.submitterPodTemplate") and index == 0:
                    operator = group == "containers"  # KubeRay fills the submitter's command when unset
                yield Container(kind, name, f"{at}.{group}[{index}]", container, operator)


def _mounted(container: Mapping[str, Any], path: PurePosixPath) -> bool:
    return any(
        path == PurePosixPath(m["mountPath"]) or PurePosixPath(m["mountPath"]) in path.parents
        for m in container.get("volumeMounts") or []
        if m.get("mountPath")
    )


def command_problems(obj: Mapping[str, Any], command_paths: Mapping[str, str]) -> Iterator[str]:
    for c in containers(obj):
        command = c.spec.get("command") or []
        label = f"{c.kind}/{c.name}: container {c.spec.get('name')!r} ({c.path})"
        if not command:
            if not c.operator_command:
                yield (
                    f"{label} has no command: its entrypoint is in image {c.spec.get('image')!r}, which the "
                    "rehearsal does not run; fix: give the container a command (the image's entrypoint) in "
                    "the manifest"
                )
            continue
        program = str(command[0])
        if not program.startswith("/") or program in command_paths:
            continue
        path = PurePosixPath(program)
        if not Path(program).exists() and not _mounted(c.spec, path):
            yield (
                f"{label}: command {program} does not exist on this machine (only the image has it); fix: install "
                f"it at that path where the rehearsal runs, or pass --command-path {program}=LOCAL_PATH to run "
                "LOCAL_PATH in its place"
            )


def substitute_commands(obj: dict[str, Any], command_paths: Mapping[str, str]) -> list[str]:
    """Replaces command[0] of every container by its `--command-path` substitute; what it replaced."""
    done = []
    for c in containers(obj):
        command = c.spec.get("command") or []
        if command and str(command[0]) in command_paths:
            local = command_paths[str(command[0])]
            done.append(f"{c.kind}/{c.name}: container {c.spec.get('name')!r} runs {local} for {command[0]}")
            c.spec["command"] = [local, *command[1:]]
    return done


def _distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def pip_problems(obj: Mapping[str, Any]) -> Iterator[str]:
    if obj.get("kind") != "RayJob":
        return
    name = str((obj.get("metadata") or {}).get("name"))
    text = (obj.get("spec") or {}).get("runtimeEnvYAML")
    if not text:
        return
    try:
        runtime_env = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        yield f"RayJob/{name}: spec.runtimeEnvYAML is not YAML: {exc}; fix: write the runtime_env as YAML"
        return
    pip = runtime_env.get("pip") if isinstance(runtime_env, dict) else None
    packages: Sequence[Any] = pip.get("packages", []) if isinstance(pip, dict) else pip or []
    if isinstance(packages, str):
        yield (
            f"RayJob/{name}: spec.runtimeEnvYAML pip {packages!r} is a requirements file only the image has; fix: "
            "list the packages in runtimeEnvYAML pip"
        )
        return
    for entry in packages:
        try:
            requirement = Requirement(str(entry))
        except InvalidRequirement:
            yield (
                f"RayJob/{name}: spec.runtimeEnvYAML pip {entry!r} is not a requirement this machine can check "
                "offline (a URL or a path); fix: install it where the rehearsal runs and list it by name"
            )
            continue
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        installed = _distribution_version(requirement.name)
        if installed is None or (requirement.specifier and not requirement.specifier.contains(installed, True)):
            have = f"installed {installed}" if installed else "not installed"
            yield (
                f"RayJob/{name}: spec.runtimeEnvYAML pip {str(entry)!r} is not satisfied here ({have}); a "
                f"rehearsal pod cannot install from an index; fix: `pip install '{entry}'` into the environment "
                "the rehearsal runs with, or change the pin"
            )


def image_only(objects: Sequence[Mapping[str, Any]], command_paths: Mapping[str, str]) -> list[str]:
    """Every command or package of the workloads that only the image has (see the module docstring)."""
    found: list[str] = []
    for obj in objects:
        found += command_problems(obj, command_paths)
        found += pip_problems(obj)
    return found
