"""The Capacity Block hold controller's identity, power and Deployment (capacity_hold/): only for an environment with
a GPU group on a block.

It runs our code alone, in its own namespace on the system nodes, with a token no workload mounts. Its
ServiceAccount may `get` and `patch` the block groups' ClusterQueues (by name) and `create` Events in `default`
(a ClusterQueue is cluster-scoped: Kubernetes 1.36 pkg/apis/core/validation/events.go legacyValidateEvent). RBAC
cannot narrow a patch to one field, so a ValidatingAdmissionPolicy bound with [Deny] matches this identity's
ClusterQueue UPDATEs (a PATCH is admitted as an UPDATE; matchPolicy Equivalent converts a v1beta1 request to
v1beta2) and lets it change only `spec.stopPolicy`, to None or Hold, and its own annotation: never the quota, the
cohort, the namespaceSelector or any other field of the Kueue v0.19.2 ClusterQueueSpec
(k8s/crds/kueue-v0.19.2/kueue.x-k8s.io_clusterqueues.yaml, v1beta2), never HoldAndDrain (which would evict the jobs
in the middle of their last save).
"""

from __future__ import annotations

from constructs import Construct

from capacity_hold.config import CONFIG_MAP, BlockGroup, HoldConfig
from capacity_hold.config import CONTROLLER as CONTROLLER  # the chart names its objects after it
from capacity_hold.decide import HOLD, HOLD_ANNOTATION, NONE
from infra.spec import Environment
from infra.spec.environments import CAPACITY_BLOCK_STOP_MARGIN
from infra.spec.namespaces import CAPACITY_HOLD_SYSTEM
from k8s.capacity_deadline import first_checkpoint_lead, on_block
from k8s.charts.admission_rules import cluster_queue_changes_only, cluster_queue_update_policy
from k8s.charts.objects import account, api_object, bound_role, deny_policy
from k8s.charts.small_controller import CONTROLLER_IMAGE, small_controller
from k8s.images import ImageLock
from k8s.nvrx_spec import NvrxFsdpJob
from k8s.queueing import cluster_queue_name
from k8s.ray_spec import gpu_group

NAMESPACE = CAPACITY_HOLD_SYSTEM.name
CONFIG_CONFIGMAP = CONFIG_MAP
CODE_ROOT = "/opt/capacity-hold"
POLICY = "capacity-hold-controller-stop-policy-only"
EVENT_NAMESPACE = "default"
SOURCES = (
    "capacity_hold/__init__.py",
    "capacity_hold/__main__.py",
    "capacity_hold/act.py",
    "capacity_hold/config.py",
    "capacity_hold/decide.py",
    "capacity_hold/loop.py",
    "training/__init__.py",
    "training/fabric_verdict.py",
    "training/kube_api.py",
    "training/rehearsal.py",
)
TOKEN_ACK = (
    "CKV_K8S_38=the Capacity Block hold controller acts through the API server with its own ServiceAccount "
    "(k8s/charts/capacity_hold.py: RBAC plus a ValidatingAdmissionPolicy); no workload pod mounts this token"
)
EVENTS_ACK = (
    "CKV_K8S_21=a ClusterQueue's Events must be in default (Kubernetes events validation); create on events only"
)


def has_block(environment: Environment) -> bool:
    return any(on_block(g) for g in environment.gpu_node_groups)


def hold_config(environment: Environment, nvrx_job: NvrxFsdpJob) -> HoldConfig:
    """Each block group: its queue, the block's end, the stop margin and the lead (the NVRx job's startup and steps
    to its first checkpoint where it runs on that group, else the startup alone)."""
    job_group = gpu_group(environment, nvrx_job.gpu_group).name
    groups = {}
    for group in environment.gpu_node_groups:
        if not on_block(group):
            continue
        assert group.capacity.end is not None  # required of a block group (infra/spec Capacity)
        runs_here = group.name == job_group
        lead_s, lead = first_checkpoint_lead(group, nvrx_job if runs_here else None)
        margin = CAPACITY_BLOCK_STOP_MARGIN.total_seconds()
        queue = cluster_queue_name(group.name)
        groups[group.name] = BlockGroup(group.name, queue, group.capacity.end, margin, lead_s, lead)
    return HoldConfig(groups)


def controller_username() -> str:
    return f"system:serviceaccount:{NAMESPACE}:{CONTROLLER}"


def validations() -> tuple[tuple[str, str], ...]:
    who = "the Capacity Block hold controller"
    return (
        (
            f"!has(object.spec.stopPolicy) || object.spec.stopPolicy in ['{NONE}', '{HOLD}']",
            f"{who} may set stopPolicy to {NONE} or {HOLD} only (HoldAndDrain would evict the jobs mid-save)",
        ),
        *cluster_queue_changes_only(who, "stopPolicy", HOLD_ANNOTATION),
    )


class CapacityHold(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        environment: Environment,
        lock: ImageLock,
        nvrx_job: NvrxFsdpJob,
    ) -> None:
        super().__init__(scope, construct_id)
        config = hold_config(environment, nvrx_job)
        me = [account(NAMESPACE, CONTROLLER)]
        api_object(self, "sa", "v1", "ServiceAccount", CONTROLLER, NAMESPACE)
        queues = sorted(g.queue for g in config.groups.values())
        rules = [
            {"apiGroups": ["kueue.x-k8s.io"], "resources": ["clusterqueues"], "verbs": ["get", "patch"]}
            | {"resourceNames": queues}
        ]
        bound_role(self, "cluster-role", CONTROLLER, None, rules, me)
        events = [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
        ack = {"checkov.io/skip1": EVENTS_ACK}
        bound_role(self, "events", CONTROLLER, EVENT_NAMESPACE, events, me, ack)
        deny_policy(
            self, "policy", POLICY, cluster_queue_update_policy(CONTROLLER, controller_username(), validations())
        )
        small_controller(
            self,
            name=CONTROLLER,
            namespace=NAMESPACE,
            image=lock.pinned(CONTROLLER_IMAGE),
            module="capacity_hold",
            code_root=CODE_ROOT,
            sources=SOURCES,
            config=config.to_json(),
            ack=TOKEN_ACK,
        )
