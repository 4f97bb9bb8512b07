"""The fabric gate's identities: the job decides and publishes, a controller acts (training/fabric_verdict.py).

Who can reach each identity decides what it may hold:

- The gated pods (every NVRx trainer, every Ray worker of a gated RayJob) run code anyone who reaches the Ray head's
  job API, or ships a package the trainer imports, can run. Their ServiceAccount `fabric-gate` may only `create` and
  `list` Events in its own namespace (the verdict, and the controller's answer): no node, no other resource.
- The remediation controller (fabric_controller/) runs our code alone, in its own namespace on the system nodes,
  with a token no workload mounts. Its ServiceAccount may read the pods and Kueue Workloads of the gated namespaces
  and the gated pods' owners where they live (Jobs in training, RayClusters and RayJobs in ray: OWNER_READS), patch
  nodes and the gated groups' ClusterQueues (by name), and post Events.
  RBAC cannot narrow a node patch to the taints (`patch` on `nodes` allows any field of the main resource), so a
  ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1, GA since Kubernetes 1.30) bound with [Deny] matches
  that identity's node UPDATEs (a PATCH is admitted as an UPDATE) and compares object with oldObject: only the
  `platform/fabric-gate` taint may be added, NoSchedule, never removed; labels, annotations, ownerReferences,
  finalizers and the other spec fields unchanged (an ownerReference to a missing owner would have the garbage
  collector delete the node: kubernetes pkg/controller/garbagecollector/garbagecollector.go attemptToDeleteItem; a
  finalizer would wedge its deletion); and only on a GPU worker of a gated group (its labels before the update).
  Releasing the taint is an operator's `kubectl taint` (trainctl status prints it), whom the policy does not match.
  Its ClusterQueue patch is narrowed the same way (QUEUE_POLICY): the quota (spec.resourceGroups) and its record
  (TAKEN_ANNOTATION) only, never spec.stopPolicy, which the Capacity Block hold controller owns
  (k8s/charts/capacity_hold.py), nor any other field or annotation.

All of it ships in the namespaces' file (k8s/charts/namespaces.py), so no step can skip it. The expressions use
standard CEL only, so tests evaluate them over real node objects (tests/k8s/test_fabric_gate_rbac.py).
"""

from __future__ import annotations

from constructs import Construct

from fabric_controller.config import ControllerConfig, GroupConfig
from infra.spec import Environment
from infra.spec.namespaces import RAY, TRAINING
from infra.spec.scheduling import GPU_GROUP_LABEL, GPU_ROLE, ROLE_LABEL
from k8s.charts.admission_rules import cluster_queue_changes_only, cluster_queue_update_policy, same
from k8s.charts.objects import account, api_object, bound_role, deny_policy
from k8s.charts.small_controller import CONTROLLER_IMAGE, small_controller
from k8s.images import ImageLock
from k8s.queueing import cluster_queue_name, gpu_flavor_name, gpu_quota
from training.fabric_gate import NODE_EVENT_NAMESPACE, SERVICE_ACCOUNT
from training.fabric_verdict import TAINT_EFFECT, TAINT_KEY, TAKEN_ANNOTATION

VERDICTS_ROLE = "fabric-gate-verdicts"
CONTROLLER = "fabric-gate-controller"
CONTROLLER_NAMESPACE = "fabric-gate-system"
CONFIG_CONFIGMAP = f"{CONTROLLER}-config"
CODE_ROOT = "/opt/fabric-gate"
POLICY = "fabric-gate-controller-taint-only"
QUEUE_POLICY = "fabric-gate-controller-quota-only"
# What the controller's pod runs: its package and the two training modules it shares with the gate (and theirs).
CONTROLLER_SOURCES = (
    "fabric_controller/__init__.py",
    "fabric_controller/__main__.py",
    "fabric_controller/act.py",
    "fabric_controller/config.py",
    "fabric_controller/decide.py",
    "fabric_controller/facts.py",
    "fabric_controller/loop.py",
    "training/__init__.py",
    "training/fabric_verdict.py",
    "training/kube_api.py",
    "training/rehearsal.py",
)

# Node spec fields other than taints, from core/v1 NodeSpec (Kubernetes 1.36): the controller may change none.
OTHER_SPEC_FIELDS = ("configSource", "externalID", "podCIDR", "podCIDRs", "providerID", "unschedulable")


def _others(side: str) -> str:
    return f"(has({side}.spec.taints) ? {side}.spec.taints.filter(t, t.key != '{TAINT_KEY}') : [])"


def validations(groups: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    names = ", ".join(f"'{g}'" for g in groups)
    labels = "oldObject.metadata.labels"
    return (
        (
            f"has({labels}) && '{ROLE_LABEL}' in {labels} && {labels}['{ROLE_LABEL}'] == '{GPU_ROLE}' && "
            f"'{GPU_GROUP_LABEL}' in {labels} && {labels}['{GPU_GROUP_LABEL}'] in [{names}]",
            f"the fabric gate controller may only change GPU workers of a gated group ({ROLE_LABEL}={GPU_ROLE}, "
            f"{GPU_GROUP_LABEL} in {list(groups)})",
        ),
        (
            f"{_others('object')} == {_others('oldObject')}",
            f"the fabric gate controller may change no taint but {TAINT_KEY}",
        ),
        (
            f"!has(object.spec.taints) || "
            f"object.spec.taints.all(t, t.key != '{TAINT_KEY}' || t.effect == '{TAINT_EFFECT}')",
            f"the fabric gate's taint {TAINT_KEY} must be {TAINT_EFFECT} (never NoExecute: it evicts nothing)",
        ),
        (
            f"!has(oldObject.spec.taints) || !oldObject.spec.taints.exists(t, t.key == '{TAINT_KEY}') || "
            f"(has(object.spec.taints) && object.spec.taints.exists(t, t.key == '{TAINT_KEY}'))",
            f"the fabric gate controller never removes {TAINT_KEY}: an operator releases a repaired node",
        ),
        (same("metadata.labels"), "the fabric gate controller may not change a node's labels"),
        (same("metadata.annotations"), "the fabric gate controller may not change a node's annotations"),
        (same("metadata.ownerReferences"), "the fabric gate controller may not change a node's ownerReferences"),
        (same("metadata.finalizers"), "the fabric gate controller may not change a node's finalizers"),
        *((same(f"spec.{n}"), f"the fabric gate controller may not change spec.{n}") for n in OTHER_SPEC_FIELDS),
    )


def queue_validations() -> tuple[tuple[str, str], ...]:
    return cluster_queue_changes_only("the fabric gate controller", "resourceGroups", TAKEN_ANNOTATION)


def controller_username() -> str:
    return f"system:serviceaccount:{CONTROLLER_NAMESPACE}:{CONTROLLER}"


CONTROLLER_TOKEN_ACK = (
    "CKV_K8S_38=the fabric gate's remediation controller acts through the API server with its own ServiceAccount "
    "(k8s/charts/fabric_gate.py: RBAC plus a ValidatingAdmissionPolicy); no workload pod mounts this token"
)
NODE_EVENTS_ACK = "CKV_K8S_21=a Node's Events must be in default (Kubernetes events validation); create on events only"


# The owners of a gated pod the controller reads (fabric_controller/facts.py find_gang), by the namespace they live in:
# the NVRx Job in training (k8s/charts/nvrx_job.py); a RayJob's RayCluster and the RayJob in ray (k8s/charts/ray.py).
# Each namespace's Role grants its own kinds only: no RayJob lives in training, no gated batch Job in ray.
OWNER_READS: dict[str, tuple[dict[str, list[str]], ...]] = {
    TRAINING.name: ({"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get"]},),
    RAY.name: ({"apiGroups": ["ray.io"], "resources": ["rayclusters", "rayjobs"], "verbs": ["get"]},),
}


def owner_reads(namespace: str) -> tuple[dict[str, list[str]], ...]:
    if namespace not in OWNER_READS:
        raise ValueError(
            f"fabric gate: no gated workload kinds known for namespace {namespace!r} (known: {sorted(OWNER_READS)}): "
            "add its owners' kinds to OWNER_READS in k8s/charts/fabric_gate.py"
        )
    return OWNER_READS[namespace]


def controller_config(environment: Environment, namespaces: tuple[str, ...]) -> ControllerConfig:
    """The gated groups (GpuNodeGroupConfig.gated: their multi-node jobs run the gate), their queues and one node's
    quota (k8s/queueing.py gpu_quota, as `trainctl scale` and the Platform stack write it)."""
    groups = {}
    for group in environment.gpu_node_groups:
        if not group.gated:
            continue
        per_node = {r["name"]: r["nominalQuota"] for r in gpu_quota(group, 1).resources()}
        name = group.name
        groups[name] = GroupConfig(name, cluster_queue_name(name), gpu_flavor_name(name), per_node)
    return ControllerConfig(namespaces, groups)


class FabricGate(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        environment: Environment,
        lock: ImageLock,
        namespaces: tuple[str, ...],
    ) -> None:
        super().__init__(scope, construct_id)
        config = controller_config(environment, namespaces)
        self._gated_pods(namespaces)
        self._controller_identity(config)
        self._controller(config, lock)

    def _gated_pods(self, namespaces: tuple[str, ...]) -> None:
        verdicts = [{"apiGroups": [""], "resources": ["events"], "verbs": ["create", "list"]}]
        for namespace in namespaces:
            api_object(self, f"sa-{namespace}", "v1", "ServiceAccount", SERVICE_ACCOUNT, namespace)
            subjects = [account(namespace, SERVICE_ACCOUNT)]
            bound_role(self, f"verdicts-{namespace}", VERDICTS_ROLE, namespace, verdicts, subjects)

    def _controller_identity(self, config: ControllerConfig) -> None:
        me = [account(CONTROLLER_NAMESPACE, CONTROLLER)]
        api_object(self, "controller-sa", "v1", "ServiceAccount", CONTROLLER, CONTROLLER_NAMESPACE)
        queues = sorted(g.queue for g in config.groups.values())
        cluster_rules = [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]},
            {"apiGroups": ["kueue.x-k8s.io"], "resources": ["clusterqueues"], "verbs": ["get", "patch"]}
            | {"resourceNames": queues},
        ]
        bound_role(self, "controller-cluster-role", CONTROLLER, None, cluster_rules, me)
        for namespace in config.namespaces:
            reads = [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
                *owner_reads(namespace),
                {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["list"]},
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "list"]},
            ]
            bound_role(self, f"controller-role-{namespace}", CONTROLLER, namespace, reads, me)
        # The API server takes a cluster-scoped object's Events only in "default" (Kubernetes 1.36
        # pkg/apis/core/validation/events.go legacyValidateEvent): `create` on events there and nothing else.
        events = [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
        ack = {"checkov.io/skip1": NODE_EVENTS_ACK}
        bound_role(self, "node-events", CONTROLLER, NODE_EVENT_NAMESPACE, events, me, ack)
        policy = {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}
                ]
            },
            "matchConditions": [
                {"name": CONTROLLER, "expression": f"request.userInfo.username == '{controller_username()}'"}
            ],
            "validations": [{"expression": e, "message": m} for e, m in validations(tuple(sorted(config.groups)))],
        }
        deny_policy(self, "policy", POLICY, policy)
        queue_policy = cluster_queue_update_policy(CONTROLLER, controller_username(), queue_validations())
        deny_policy(self, "queue-policy", QUEUE_POLICY, queue_policy)

    def _controller(self, config: ControllerConfig, lock: ImageLock) -> None:
        small_controller(
            self,
            name=CONTROLLER,
            namespace=CONTROLLER_NAMESPACE,
            image=lock.pinned(CONTROLLER_IMAGE),
            module="fabric_controller",
            code_root=CODE_ROOT,
            sources=CONTROLLER_SOURCES,
            config=config.to_json(),
            ack=CONTROLLER_TOKEN_ACK,
        )
