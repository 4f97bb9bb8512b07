"""The fabric gate's identity: it may put its own taint on a node and post Events, and nothing else.

RBAC cannot narrow a node patch to the taints: `patch` on `nodes` allows any change of any field of the main
resource (labels, annotations, unschedulable, every taint). So the identity is bounded twice:

- RBAC: a ServiceAccount `fabric-gate` in each gated namespace; a ClusterRole with `get` and `patch` on `nodes`
  (get: the gate reads the node's resourceVersion and taints before its JSON patch); a Role per namespace with
  `create` on `events` (the workload's Events), and one in `default` bound to every gate identity (a Node's Events:
  the API server accepts a cluster-scoped object's Events only there, training/fabric_gate.py
  NODE_EVENT_NAMESPACE). No list, watch, update, delete; no other resource; `nodes/status` is a subresource the
  role does not name.
- A ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1, GA since Kubernetes 1.30) bound with
  validationActions [Deny], matching UPDATE of nodes (a PATCH is admitted as an UPDATE) by those ServiceAccounts
  only (matchConditions on request.userInfo.username). Its CEL compares the object with oldObject: every taint but
  `platform/fabric-gate` unchanged, that taint NoSchedule only, never removed by the gate, and labels, annotations
  and the other spec fields unchanged. Releasing the taint is an operator's `kubectl taint` (trainctl status and
  scale print it), whom the policy does not match.

The expressions use standard CEL only (has, filter, all, exists, ternaries), so tests evaluate them with a CEL
implementation over real node objects (tests/k8s/test_fabric_gate_rbac.py).
"""

from __future__ import annotations

from typing import Any

import cdk8s
from constructs import Construct

from training.fabric_gate import NODE_EVENT_NAMESPACE, SERVICE_ACCOUNT, TAINT_EFFECT, TAINT_KEY

CLUSTER_ROLE = "fabric-gate-node-taint"
EVENTS_ROLE = "fabric-gate-events"
POLICY = "fabric-gate-taint-only"

# Node spec fields other than taints, from core/v1 NodeSpec (Kubernetes 1.36): the gate may change none of them.
OTHER_SPEC_FIELDS = ("configSource", "externalID", "podCIDR", "podCIDRs", "providerID", "unschedulable")


def _same(path: str) -> str:
    return (
        f"(has(object.{path}) == has(oldObject.{path})) && (!has(object.{path}) || object.{path} == oldObject.{path})"
    )


def _others(side: str) -> str:
    return f"(has({side}.spec.taints) ? {side}.spec.taints.filter(t, t.key != '{TAINT_KEY}') : [])"


VALIDATIONS: tuple[tuple[str, str], ...] = (
    (f"{_others('object')} == {_others('oldObject')}", f"the fabric gate may change no taint but {TAINT_KEY}"),
    (
        f"!has(object.spec.taints) || "
        f"object.spec.taints.all(t, t.key != '{TAINT_KEY}' || t.effect == '{TAINT_EFFECT}')",
        f"the fabric gate's taint {TAINT_KEY} must be {TAINT_EFFECT} (never NoExecute: it evicts nothing)",
    ),
    (
        f"!has(oldObject.spec.taints) || !oldObject.spec.taints.exists(t, t.key == '{TAINT_KEY}') || "
        f"(has(object.spec.taints) && object.spec.taints.exists(t, t.key == '{TAINT_KEY}'))",
        f"the fabric gate never removes {TAINT_KEY}: an operator releases a repaired node",
    ),
    (_same("metadata.labels"), "the fabric gate may not change a node's labels"),
    (_same("metadata.annotations"), "the fabric gate may not change a node's annotations"),
    *((_same(f"spec.{name}"), f"the fabric gate may not change spec.{name}") for name in OTHER_SPEC_FIELDS),
)


def usernames(namespaces: tuple[str, ...]) -> list[str]:
    return [f"system:serviceaccount:{namespace}:{SERVICE_ACCOUNT}" for namespace in namespaces]


RBAC = "rbac.authorization.k8s.io/v1"
ADMISSION = "admissionregistration.k8s.io/v1"


def _object(
    scope: Construct,
    construct_id: str,
    api_version: str,
    kind: str,
    name: str,
    namespace: str | None = None,
    annotations: dict[str, str] | None = None,
    **fields: Any,
) -> cdk8s.ApiObject:
    """An object with only a name (and namespace) in its metadata and `fields` (rules, roleRef, subjects, spec) at
    the top level."""
    obj = cdk8s.ApiObject(
        scope,
        construct_id,
        api_version=api_version,
        kind=kind,
        metadata=cdk8s.ApiObjectMetadata(name=name, namespace=namespace, annotations=annotations),
    )
    for key, value in fields.items():
        obj.add_json_patch(cdk8s.JsonPatch.add(f"/{key}", value))
    return obj


def _service_account(namespace: str) -> dict[str, str]:
    return {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": namespace}


NODE_EVENTS_ACK = "CKV_K8S_21=a Node's Events must be in default (Kubernetes events validation); create on events only"


class FabricGateChart(cdk8s.Chart):
    def __init__(self, scope: Construct, construct_id: str, *, namespaces: tuple[str, ...]) -> None:
        super().__init__(scope, construct_id, disable_resource_name_hashes=True)
        events = [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
        # A RayJob's Event needs its uid (kubectl describe selects Events by involvedObject.uid), which KubeRay gives
        # no pod of the RayJob's cluster: the gate reads the RayJob (training/fabric_gate.py read_workload_uid).
        reads = [{"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": ["get"]}]
        for namespace in namespaces:
            _object(self, f"sa-{namespace}", "v1", "ServiceAccount", SERVICE_ACCOUNT, namespace)
            _object(self, f"events-{namespace}", RBAC, "Role", EVENTS_ROLE, namespace, rules=events + reads)
            _object(
                self,
                f"events-binding-{namespace}",
                RBAC,
                "RoleBinding",
                EVENTS_ROLE,
                namespace,
                roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": EVENTS_ROLE},
                subjects=[_service_account(namespace)],
            )
        # The API server takes a cluster-scoped object's Events only in "default" (Kubernetes 1.36
        # pkg/apis/core/validation/events.go legacyValidateEvent), so this Role lives there: checkov's
        # CKV_K8S_21 is acknowledged on it, and it grants `create` on events and nothing else.
        node_events_ack = {"checkov.io/skip1": NODE_EVENTS_ACK}
        _object(
            self,
            "events-nodes",
            RBAC,
            "Role",
            EVENTS_ROLE,
            NODE_EVENT_NAMESPACE,
            annotations=node_events_ack,
            rules=events,
        )
        _object(
            self,
            "events-nodes-binding",
            RBAC,
            "RoleBinding",
            EVENTS_ROLE,
            NODE_EVENT_NAMESPACE,
            annotations=node_events_ack,
            roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": EVENTS_ROLE},
            subjects=[_service_account(ns) for ns in namespaces],
        )
        nodes = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
        _object(self, "node-taint", RBAC, "ClusterRole", CLUSTER_ROLE, rules=nodes)
        _object(
            self,
            "node-taint-binding",
            RBAC,
            "ClusterRoleBinding",
            CLUSTER_ROLE,
            roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CLUSTER_ROLE},
            subjects=[_service_account(ns) for ns in namespaces],
        )
        names = ", ".join(f"'{u}'" for u in usernames(namespaces))
        policy = {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}
                ]
            },
            "matchConditions": [
                {"name": "fabric-gate-identity", "expression": f"request.userInfo.username in [{names}]"}
            ],
            "validations": [{"expression": e, "message": m} for e, m in VALIDATIONS],
        }
        _object(self, "policy", ADMISSION, "ValidatingAdmissionPolicy", POLICY, spec=policy)
        binding = {"policyName": POLICY, "validationActions": ["Deny"]}
        _object(self, "policy-binding", ADMISSION, "ValidatingAdmissionPolicyBinding", POLICY, spec=binding)
