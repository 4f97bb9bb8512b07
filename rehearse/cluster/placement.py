"""The cluster a rehearsal runs on: its nodes, the scheduler deciding where each pod goes, and node loss.

`ClusterPlacement` is what the run loop asks before a pod starts (`place`: a node, or Pending with
kube-scheduler's message) and tells when a pod ends (`release`: its requests leave the node). Pending
pods are asked again on every loop turn, oldest first, as kube-scheduler retries unschedulable pods
when the cluster changes (a pod ended, a node came or went).

Node loss (`--kill-node NODE@SECONDS`, cluster time): at that moment the node's instance is gone, so
its pods' processes die at once; what Kubernetes then does is emulated with the controllers' timings:
- the node lifecycle controller marks the node Ready=Unknown once the kubelet has not reported for
  node-monitor-grace-period (kube-controller-manager default 40 s: SetDefaults_NodeLifecycleController-
  Configuration, pkg/controller/nodelifecycle/config/v1alpha1/defaults.go) and taints it
  node.kubernetes.io/unreachable with NoSchedule and NoExecute (pkg/controller/nodelifecycle/
  node_lifecycle_controller.go). The scheduler here sees the NoSchedule taint from the moment of the
  loss (no new pod is bound to the dead node during the grace period: a simplification);
- taint-based eviction (pkg/controller/tainteviction/taint_eviction.go) deletes each pod once its
  toleration of the NoExecute taint runs out, adding the DisruptionTarget condition with reason
  DeletionByTaintManager; a pod without its own toleration gets `node.kubernetes.io/unreachable:NoExecute`
  for 300 s from the DefaultTolerationSeconds admission plugin (plugin/pkg/admission/
  defaulttolerationseconds/admission.go, --default-unreachable-toleration-seconds=300). So a pod on a
  lost node is reported ended (Failed, DisruptionTarget) 40 + 300 s after the loss, and only then does
  its controller replace it. The node stays lost: a replacement node (auto repair, the Auto Scaling
  group) is not modelled.

Every timing is cluster time; `time_scale` divides them into wall time (`--time-scale`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rehearse.cluster.nodes import ClusterNode, find_node
from rehearse.cluster.scheduler import (
    BoundPod,
    PodToPlace,
    Scheduled,
    UnsupportedPodError,
    Volumes,
    bind,
    schedule,
)

NODE_MONITOR_GRACE_S = 40.0
DEFAULT_UNREACHABLE_TOLERATION_S = 300.0
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
# Resources the node model has no capacity figure for: refused rather than guessed.
UNMODELLED_RESOURCES = ("ephemeral-storage", "hugepages-")


@dataclass(frozen=True)
class NodeBinding:
    node: str
    address: str
    labels: Mapping[str, str]


@dataclass(frozen=True)
class Pending:
    reason: str


@dataclass(frozen=True, kw_only=True)
class NodeKill:
    node: str
    seconds: float


@dataclass(frozen=True)
class Eviction:
    pod: str
    node: str
    at: float


def unreachable_toleration_s(spec: Mapping[str, Any]) -> float | None:
    """How long the pod stays bound to an unreachable node (None: for ever)."""
    for toleration in spec.get("tolerations") or []:
        key, effect = toleration.get("key") or "", toleration.get("effect") or ""
        if key in ("", UNREACHABLE_TAINT) and effect in ("", "NoExecute") and toleration.get("operator") == "Exists":
            seconds = toleration.get("tolerationSeconds")
            return None if seconds is None else float(seconds)
        if key == UNREACHABLE_TAINT and effect in ("", "NoExecute"):
            seconds = toleration.get("tolerationSeconds")
            return None if seconds is None else float(seconds)
    return DEFAULT_UNREACHABLE_TOLERATION_S


def scheduling_spec(spec: Mapping[str, Any], unrun_containers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The pod spec kube-scheduler sees: the manifest's plus the containers a controller adds that the
    rehearsal does not run (KubeRay's autoscaler sidecar)."""
    if not unrun_containers:
        return dict(spec)
    return {**spec, "containers": [*spec.get("containers", []), *unrun_containers]}


@dataclass
class ClusterPlacement:
    nodes: list[ClusterNode]
    volumes: Volumes
    time_scale: float = 1.0
    kills: Sequence[NodeKill] = ()
    bound: dict[str, tuple[ClusterNode, BoundPod]] = field(default_factory=dict)
    lost: dict[str, float] = field(default_factory=dict)
    evictions: list[Eviction] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for kill in self.kills:
            find_node(self.nodes, kill.node)
        self._tolerations: dict[str, float | None] = {}

    @classmethod
    def for_objects(
        cls,
        nodes: list[ClusterNode],
        objects: Iterable[Mapping[str, Any]],
        *,
        time_scale: float = 1.0,
        kills: Sequence[NodeKill] = (),
    ) -> ClusterPlacement:
        return cls(nodes=nodes, volumes=Volumes.from_objects(objects), time_scale=time_scale, kills=kills)

    def check(self, name: str, spec: Mapping[str, Any]) -> None:
        """UnsupportedPodError for a pod the model cannot place honestly."""
        from rehearse.cluster.scheduler import check_supported, pod_requests

        check_supported(PodToPlace(name, "", {}, spec))
        for resource in pod_requests(spec):
            if any(resource.startswith(prefix) for prefix in UNMODELLED_RESOURCES):
                raise UnsupportedPodError(
                    f"pod {name}: requests {resource}, which the node model has no capacity for "
                    "(infra/spec/kubelet.py models cpu, memory, pods, nvidia.com/gpu and vpc.amazonaws.com/efa)"
                )

    def place(
        self,
        name: str,
        namespace: str,
        labels: Mapping[str, str],
        spec: Mapping[str, Any],
    ) -> NodeBinding | Pending:
        pod = PodToPlace(name, namespace, labels, spec)
        result = schedule(pod, self.nodes, self.volumes)
        if not isinstance(result, Scheduled):
            return Pending(result.message)
        node = result.node
        assert isinstance(node, ClusterNode)
        self.bound[name] = (node, bind(pod, node))
        self._tolerations[name] = unreachable_toleration_s(spec)
        return NodeBinding(node=node.name, address=_node_address(node), labels=dict(node.labels))

    def release(self, name: str) -> None:
        entry = self.bound.pop(name, None)
        if entry is not None:
            node, bound = entry
            if bound in node.pods:
                node.pods.remove(bound)

    def node_of(self, name: str) -> ClusterNode | None:
        entry = self.bound.get(name)
        return entry[0] if entry else None

    def due_losses(self, now: float) -> list[ClusterNode]:
        """Nodes whose loss is due at cluster time `now` (each once): tainted unreachable from now on."""
        lost = []
        for kill in self.kills:
            node = find_node(self.nodes, kill.node)
            if node.name in self.lost or now < kill.seconds:
                continue
            self.lost[node.name] = kill.seconds
            node.ready = False
            node.taints += [
                {"key": UNREACHABLE_TAINT, "value": "", "effect": "NoSchedule"},
                {"key": UNREACHABLE_TAINT, "value": "", "effect": "NoExecute"},
            ]
            for pod_name, (bound_node, _) in self.bound.items():
                if bound_node is node:
                    toleration = self._tolerations.get(pod_name, DEFAULT_UNREACHABLE_TOLERATION_S)
                    if toleration is not None:
                        at = kill.seconds + NODE_MONITOR_GRACE_S + toleration
                        self.evictions.append(Eviction(pod=pod_name, node=node.name, at=at))
            lost.append(node)
        return lost

    def pods_on(self, node: ClusterNode) -> list[str]:
        return [name for name, (n, _) in self.bound.items() if n is node]

    def due_evictions(self, now: float) -> list[Eviction]:
        due = [e for e in self.evictions if e.at <= now]
        self.evictions = [e for e in self.evictions if e.at > now]
        return due


def _node_address(node: ClusterNode) -> str:
    # ip-10-10-64-11.us-west-2.compute.internal -> 10.10.64.11
    return node.name.split(".", 1)[0].removeprefix("ip-").replace("-", ".")
