"""The cluster a rehearsal runs on: its nodes, the scheduler deciding where each pod goes, and node loss.

`ClusterPlacement` is what the run loop asks before a pod starts (`place`: a node, or Pending with
kube-scheduler's message) and tells when a pod ends (`release`: its requests leave the node). Pending
pods are asked again on every loop turn, oldest first, as kube-scheduler retries unschedulable pods
when the cluster changes (a pod ended, a node came or went).

Node loss (`--kill-node NODE@SECONDS`, cluster time): at that moment the node's instance is gone, so
its pods' processes die at once; what Kubernetes then does is emulated with the controllers' timings:
- the node lifecycle controller marks the node Ready=Unknown once the kubelet has not reported for
  node-monitor-grace-period (kube-controller-manager default 50 s since Kubernetes 1.32, 40 s before:
  pkg/controller/nodelifecycle/config/v1alpha1/defaults.go; infra/spec/node_loss.py) and taints it
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

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.spec import node_loss
from rehearse.cluster.nodes import ClusterNode, find_node
from rehearse.cluster.scheduler import (
    BoundPod,
    PodToPlace,
    Scheduled,
    UnsupportedPodError,
    Volumes,
    bind,
    check_supported,
    pod_requests,
    schedule,
)
from rehearse.errors import RehearsalError
from rehearse.seams import Pending

if TYPE_CHECKING:
    from rehearse.cluster.kueue import PodSetAdmission
    from rehearse.pods import Pod, PodPlan

# kube-controller-manager's --node-monitor-grace-period and DefaultTolerationSeconds: one home, infra/spec/node_loss.py.
NODE_MONITOR_GRACE_S = float(node_loss.NODE_MONITOR_GRACE_S)
DEFAULT_UNREACHABLE_TOLERATION_S = float(node_loss.UNREACHABLE_TOLERATION_S)
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
EVICTION_REASON = "DeletionByTaintManager"
# Resources the node model has no capacity figure for: refused rather than guessed.
UNMODELLED_RESOURCES = ("ephemeral-storage", "hugepages-")


@dataclass(frozen=True, kw_only=True)
class NodeKill:
    """Lose `node` at cluster time `seconds`, or (API only) `seconds` after the path `after` (relative to the output
    directory, e.g. a checkpoint committed on a claim: `claims/<ns>/<claim>/...`) first exists."""

    node: str
    seconds: float
    after: Path | None = None


@dataclass(frozen=True)
class Eviction:
    pod: str
    node: str
    at: float


def unreachable_toleration_s(spec: Mapping[str, Any]) -> float | None:
    """How long the pod stays bound to an unreachable node (None: for ever)."""
    for toleration in spec.get("tolerations") or []:
        key, effect = toleration.get("key") or "", toleration.get("effect") or ""
        matches_key = key == UNREACHABLE_TAINT or (key == "" and toleration.get("operator") == "Exists")
        if matches_key and effect in ("", "NoExecute"):
            seconds = toleration.get("tolerationSeconds")
            return None if seconds is None else float(seconds)
    return DEFAULT_UNREACHABLE_TOLERATION_S


def scheduling_spec(
    spec: Mapping[str, Any],
    unrun_containers: Sequence[Mapping[str, Any]] = (),
    flavors: PodSetAdmission | None = None,
) -> dict[str, Any]:
    """The pod spec kube-scheduler sees: the manifest's, plus the containers a controller adds that the
    rehearsal does not run (KubeRay's autoscaler sidecar), plus what Kueue's admission adds (the assigned
    flavors' nodeLabels in the nodeSelector, their tolerations)."""
    out = dict(spec)
    if unrun_containers:
        out["containers"] = [*spec.get("containers", []), *unrun_containers]
    if flavors is not None:
        out["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **flavors.node_labels}
        out["tolerations"] = [*(spec.get("tolerations") or []), *flavors.tolerations]
    return out


@dataclass
class ClusterPlacement:
    """The Placement (and NodeLoss) seam of rehearse/seams.py over the environment's nodes."""

    nodes: list[ClusterNode]
    volumes: Volumes
    kills: Sequence[NodeKill] = ()
    # The Kueue admission of the pod's PodSet, if any (its flavors' labels and tolerations join the pod).
    flavors: Callable[[PodPlan], PodSetAdmission | None] | None = None
    bound: dict[str, tuple[ClusterNode, BoundPod]] = field(default_factory=dict)
    lost: dict[str, float] = field(default_factory=dict)
    evictions: list[Eviction] = field(default_factory=list)
    _tolerations: dict[str, float | None] = field(default_factory=dict)
    _newly_lost: list[str] = field(default_factory=list)
    _armed: dict[NodeKill, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for kill in self.kills:
            try:
                find_node(self.nodes, kill.node)
            except ValueError as exc:
                raise RehearsalError(str(exc)) from exc

    @classmethod
    def for_objects(
        cls,
        nodes: list[ClusterNode],
        objects: Iterable[Mapping[str, Any]],
        *,
        kills: Sequence[NodeKill] = (),
        flavors: Callable[[PodPlan], PodSetAdmission | None] | None = None,
    ) -> ClusterPlacement:
        return cls(nodes=nodes, volumes=Volumes.from_objects(objects), kills=kills, flavors=flavors)

    def spec_of(self, plan: PodPlan) -> dict[str, Any]:
        flavors = self.flavors(plan) if self.flavors is not None else None
        return scheduling_spec(plan.spec, plan.unrun_containers, flavors)

    def place(self, plan: PodPlan) -> str | Pending | None:
        spec = self.spec_of(plan)
        try:
            self.check(plan.name, spec)
            decision = self.place_spec(plan.name, plan.namespace, plan.labels, spec)
        except UnsupportedPodError as exc:
            raise RehearsalError(f"cannot rehearse on a cluster: {exc}") from exc
        return decision

    def check(self, name: str, spec: Mapping[str, Any]) -> None:
        """UnsupportedPodError for a pod the model cannot place honestly."""
        check_supported(PodToPlace(name, "", {}, spec))
        for resource in pod_requests(spec):
            if any(resource.startswith(prefix) for prefix in UNMODELLED_RESOURCES):
                raise UnsupportedPodError(
                    f"pod {name}: requests {resource}, which the node model has no capacity for "
                    "(infra/spec/kubelet.py models cpu, memory, pods, nvidia.com/gpu and vpc.amazonaws.com/efa)"
                )

    def place_spec(
        self, name: str, namespace: str, labels: Mapping[str, str], spec: Mapping[str, Any]
    ) -> str | Pending:
        """Binds the pod to the node kube-scheduler would choose, or says why it stays Pending."""
        pod = PodToPlace(name, namespace, labels, spec)
        result = schedule(pod, self.nodes, self.volumes)
        if not isinstance(result, Scheduled):
            return Pending(result.message)
        node = result.node
        assert isinstance(node, ClusterNode)
        self.bound[name] = (node, bind(pod, node))
        self._tolerations[name] = unreachable_toleration_s(spec)
        return node.name

    def release(self, pod: Pod) -> None:
        self.release_name(pod.name)

    def release_name(self, name: str) -> None:
        entry = self.bound.pop(name, None)
        if entry is not None:
            node, bound = entry
            if bound in node.pods:
                node.pods.remove(bound)

    def node_of(self, name: str) -> ClusterNode | None:
        entry = self.bound.get(name)
        return entry[0] if entry else None

    def pods_on(self, node: ClusterNode) -> list[str]:
        return [name for name, (n, _) in self.bound.items() if n is node]

    def arm(self, exists: Callable[[Path], bool], now: float) -> None:
        """Starts the clock of each kill whose `after` path exists by cluster time `now`."""
        for kill in self.kills:
            if kill.after is not None and kill not in self._armed and exists(kill.after):
                self._armed[kill] = now

    def _due(self, kill: NodeKill) -> float | None:
        if kill.after is None:
            return kill.seconds
        armed = self._armed.get(kill)
        return None if armed is None else armed + kill.seconds

    def node_lost_pods(self, now: float) -> list[str]:
        """Nodes whose loss is due at cluster time `now` (each once) are tainted unreachable from then on;
        their pods are returned and their evictions scheduled."""
        lost: list[str] = []
        for kill in self.kills:
            node = find_node(self.nodes, kill.node)
            due = self._due(kill)
            if node.name in self.lost or due is None or now < due:
                continue
            self.lost[node.name] = due
            node.ready = False
            node.taints += [
                {"key": UNREACHABLE_TAINT, "value": "", "effect": "NoSchedule"},
                {"key": UNREACHABLE_TAINT, "value": "", "effect": "NoExecute"},
            ]
            for pod_name in self.pods_on(node):
                lost.append(pod_name)
                toleration = self._tolerations.get(pod_name, DEFAULT_UNREACHABLE_TOLERATION_S)
                if toleration is not None:
                    at = due + NODE_MONITOR_GRACE_S + toleration
                    self.evictions.append(Eviction(pod=pod_name, node=node.name, at=at))
        return lost

    def node_evictions(self, now: float) -> list[tuple[str, str]]:
        due = [e for e in self.evictions if e.at <= now]
        self.evictions = [e for e in self.evictions if e.at > now]
        return [(e.pod, EVICTION_REASON) for e in due]


def node_address(node: ClusterNode) -> str:
    """ip-10-10-64-11.us-west-2.compute.internal -> 10.10.64.11 (the EC2 private DNS name's address)."""
    return node.name.split(".", 1)[0].removeprefix("ip-").replace("-", ".")
