"""Whether an object's name is one the API server accepts (and, for KubeRay's kinds, the KubeRay operator), per
kind, as `kubectl apply` meets them: metadata.name, metadata.generateName (a prefix) and metadata.namespace.

Kubernetes 1.36 (read in kubernetes/kubernetes at recent commits; the v1.36 tag itself was not fetched):
- staging/src/k8s.io/apimachinery/pkg/util/validation/validation.go: IsDNS1123Subdomain, IsDNS1123Label and
  IsDNS1035Label, in infra/spec/kube_names.py (the network-policy spec checks names with them too).
- staging/src/k8s.io/apimachinery/pkg/api/validation/generic.go: NameIsDNSSubdomain, NameIsDNSLabel,
  NameIsDNS1035Label; a generateName prefix is checked after maskTrailingDash (a trailing "-" and the character
  before it become "a", upstream's own quirk, kept); ValidateNamespaceName is a DNS-1123 label, and
  ValidateObjectMeta checks every namespaced object's metadata.namespace with it.
- staging/src/k8s.io/apimachinery/pkg/api/validation/path/name.go: every name, whatever its kind, may not be
  "." or "..", nor contain "/" or "%" (a prefix: only the last two), applied by
  staging/src/k8s.io/apiserver/pkg/registry/rest/create.go BeforeCreate after the kind's own rule passed.
- Per kind: pkg/apis/core/validation/validation.go ValidateServiceName (DNS-1035 label), ValidateNamespaceName
  (DNS-1123 label), Pod, ConfigMap, Secret, ServiceAccount, PersistentVolume(Claim), StorageClass, PriorityClass
  (DNS-1123 subdomain); pkg/apis/apps/validation ValidateDeploymentName, pkg/apis/networking/validation
  ValidateNetworkPolicyName, pkg/apis/admissionregistration/validation (DNS-1123 subdomain);
  pkg/apis/rbac/validation ValidateRBACName (the path-segment rule only: "system:aggregate-to-view" is fine);
  pkg/apis/policy/validation ValidatePodDisruptionBudget and, for core/v1, events.go ValidateEventCreate check no
  name format (the path-segment rule only).
- Job, pkg/apis/batch/validation/validation.go ValidateJob: a DNS-1123 subdomain; the name becomes its pods'
  `job-name` and `batch.kubernetes.io/job-name` label values (pkg/registry/batch/job/strategy.go), which
  ValidatePodTemplateSpec holds to 63 characters; an Indexed Job's "<name>-<completions-1>" must be a DNS-1123
  label (its pods' hostnames), refused as "will not able to create pod with invalid DNS label".
- Custom resources (Kueue's, and any kind not named here): apiextensions-apiserver validates their names as
  DNS-1123 subdomains (NameIsDNSSubdomain).

KubeRay v1.7.0 ray-operator/controllers/ray/utils/validation.go ValidateRayClusterMetadata and
ValidateRayJobMetadata, with utils/constant.go: a RayCluster name at most 53 characters (63 - len("-serve-svc")),
a RayJob's at most 47 (its cluster's name appends 6), both DNS-1035 labels. The API server accepts such a name
(a CRD's rule is the subdomain) and the kuberay-operator chart v1.7.0 installs no webhook, so `kubectl apply`
succeeds; then the operator creates no pods: raycluster_controller.go records an InvalidRayClusterMetadata
Warning and returns, rayjob_controller.go sets JobDeploymentStatus ValidationFailed (InvalidRayJobMetadata).
The rehearsal refuses such a name up front instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infra.spec.kube_names import (
    LABEL_MAX,
    SUBDOMAIN_MAX,
    dns1035_label,
    dns1123_label,
    dns1123_subdomain,
    name_length,
)

KUBERNETES_CHECKED = "1.36"
KUBERAY_CHECKED = "1.7.0"

RAY_CLUSTER_MAX = 53
RAY_JOB_MAX = RAY_CLUSTER_MAX - 6

# Kinds without a namespace (ValidateObjectMeta checks metadata.namespace only where the kind has one).
CLUSTER_SCOPED = frozenset(
    {
        "Namespace",
        "Node",
        "PersistentVolume",
        "StorageClass",
        "PriorityClass",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
        "CustomResourceDefinition",
        "ClusterQueue",
        "ResourceFlavor",
        "WorkloadPriorityClass",
    }
)


def path_segment(value: str, prefix: bool = False) -> list[str]:
    if not prefix and value in (".", ".."):
        return [f"may not be '{value}'"]
    return [f"may not contain '{c}'" for c in ("/", "%") if c in value]


def _mask_trailing_dash(name: str) -> str:
    # apimachinery generic.go maskTrailingDash: drops the dash *and* the character before it, then appends "a".
    return name[:-2] + "a" if len(name) > 1 and name.endswith("-") else name


Check = Callable[[str, bool, Mapping[str, Any]], list[str]]  # (value, is a generateName prefix, object) -> messages


@dataclass(frozen=True)
class Rule:
    """One name rule, and who applies it; a kind's rules apply in order, the first that refuses is reported."""

    what: str  # "Service names are DNS-1035 labels (...)"
    source: str  # who refuses it, and the upstream file
    check: Check
    allowed: str  # what a suggested name may hold: "subdomain", "label", "dns1035", or "" (any but / and %)
    max_len: int


def _on_name(fn: Callable[[str], list[str]]) -> Check:
    def check(value: str, prefix: bool, obj: Mapping[str, Any]) -> list[str]:
        return fn(_mask_trailing_dash(value) if prefix else value)

    return check


def _loose(value: str, prefix: bool, obj: Mapping[str, Any]) -> list[str]:
    return path_segment(value, prefix)


def _job(value: str, prefix: bool, obj: Mapping[str, Any]) -> list[str]:
    errors = dns1123_subdomain(_mask_trailing_dash(value) if prefix else value)
    if errors or prefix:  # a prefix's generated name is at most 63 (generate.go); the name is checked as generated
        return errors
    if name_length(value) > LABEL_MAX:
        return [f"must be no more than {LABEL_MAX} characters (it becomes the value of its pods' job-name label)"]
    spec = obj.get("spec") or {}
    completions = spec.get("completions")
    if spec.get("completionMode") == "Indexed" and isinstance(completions, int) and completions > 0:
        hostname = f"{value}-{completions - 1}"
        if dns1123_label(hostname):
            return [f"will not able to create pod with invalid DNS label: {hostname}"]
    return []


def _kuberay(kind: str, limit: int) -> Check:
    def check(value: str, prefix: bool, obj: Mapping[str, Any]) -> list[str]:
        if prefix:  # KubeRay judges the name the API server generated
            return []
        if name_length(value) > limit:
            return [f"{kind} name should be no more than {limit} characters"]
        errors = dns1035_label(value)
        return [f"{kind} name should be a valid DNS1035 label: {'; '.join(errors)}"] if errors else []

    return check


_API = f"Kubernetes {KUBERNETES_CHECKED} API server"
_SUBDOMAINS = f"DNS-1123 subdomains (at most {SUBDOMAIN_MAX} lower case letters, digits, '-' and '.')"
_LABELS = f"DNS-1123 labels (at most {LABEL_MAX} lower case letters, digits and '-')"
_DNS1035_LABELS = "DNS-1035 labels (lower case letters, digits and '-', starting with a letter)"


def _subdomain(kind: str, source: str) -> Rule:
    return Rule(
        f"{kind} names are {_SUBDOMAINS}", f"{_API}, {source}", _on_name(dns1123_subdomain), "subdomain", SUBDOMAIN_MAX
    )


def _label(what: str, source: str) -> Rule:
    return Rule(f"{what} are {_LABELS}", f"{_API}, {source}", _on_name(dns1123_label), "label", LABEL_MAX)


def _path_segment(kind: str, source: str) -> Rule:
    return Rule(
        f"{kind} names may be anything but '.' and '..', without '/' or '%'", f"{_API}, {source}", _loose, "", 0
    )


def _ray(kind: str, limit: int, function: str) -> tuple[Rule, ...]:
    return (
        _subdomain(kind, "custom resource: apiextensions-apiserver NameIsDNSSubdomain"),
        Rule(
            f"{kind} names are {_DNS1035_LABELS}, at most {limit} characters",
            f"KubeRay v{KUBERAY_CHECKED} operator, which creates no pods for it: "
            f"ray-operator/controllers/ray/utils/validation.go {function}",
            _kuberay(kind, limit),
            "dns1035",
            limit,
        ),
    )


_RBAC = "pkg/apis/rbac/validation ValidateRBACName"
_CORE = "pkg/apis/core/validation"
_RULES: dict[str, tuple[Rule, ...]] = {
    "Namespace": (_label("Namespace names", f"{_CORE} ValidateNamespaceName"),),
    "Service": (
        Rule(
            f"Service names are {_DNS1035_LABELS}, at most {LABEL_MAX} characters",
            f"{_API}, {_CORE} ValidateServiceName",
            _on_name(dns1035_label),
            "dns1035",
            LABEL_MAX,
        ),
    ),
    "Job": (
        Rule(
            f"Job names are DNS-1123 subdomains of at most {LABEL_MAX} characters (lower case letters, digits, '-' "
            "and '.'; the name is its pods' job-name label)",
            f"{_API}, pkg/apis/batch/validation ValidateJob",
            _job,
            "subdomain",
            LABEL_MAX,
        ),
    ),
    "RayCluster": _ray("RayCluster", RAY_CLUSTER_MAX, "ValidateRayClusterMetadata"),
    "RayJob": _ray("RayJob", RAY_JOB_MAX, "ValidateRayJobMetadata (InvalidRayJobMetadata)"),
    "Role": (_path_segment("Role", _RBAC),),
    "RoleBinding": (_path_segment("RoleBinding", _RBAC),),
    "ClusterRole": (_path_segment("ClusterRole", _RBAC),),
    "ClusterRoleBinding": (_path_segment("ClusterRoleBinding", _RBAC),),
    "PodDisruptionBudget": (_path_segment("PodDisruptionBudget", "apiserver registry/rest/create.go BeforeCreate"),),
    "Event": (_path_segment("Event", "core/v1 Events keep no name format: pkg/apis/core/validation/events.go"),),
    **{
        kind: (_subdomain(kind, source),)
        for kind, source in (
            ("Pod", f"{_CORE} ValidatePodName"),
            ("ConfigMap", f"{_CORE} ValidateConfigMapName"),
            ("Secret", f"{_CORE} ValidateSecretName"),
            ("ServiceAccount", f"{_CORE} ValidateServiceAccountName"),
            ("PersistentVolume", f"{_CORE} ValidatePersistentVolumeName"),
            ("PersistentVolumeClaim", f"{_CORE} ValidatePersistentVolumeName"),
            ("StorageClass", f"{_CORE} ValidateClassName"),
            ("PriorityClass", "pkg/apis/scheduling/validation ValidatePriorityClass"),
            ("Deployment", "pkg/apis/apps/validation ValidateDeploymentName"),
            ("NetworkPolicy", "pkg/apis/networking/validation ValidateNetworkPolicyName"),
            ("ValidatingAdmissionPolicy", "pkg/apis/admissionregistration/validation NameIsDNSSubdomain"),
            ("ValidatingAdmissionPolicyBinding", "pkg/apis/admissionregistration/validation NameIsDNSSubdomain"),
        )
    },
}
_NAMESPACE = _label("namespaces", "apimachinery ValidateObjectMeta (ValidateNamespaceName)")


def rules_for(kind: str) -> tuple[Rule, ...]:
    """The name rules of `kind`, in order; a kind not named here is a custom resource's (a DNS-1123 subdomain)."""
    return _RULES.get(kind) or (_subdomain(kind, "custom resource: apiextensions-apiserver NameIsDNSSubdomain"),)


_PLACEHOLDER = re.compile(r"\$|\{\{|\}\}|<|>")


def suggestion(value: str, rule: Rule, prefix: bool = False) -> str:
    """A name close to `value` that `rule` (a kind's strictest) accepts, for the fix."""
    if not rule.allowed:
        return "x" if value in (".", "..") else re.sub(r"[/%]+", "-", value).strip("-") or "x"
    keep = "a-z0-9." if rule.allowed == "subdomain" else "a-z0-9"
    name = re.sub(rf"[^{keep}]+", "-", value.lower())
    name = ".".join(p for p in (re.sub("-{2,}", "-", part).strip("-") for part in name.split(".")) if p)
    if rule.allowed == "dns1035" and not name[:1].isalpha():
        name = "x-" + name
    name = name[: rule.max_len - (1 if prefix else 0)].rstrip("-.") or "x"
    return name + ("-" if prefix else "")


@dataclass(frozen=True)
class BadName:
    """A name the API server (or the KubeRay operator) refuses: where, which object, which field, the rule, the fix."""

    where: str
    obj: str  # Kind/namespace/name, or Kind/name where the kind has no namespace
    field: str
    value: str
    messages: tuple[str, ...]
    rule: Rule
    fix: str

    def __str__(self) -> str:
        return (
            f'{self.where}: {self.obj}: {self.field}: Invalid value: "{self.value}": {"; ".join(self.messages)} '
            f"(rule: {self.rule.what}; {self.rule.source}); fix: {self.fix}"
        )


def _fix(value: str, strictest: Rule, field: str, prefix: bool) -> str:
    verb = "change the namespace" if field == "metadata.namespace" else "rename it"
    fix = f'{verb}, e.g. "{suggestion(value, strictest, prefix)}"'
    if _PLACEHOLDER.search(value):
        fix += " (a template placeholder was left in: substitute it before applying)"
    return fix


def name_problems(obj: Mapping[str, Any], where: str) -> list[BadName]:
    """Every name of `obj` that its kind's rules refuse (the first rule that refuses each; then the path-segment
    rule, which the API server applies to every kind)."""
    kind = str(obj.get("kind"))
    meta = obj.get("metadata") or {}
    namespaced = kind not in CLUSTER_SCOPED
    name = str(meta.get("name") or "")
    namespace = str(meta.get("namespace") or "default")
    shown = f"{kind}/{namespace}/{name}" if namespaced else f"{kind}/{name}"
    fields: list[tuple[str, str, tuple[Rule, ...], bool]] = []
    if meta.get("generateName"):
        fields.append(("metadata.generateName", str(meta["generateName"]), rules_for(kind), True))
    if name:
        fields.append(("metadata.name", name, rules_for(kind), False))
    if namespaced and meta.get("namespace"):
        fields.append(("metadata.namespace", namespace, (_NAMESPACE,), False))
    found = []
    for field, value, rules, prefix in fields:
        for rule in rules:
            messages = rule.check(value, prefix, obj) or path_segment(value, prefix)
            if messages:
                fix = _fix(value, rules[-1], field, prefix)
                found.append(BadName(where, shown, field, value, tuple(messages), rule, fix))
                break
    return found


def bad_names(objects: Sequence[Mapping[str, Any]], sources: Sequence[str]) -> list[BadName]:
    """Every name in these objects that `kubectl apply` (or the KubeRay operator) would refuse."""
    return [bad for obj, where in zip(objects, sources, strict=True) for bad in name_problems(obj, where)]
