"""Pod Security Baseline plus named capabilities, for the namespaces that enforce Privileged only to admit them
(infra/spec/namespaces.py NamespaceSpec.capabilities: `ray` and `training`, IPC_LOCK for EFA).

Pod Security Admission admits whatever Privileged admits there (privileged containers, hostPath, hostNetwork...).
A ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1, GA since Kubernetes 1.30) bound with [Deny] to those
namespaces (namespaceSelector on kubernetes.io/metadata.name) re-implements every Baseline check of
kubernetes/pod-security-admission v0.36.2 in CEL (infra/spec/pod_security.py holds the lists and names the files),
with the namespace's capabilities added to Baseline's list and nothing else relaxed. Each validation's message
names the field and cites its check.

What it matches, as Pod Security Admission does (admission/admission.go ValidatePod): Pod CREATE and UPDATE,
including the pods/ephemeralcontainers subresource (`kubectl debug`; its object is the Pod), and an UPDATE only when
it changes the spec (isSignificantPodUpdate judges only container changes; a metadata-only update, such as a
controller removing its finalizer, is left alone, so a pod admitted before the policy can still be deleted). The
other pod subresources (status, binding, eviction, exec...) are not matched. failurePolicy Fail: a pod the API
server cannot judge is not admitted.

Every pod the workload charts emit into those namespaces passes (tests/k8s/test_pod_security.py, which evaluates
the CEL with cel-python, as tests/k8s/test_fabric_gate_rbac.py does the node policy). The expressions use standard
CEL only (has(), all(), in, startsWith), so that evaluation and the rehearsal's (rehearse/pod_admission.py) are
the API server's.
"""

from __future__ import annotations

from collections.abc import Sequence

from constructs import Construct

from infra.spec.namespaces import NAMESPACE_NAME_LABEL, NamespaceSpec
from infra.spec.pod_security import (
    APPARMOR_ANNOTATION_PREFIX,
    APPARMOR_ANNOTATION_VALUES,
    APPARMOR_LOCALHOST_PREFIX,
    APPARMOR_TYPES,
    BASELINE_CAPABILITIES,
    BASELINE_CHECKS,
    HOST_HANDLERS,
    LIFECYCLE_HANDLERS,
    PROBES,
    PROC_MOUNT_DEFAULT,
    SAFE_SYSCTLS,
    SECCOMP_TYPES,
    SELINUX_TYPES,
)
from k8s.charts.objects import ADMISSION, api_object

# visitContainers (policy/visitor.go): every container check covers the three lists.
CONTAINERS = (
    "(object.spec.containers"
    " + (has(object.spec.initContainers) ? object.spec.initContainers : [])"
    " + (has(object.spec.ephemeralContainers) ? object.spec.ephemeralContainers : []))"
)
EVERY_CONTAINER = "spec.containers[*], spec.initContainers[*] and spec.ephemeralContainers[*]"
EMPTY = "''"  # the CEL empty string
SPEC_CHANGED = "request.operation != 'UPDATE' || object.spec != oldObject.spec"


def _present(root: str, path: str) -> str:
    """CEL that is true when root.path is set (each step tested: a missing parent is an error, not false)."""
    parts = path.split(".")
    return " && ".join(f"has({root}.{'.'.join(parts[: i + 1])})" for i in range(len(parts)))


def _get(root: str, path: str, default: str) -> str:
    return f"({_present(root, path)} ? {root}.{path} : {default})"


def _strings(values: Sequence[str]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _profile_ok(root: str, path: str, types: Sequence[str]) -> str:
    """A profile that is unset, or set with one of `types` (its type is required once it is set)."""
    return f"(!({_present(root, path)}) || {_get(root, f'{path}.type', EMPTY)} in {_strings(types)})"


def _selinux_ok(root: str) -> str:
    path = "securityContext.seLinuxOptions"
    return (
        f"(!({_present(root, path)}) || ({_get(root, f'{path}.type', EMPTY)} in {_strings(SELINUX_TYPES)} && "
        f"{_get(root, f'{path}.user', EMPTY)} == '' && {_get(root, f'{path}.role', EMPTY)} == ''))"
    )


def _no_host(c: str) -> str:
    paths = [f"{probe}.{handler}.host" for probe in PROBES for handler in HOST_HANDLERS]
    paths += [f"lifecycle.{hook}.{handler}.host" for hook in LIFECYCLE_HANDLERS for handler in HOST_HANDLERS]
    return " && ".join(f"{_get(c, p, EMPTY)} == ''" for p in paths)


def validations(capabilities: Sequence[str]) -> tuple[tuple[str, str, str], ...]:
    """(check ID, CEL expression, what it requires) for each Baseline check, `capabilities` added to Baseline's."""
    allowed = _strings([*BASELINE_CAPABILITIES, *capabilities])
    annotations = "object.metadata.annotations"
    return (
        (
            "windowsHostProcess",
            f"!{_get('object.spec', 'securityContext.windowsOptions.hostProcess', 'false')} && "
            f"{CONTAINERS}.all(c, !{_get('c', 'securityContext.windowsOptions.hostProcess', 'false')})",
            f"spec.securityContext.windowsOptions.hostProcess and that of {EVERY_CONTAINER} must be unset or false",
        ),
        (
            "hostNamespaces",
            f"!{_get('object.spec', 'hostNetwork', 'false')}",
            "spec.hostNetwork must be unset or false",
        ),
        ("hostNamespaces", f"!{_get('object.spec', 'hostPID', 'false')}", "spec.hostPID must be unset or false"),
        ("hostNamespaces", f"!{_get('object.spec', 'hostIPC', 'false')}", "spec.hostIPC must be unset or false"),
        (
            "privileged",
            f"{CONTAINERS}.all(c, !{_get('c', 'securityContext.privileged', 'false')})",
            f"securityContext.privileged of {EVERY_CONTAINER} must be unset or false",
        ),
        (
            "capabilities_baseline",
            f"{CONTAINERS}.all(c, {_get('c', 'securityContext.capabilities.add', '[]')}.all(cap, cap in {allowed}))",
            f"securityContext.capabilities.add of {EVERY_CONTAINER} may hold only "
            f"{', '.join([*BASELINE_CAPABILITIES, *capabilities])}",
        ),
        (
            "hostPathVolumes",
            f"{_get('object.spec', 'volumes', '[]')}.all(v, !has(v.hostPath))",
            "spec.volumes[*].hostPath must be unset: no hostPath volume",
        ),
        (
            "hostPorts",
            f"{CONTAINERS}.all(c, {_get('c', 'ports', '[]')}.all(p, {_get('p', 'hostPort', '0')} == 0))",
            f"ports[*].hostPort of {EVERY_CONTAINER} must be unset or 0",
        ),
        (
            "appArmorProfile",
            f"{_profile_ok('object.spec', 'securityContext.appArmorProfile', APPARMOR_TYPES)} && "
            f"{CONTAINERS}.all(c, {_profile_ok('c', 'securityContext.appArmorProfile', APPARMOR_TYPES)})",
            f"spec.securityContext.appArmorProfile.type and that of {EVERY_CONTAINER} must be unset or "
            f"{' or '.join(APPARMOR_TYPES)}",
        ),
        (
            "appArmorProfile",
            f"{_get('object.metadata', 'annotations', '{}')}.all(k, !k.startsWith('{APPARMOR_ANNOTATION_PREFIX}') || "
            f"{annotations}[k] in {_strings(APPARMOR_ANNOTATION_VALUES)} || "
            f"{annotations}[k].startsWith('{APPARMOR_LOCALHOST_PREFIX}'))",
            f"metadata.annotations['{APPARMOR_ANNOTATION_PREFIX}*'] must be empty, runtime/default or "
            f"{APPARMOR_LOCALHOST_PREFIX}*",
        ),
        (
            "seLinuxOptions",
            f"{_selinux_ok('object.spec')} && {CONTAINERS}.all(c, {_selinux_ok('c')})",
            f"spec.securityContext.seLinuxOptions and that of {EVERY_CONTAINER}: type unset or one of "
            f"{', '.join(t for t in SELINUX_TYPES if t)}; user and role unset",
        ),
        (
            "procMount",
            f"!{_get('object.spec', 'hostUsers', 'true')} || "
            f"{CONTAINERS}.all(c, {_get('c', 'securityContext.procMount', repr(PROC_MOUNT_DEFAULT))} == "
            f"'{PROC_MOUNT_DEFAULT}')",
            f"securityContext.procMount of {EVERY_CONTAINER} must be unset or {PROC_MOUNT_DEFAULT} "
            "(unless spec.hostUsers is false)",
        ),
        (
            "seccompProfile_baseline",
            f"{_profile_ok('object.spec', 'securityContext.seccompProfile', SECCOMP_TYPES)} && "
            f"{CONTAINERS}.all(c, {_profile_ok('c', 'securityContext.seccompProfile', SECCOMP_TYPES)})",
            f"spec.securityContext.seccompProfile.type and that of {EVERY_CONTAINER} must be unset or "
            f"{' or '.join(SECCOMP_TYPES)} (never Unconfined)",
        ),
        (
            "sysctls",
            f"{_get('object.spec', 'securityContext.sysctls', '[]')}.all(s, s.name in {_strings(SAFE_SYSCTLS)})",
            f"spec.securityContext.sysctls[*].name must be one of the safe sysctls: {', '.join(SAFE_SYSCTLS)}",
        ),
        (
            "hostProbesAndHostLifecycle",
            f"{CONTAINERS}.all(c, {_no_host('c')})",
            f"the httpGet.host and tcpSocket.host of the probes and lifecycle hooks of {EVERY_CONTAINER} must be "
            "unset or empty",
        ),
    )


def policy_name(capabilities: Sequence[str]) -> str:
    return "pod-security-baseline-" + "-".join(c.lower().replace("_", "-") for c in capabilities)


class PodSecurityPolicies(Construct):
    """One policy and binding per capability set of the namespaces that have one (one today: IPC_LOCK)."""

    def __init__(self, scope: Construct, construct_id: str, *, namespaces: Sequence[NamespaceSpec]) -> None:
        super().__init__(scope, construct_id)
        by_capabilities: dict[tuple[str, ...], list[str]] = {}
        for spec in namespaces:
            if spec.capabilities:
                by_capabilities.setdefault(tuple(sorted(spec.capabilities)), []).append(spec.name)
        for capabilities, names in sorted(by_capabilities.items()):
            self._policy(capabilities, sorted(names))

    def _policy(self, capabilities: tuple[str, ...], namespaces: list[str]) -> None:
        name = policy_name(capabilities)
        what = f"Pod Security Baseline plus {', '.join(capabilities)}"
        checks = [
            {"expression": expression, "message": f"{what} ({check}, {BASELINE_CHECKS[check]}): {text}"}
            for check, expression, text in validations(capabilities)
        ]
        policy = {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["pods", "pods/ephemeralcontainers"],
                    }
                ]
            },
            "matchConditions": [{"name": "create-or-spec-changed", "expression": SPEC_CHANGED}],
            "validations": checks,
        }
        api_object(self, f"policy-{name}", ADMISSION, "ValidatingAdmissionPolicy", name, spec=policy)
        selector = {"matchExpressions": [{"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": namespaces}]}
        binding = {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": selector},
        }
        api_object(self, f"binding-{name}", ADMISSION, "ValidatingAdmissionPolicyBinding", name, spec=binding)
