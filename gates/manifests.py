"""Manifest rules: schemas (Kubernetes at the cluster version, KubeRay and Kueue CRDs), pinned images,
nothing exposed outside the cluster, Pod Security labels, container resources, and every namespace created with
its default-deny ingress NetworkPolicy."""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from gates.report import Finding
from infra.spec.namespaces import PSS, PSS_LEVELS
from infra.spec.versions import KUBERAY_VERSION, KUBERNETES_VERSION, KUEUE_VERSION

GATE = "manifests"
ROOT = Path(__file__).resolve().parent.parent
CRD_DIR = ROOT / "k8s" / "crds" / f"kuberay-v{KUBERAY_VERSION}"
KUEUE_CRD_DIR = ROOT / "k8s" / "crds" / f"kueue-v{KUEUE_VERSION}"
# The release each vendored CRD directory comes from, for the finding's wording.
CRD_SOURCES = ((CRD_DIR, f"KubeRay {KUBERAY_VERSION}"), (KUEUE_CRD_DIR, f"Kueue {KUEUE_VERSION}"))
PINNED_IMAGE = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")
EXPOSED_SERVICE_TYPES = ("LoadBalancer", "NodePort")


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> strict JSON schema, from the vendored KubeRay and Kueue CRDs."""
    return {key: schema for key, (schema, _) in _crds().items()}


def load_crd(path: Path) -> dict[str, Any]:
    """A vendored CRD file. libyaml's parser, where PyYAML has it: the same data as yaml.safe_load, about 5 times
    faster (the KubeRay RayJob CRD: 2 s against 10 s here), which every schema check pays once per process."""
    loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd: dict[str, Any] = yaml.load(path.read_text(), Loader=loader)  # a safe loader
    return crd


@functools.cache
def _crds() -> dict[tuple[str, str], tuple[dict[str, Any], str]]:
    """(apiVersion, kind) -> (strict JSON schema, the release it comes from)."""
    schemas = {}
    for directory, source in CRD_SOURCES:
        for path in sorted(directory.glob("*.yaml")):
            crd = load_crd(path)
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                if version.get("served"):
                    schema = _strict(version["schema"]["openAPIV3Schema"])
                    schemas[(f"{group}/{version['name']}", kind)] = (schema, source)
    return schemas


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    """Unknown fields are errors (as with kubectl --validate=strict), unless the CRD preserves them."""
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if (
                node.get("type") == "object"
                and "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


@dataclass(frozen=True)
class SchemaViolation:
    """One way an object does not match its schema: the schema's origin, the field path, the error."""

    source: str
    path: tuple[str | int, ...]
    error: jsonschema.ValidationError | None
    message: str

    @property
    def dotted(self) -> str:
        return ".".join(str(p) for p in self.path) or "(root)"


def schema_violations(obj: dict[str, Any]) -> Iterator[SchemaViolation]:
    """The object against its vendored CRD or the Kubernetes schema of the cluster version, strictly
    (unknown fields are errors, as with `kubectl apply --validate=strict`). kubernetes-validate reports
    the best-matching error of an object only; the CRDs report every error."""
    key = (obj.get("apiVersion", ""), obj.get("kind", ""))
    if key in _crds():
        schema, source = _crds()[key]
        for error in sorted(jsonschema.Draft7Validator(schema).iter_errors(obj), key=str):
            yield SchemaViolation(f"{source} CRD", tuple(error.absolute_path), error, error.message)
        return
    source = f"Kubernetes {KUBERNETES_VERSION} schema"
    try:
        kubernetes_validate.validate(obj, f"{KUBERNETES_VERSION}.0", strict=True)
    except kubernetes_validate.ValidationError as exc:
        yield SchemaViolation(source, tuple(exc.path), exc, exc.message)
    except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError) as exc:
        yield SchemaViolation(
            source, (), None, f"no Kubernetes {KUBERNETES_VERSION} schema for {key[0]} {key[1]}: {exc}"
        )


def _schema(obj: dict[str, Any]) -> Iterator[str]:
    kind = obj.get("kind", "")
    for v in schema_violations(obj):
        if v.error is None:
            yield v.message
        elif v.source.endswith(" CRD"):
            yield f"{kind} does not match the {v.source.removesuffix(' CRD')} CRD at {v.dotted}: {v.message}"
        else:
            yield f"{kind} does not match the {v.source} at {v.dotted}: {v.message}"


def _containers(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every container and init container anywhere in the object (pods, templates, Ray groups)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                for index, container in enumerate(value):
                    if isinstance(container, dict):
                        yield f"{path}.{key}[{index}]({container.get('name', '?')})", container
            else:
                yield from _containers(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _containers(value, f"{path}[{index}]")


def _images(obj: dict[str, Any]) -> Iterator[str]:
    for where, container in _containers(obj):
        image = container.get("image", "")
        if not PINNED_IMAGE.match(image):
            yield f"image not pinned by digest at {where}: {image!r} (use name@sha256:<64 hex>; see `trainctl pin`)"


def _resources(obj: dict[str, Any]) -> Iterator[str]:
    for where, container in _containers(obj):
        resources = container.get("resources", {})
        for section in ("requests", "limits"):
            missing = [r for r in ("cpu", "memory") if r not in resources.get(section, {})]
            if missing:
                yield f"container at {where} has no {section} for {', '.join(missing)}"


def _exposure(obj: dict[str, Any]) -> Iterator[str]:
    if obj.get("kind") == "Service" and obj.get("spec", {}).get("type") in EXPOSED_SERVICE_TYPES:
        yield f"Service of type {obj['spec']['type']}: nothing may be exposed outside the cluster"
    if obj.get("kind") in ("RayCluster", "RayJob"):
        spec = obj.get("spec", {})
        head = spec.get("headGroupSpec") or spec.get("rayClusterSpec", {}).get("headGroupSpec", {})
        if head.get("serviceType") in EXPOSED_SERVICE_TYPES:
            yield f"Ray head serviceType {head['serviceType']}: the dashboard and job API stay inside the cluster"


def _pod_security(obj: dict[str, Any]) -> Iterator[str]:
    if obj.get("kind") != "Namespace":
        return
    labels = obj.get("metadata", {}).get("labels", {})
    for mode in ("enforce", "warn", "audit"):
        if labels.get(f"{PSS}/{mode}") not in PSS_LEVELS:
            yield f"namespace without a valid {PSS}/{mode} label"


RULES = (_schema, _images, _resources, _exposure, _pod_security)


def check_objects(objects: Iterable[tuple[str, dict[str, Any]]]) -> list[Finding]:
    findings = []
    for where, obj in objects:
        label = f"{where} {obj.get('kind', '?')}/{obj.get('metadata', {}).get('name', '?')}"
        for rule in RULES:
            findings += [Finding(GATE, label, message) for message in rule(obj)]
    return findings


def _is_default_deny(obj: dict[str, Any], namespace: str) -> bool:
    """A NetworkPolicy that selects every pod of `namespace` and admits nothing: podSelector {}, Ingress among its
    policyTypes (the default when none are given), no ingress rule (Kubernetes docs, "Network Policies", "Default
    deny all ingress traffic")."""
    if obj.get("kind") != "NetworkPolicy" or obj.get("metadata", {}).get("namespace") != namespace:
        return False
    spec = obj.get("spec") or {}
    selector = spec.get("podSelector") or {}
    return (
        not selector.get("matchLabels")
        and not selector.get("matchExpressions")
        and "Ingress" in spec.get("policyTypes", ["Ingress"])
        and not spec.get("ingress")
    )


def check_namespace_isolation(sources: Mapping[str, Iterable[tuple[str, dict[str, Any]]]]) -> list[Finding]:
    """Every Namespace a source creates has its default-deny ingress policy in that same source (an environment's
    dist/ directory, one CloudFormation template): whatever applies the namespace applies its policy too, and no
    namespace is open to every pod between two applies."""
    findings = []
    for objects in sources.values():
        objects = list(objects)
        for where, obj in objects:
            if obj.get("kind") != "Namespace":
                continue
            name = obj.get("metadata", {}).get("name", "?")
            if not any(_is_default_deny(other, name) for _, other in objects):
                findings.append(
                    Finding(
                        GATE,
                        where,
                        f"namespace {name} has no default-deny ingress NetworkPolicy (podSelector {{}}, policyTypes "
                        "with Ingress, no ingress rules) where it is created: infra/spec/network_policies.py "
                        "namespace_objects",
                    )
                )
    return findings
