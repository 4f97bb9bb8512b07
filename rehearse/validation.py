"""Strict input, as `kubectl apply --validate=strict` and the API server: every object against the
Kubernetes 1.36 schema or its vendored CRD (KubeRay v1.7.0, Kueue v0.19.2) through the gates' schema
machinery (gates/manifests.py `schema_violations`), then the cheap checks the API server makes that a
schema cannot express.

API server rules mirrored (Kubernetes v1.36):
- pkg/apis/batch/validation/validation.go validateJobSpec / validatePodFailurePolicy / validateJobTemplate:
  a Job's pod template needs restartPolicy OnFailure or Never (unset defaults to Always, refused);
  completionMode Indexed needs completions; podFailurePolicy needs restartPolicy Never;
  backoffLimitPerIndex and successPolicy need completionMode Indexed, maxFailedIndexes needs
  backoffLimitPerIndex; counts are never negative, activeDeadlineSeconds is positive; a selector the
  user sets needs manualSelector (otherwise "`selector` will be auto-generated").
- pkg/apis/core/validation/validation.go ValidatePodSpec: container names unique across containers and
  init containers, every volumeMount names a volume of the pod, volume names unique.
- Names (every object's, per kind, a Job's 63-character limit too) are names.py's.
- kubectl apply applies the files in order: an object given twice is an update of the first (a Job's
  spec.template is immutable, pkg/apis/batch/validation ValidateJobSpecUpdate); the rehearsal refuses it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gates.manifests import SchemaViolation, schema_violations

JOB_RESTART_POLICIES = ("OnFailure", "Never")


@dataclass(frozen=True)
class Invalid:
    """An object the API server (or kubectl's strict validation) would refuse."""

    where: str
    kind: str
    name: str
    path: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.where}: {self.kind}/{self.name}: {self.path}: {self.message}; fix: {self.fix}"


def _dotted(path: Sequence[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(root)"


def _schema_problems(obj: Mapping[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(path, message, fix) per schema violation, worded as kubectl words them."""
    for v in schema_violations(dict(obj)):
        yield _word(v)


def _word(v: SchemaViolation) -> tuple[str, str, str]:
    error = v.error
    if error is None:
        return "(root)", v.message, "use a kind and apiVersion of Kubernetes 1.36 or of the vendored CRDs (k8s/crds/)"
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = set((error.schema.get("properties") or {}) if isinstance(error.schema, dict) else {})
        unknown = sorted(set(error.instance) - known)
        if unknown:
            path = _dotted([*v.path, unknown[0]])
            close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
            fix = f'did you mean "{close[0]}"?' if close else "remove it (see `kubectl explain` for the fields)"
            names = ", ".join(f'"{_dotted([*v.path, u])}"' for u in unknown)
            return path, f"unknown field {names} ({v.source}; kubectl apply refuses it)", fix
    if error.validator == "required" and isinstance(error.instance, dict):
        required = error.validator_value if isinstance(error.validator_value, list) else []
        missing = [r for r in required if r not in error.instance]
        if missing:
            return _dotted([*v.path, missing[0]]), f"Required value ({v.source})", f"set {missing[0]}"
    return _dotted(v.path), f"{error.message} ({v.source})", "give the field a value of the type the schema says"


def _pod_spec_problems(spec: Mapping[str, Any], at: str) -> Iterator[tuple[str, str, str]]:
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    seen: set[str] = set()
    for container in containers:
        name = str(container.get("name"))
        if name in seen:
            yield (
                f"{at}.containers",
                f'Duplicate value: "{name}"',
                "give every container and init container its own name",
            )
        seen.add(name)
    volumes = [str(v.get("name")) for v in spec.get("volumes") or []]
    for name in {v for v in volumes if volumes.count(v) > 1}:
        yield f"{at}.volumes", f'Duplicate value: "{name}"', "give every volume its own name"
    for group in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(group) or []):
            for m, mount in enumerate(container.get("volumeMounts") or []):
                if mount.get("name") not in volumes:
                    yield (
                        f"{at}.{group}[{index}].volumeMounts[{m}].name",
                        f'Not found: "{mount.get("name")}"',
                        f"add a volume of that name to {at}.volumes or fix the mount's name",
                    )


def _job_problems(spec: Mapping[str, Any], at: str) -> Iterator[tuple[str, str, str]]:
    template = spec.get("template") or {}
    pod = template.get("spec") or {}
    restart = pod.get("restartPolicy")
    if restart not in JOB_RESTART_POLICIES:
        shown = "Required value" if restart is None else f'Unsupported value: "{restart}"'
        yield (
            f"{at}.template.spec.restartPolicy",
            f'{shown}: supported values: "OnFailure", "Never" (a Job\'s pods may not restart Always)',
            "set restartPolicy: Never (or OnFailure) in the pod template",
        )
    indexed = spec.get("completionMode") == "Indexed"
    if indexed and spec.get("completions") is None:
        yield f"{at}.completions", "Required value: when completion mode is Indexed", "set completions"
    if spec.get("podFailurePolicy") is not None and restart not in (None, "Never"):
        yield (
            f"{at}.template.spec.restartPolicy",
            f'Invalid value: "{restart}": only "Never" is supported when podFailurePolicy is specified',
            "set restartPolicy: Never",
        )
    for key in ("backoffLimitPerIndex", "successPolicy"):
        if spec.get(key) is not None and not indexed:
            yield f"{at}.{key}", "Invalid value: requires indexed completion mode", "set completionMode: Indexed"
    if spec.get("maxFailedIndexes") is not None and spec.get("backoffLimitPerIndex") is None:
        yield (
            f"{at}.maxFailedIndexes",
            "Invalid value: requires specifying .spec.backoffLimitPerIndex",
            "set backoffLimitPerIndex",
        )
    for key in ("parallelism", "completions", "backoffLimit", "backoffLimitPerIndex", "maxFailedIndexes"):
        value = spec.get(key)
        if isinstance(value, int) and value < 0:
            yield f"{at}.{key}", f"Invalid value: {value}: must be greater than or equal to 0", "use 0 or more"
    deadline = spec.get("activeDeadlineSeconds")
    if isinstance(deadline, int) and deadline <= 0:
        yield f"{at}.activeDeadlineSeconds", f"Invalid value: {deadline}: must be greater than 0", "use 1 or more"
    if spec.get("selector") is not None and not spec.get("manualSelector"):
        yield (
            f"{at}.selector",
            "Invalid value: `selector` will be auto-generated",
            "remove spec.selector (the API server generates it) or set manualSelector: true",
        )
    yield from _pod_spec_problems(pod, f"{at}.template.spec")


def _api_problems(obj: Mapping[str, Any]) -> Iterator[tuple[str, str, str]]:
    kind, spec = obj.get("kind"), obj.get("spec") or {}
    if kind == "Job":
        yield from _job_problems(spec, "spec")
    elif kind == "Pod":
        yield from _pod_spec_problems(spec, "spec")
    elif kind == "Deployment":
        pod = (spec.get("template") or {}).get("spec") or {}
        restart = pod.get("restartPolicy", "Always")
        if restart != "Always":
            # pkg/apis/apps/validation ValidatePodTemplateSpecForReplicaSet (Kubernetes 1.36).
            yield (
                "spec.template.spec.restartPolicy",
                f'Unsupported value: "{restart}": supported values: "Always"',
                "remove restartPolicy (a Deployment's pods restart Always)",
            )
        yield from _pod_spec_problems(pod, "spec.template.spec")
    elif kind in ("RayCluster", "RayJob"):
        cluster = spec if kind == "RayCluster" else spec.get("rayClusterSpec") or {}
        at = "spec" if kind == "RayCluster" else "spec.rayClusterSpec"
        head = cluster.get("headGroupSpec") or {}
        yield from _pod_spec_problems(
            (head.get("template") or {}).get("spec") or {}, f"{at}.headGroupSpec.template.spec"
        )
        for i, group in enumerate(cluster.get("workerGroupSpecs") or []):
            yield from _pod_spec_problems(
                (group.get("template") or {}).get("spec") or {}, f"{at}.workerGroupSpecs[{i}].template.spec"
            )


def invalid(objects: Sequence[Mapping[str, Any]], sources: Sequence[str]) -> list[Invalid]:
    """Everything kubectl apply --validate=strict and the API server would refuse in these objects."""
    found: list[Invalid] = []
    first: dict[tuple[str, str, str], str] = {}
    for obj, where in zip(objects, sources, strict=True):
        kind = str(obj.get("kind"))
        meta = obj.get("metadata") or {}
        name = str(meta.get("name"))
        problems = list(_schema_problems(obj))
        if not problems:
            problems = list(_api_problems(obj))
        found += [Invalid(where, kind, name, path, message, fix) for path, message, fix in problems]
        key = (kind, str(meta.get("namespace") or "default"), name)
        if key in first:
            found.append(
                Invalid(
                    where,
                    kind,
                    name,
                    "metadata.name",
                    f"defined twice (first in {first[key]}): kubectl apply would apply this one as an update of "
                    "the first (a Job's spec.template is immutable)",
                    "give each object its own name, or keep one of them",
                )
            )
        first.setdefault(key, where)
    return found
