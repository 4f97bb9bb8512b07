"""kube-scheduler's filters, as pure functions over hand-held nodes and pods.

Mirrored from kubernetes/kubernetes at v1.36 (pkg/scheduler/framework/plugins/...):
- the filter plugins run in the default profile's order (pkg/scheduler/apis/config/v1/default_plugins.go):
  NodeName, TaintToleration, NodeAffinity, NodePorts, NodeResourcesFit, VolumeBinding, VolumeZone,
  InterPodAffinity; the first plugin that rejects a node gives that node's reasons (framework
  RunFilterPlugins returns the first failure);
- a pod no node passes stays Pending with the FitError message (pkg/scheduler/framework/types.go
  FitError.Error): "0/N nodes are available: " then, when a PreFilter rejected the pod, its message,
  else the histogram of the nodes' reasons as "<count> <reason>" strings sorted as strings and joined
  by ", ", ending in "."; DefaultPreemption's PostFilter text (" preemption: ...") is not reproduced
  (the rehearsal models no priorities, so nothing could be preempted);
- NodeResourcesFit (noderesources/fit.go): the pod's requests as component-helpers resource.PodRequests
  computes them: the sum of the containers, plus every restartable init container (sidecar), and at
  least each plain init container's request plus the sidecars started before it; requests default to
  limits where only limits are set (the apiserver's defaulting); a node fails with "Too many pods" and
  "Insufficient <resource>" for each resource (cpu, memory, extended such as nvidia.com/gpu) its
  allocatable minus the requests of the pods already on it cannot cover;
- TaintToleration (tainttoleration/taint_toleration.go): NoSchedule and NoExecute taints must be
  tolerated, "node(s) had untolerated taint {<key>: <value>}" for the first one that is not;
- NodeAffinity (nodeaffinity/node_affinity.go): spec.nodeSelector and required node affinity terms
  (In, NotIn, Exists, DoesNotExist, Gt, Lt; matchFields metadata.name), "node(s) didn't match Pod's
  node affinity/selector";
- NodePorts (nodeports/node_ports.go): host ports (hostNetwork pods' container ports too), "node(s)
  didn't have free ports for the requested pod ports";
- VolumeBinding (volumebinding/volume_binding.go): a claim the pod mounts must exist (PreFilter:
  `persistentvolumeclaim "<name>" not found`) and be bound ("pod has unbound immediate
  PersistentVolumeClaims"); a bound volume's required node affinity must match the node, "node(s)
  had volume node affinity conflict";
- VolumeZone (volumezone/volume_zone.go): a bound volume's zone/region labels must match the node's,
  "node(s) had no available volume zone";
- InterPodAffinity (interpodaffinity/filtering.go): existing pods' required anti-affinity ("node(s)
  didn't satisfy existing pods anti-affinity rules"), the pod's required affinity ("node(s) didn't
  match pod affinity rules") and required anti-affinity ("node(s) didn't match pod anti-affinity
  rules") per topology key.

Among the nodes that pass, kube-scheduler scores; here the node with the most free cpu and memory
(NodeResourcesFit's default LeastAllocated strategy) is chosen, ties in node order (kube-scheduler
breaks ties at random). Other scores (balanced allocation, image locality, preferred affinities,
default topology spreading) are not modelled.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rehearse.cluster import matching
from rehearse.cluster.matching import UnknownOperatorError, expression_matches, tolerates
from rehearse.cluster.quantity import QuantityError, parse_quantity

CPU = "cpu"
MEMORY = "memory"
PODS = "pods"
ZONE_LABELS = ("topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone")
REGION_LABELS = ("topology.kubernetes.io/region", "failure-domain.beta.kubernetes.io/region")

REASON_TOO_MANY_PODS = "Too many pods"
REASON_NODE_NAME = "node(s) didn't match the requested node name"
REASON_NODE_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
REASON_NODE_PORTS = "node(s) didn't have free ports for the requested pod ports"
REASON_VOLUME_CONFLICT = "node(s) had volume node affinity conflict"
REASON_VOLUME_ZONE = "node(s) had no available volume zone"
REASON_EXISTING_ANTI_AFFINITY = "node(s) didn't satisfy existing pods anti-affinity rules"
REASON_AFFINITY = "node(s) didn't match pod affinity rules"
REASON_ANTI_AFFINITY = "node(s) didn't match pod anti-affinity rules"
REASON_UNBOUND_CLAIMS = "pod has unbound immediate PersistentVolumeClaims"


class UnsupportedPodError(ValueError):
    """A pod field the scheduler model cannot honour (the rehearsal exits 2 naming it)."""


def quantity(value: str | int | float, *, milli: bool = False) -> int:
    """A Kubernetes quantity as an integer: millis for cpu (`milli`), else the value rounded up, as
    resource.Quantity.MilliValue/Value do."""
    try:
        return parse_quantity(value, milli=milli)
    except QuantityError as error:
        raise UnsupportedPodError(f"quantity {error}") from None


def _container_requests(container: Mapping[str, Any]) -> dict[str, int]:
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = {**limits, **(resources.get("requests") or {})}
    return {name: quantity(v, milli=name == CPU) for name, v in requests.items()}


def _add(total: dict[str, int], more: Mapping[str, int]) -> None:
    for k, v in more.items():
        total[k] = total.get(k, 0) + v


def _max(total: dict[str, int], other: Mapping[str, int]) -> None:
    for k, v in other.items():
        total[k] = max(total.get(k, 0), v)


def pod_requests(spec: Mapping[str, Any]) -> dict[str, int]:
    """component-helpers resource.PodRequests (no pod-level resources, no in-place resize)."""
    if (spec.get("resources") or {}).get("requests") or (spec.get("resources") or {}).get("limits"):
        raise UnsupportedPodError("spec.resources (pod-level resources) is not modelled by the scheduler")
    requests: dict[str, int] = {}
    for container in spec.get("containers", []):
        _add(requests, _container_requests(container))
    sidecars: dict[str, int] = {}
    init_max: dict[str, int] = {}
    for container in spec.get("initContainers", []):
        own = _container_requests(container)
        if container.get("restartPolicy") == "Always":
            _add(sidecars, own)
            _add(requests, own)
            candidate = dict(sidecars)
        else:
            candidate = dict(sidecars)
            _add(candidate, own)
        _max(init_max, candidate)
    _max(requests, init_max)
    for name, value in (spec.get("overhead") or {}).items():
        requests[name] = requests.get(name, 0) + quantity(value, milli=name == CPU)
    return {k: v for k, v in requests.items() if v}


def host_ports(spec: Mapping[str, Any]) -> set[tuple[str, str, int]]:
    """(hostIP, protocol, hostPort) the pod takes on its node; hostNetwork pods take their container ports."""
    ports: set[tuple[str, str, int]] = set()
    for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        for port in container.get("ports", []):
            host_port = port.get("hostPort") or (port.get("containerPort") if spec.get("hostNetwork") else None)
            if host_port:
                ports.add((port.get("hostIP") or "0.0.0.0", port.get("protocol", "TCP"), int(host_port)))
    return ports


@dataclass
class BoundPod:
    """A pod that holds resources on a node (a running workload pod or an add-on pod)."""

    name: str
    namespace: str
    labels: Mapping[str, str]
    requests: Mapping[str, int]
    ports: set[tuple[str, str, int]] = field(default_factory=set)
    anti_affinity: Sequence[Mapping[str, Any]] = ()


@dataclass
class Node:
    name: str
    labels: dict[str, str]
    taints: list[dict[str, str]]
    allocatable: dict[str, int]
    pods: list[BoundPod] = field(default_factory=list)

    def requested(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for pod in self.pods:
            _add(total, pod.requests)
        return total

    def free(self) -> dict[str, int]:
        used = self.requested()
        return {k: v - used.get(k, 0) for k, v in self.allocatable.items()}


@dataclass(frozen=True)
class PodToPlace:
    name: str
    namespace: str
    labels: Mapping[str, str]
    spec: Mapping[str, Any]


@dataclass(frozen=True)
class Volumes:
    """PersistentVolumeClaims by (namespace, name) and PersistentVolumes by name."""

    claims: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    volumes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_objects(cls, objects: Iterable[Mapping[str, Any]]) -> Volumes:
        claims, volumes = {}, {}
        for obj in objects:
            meta = obj.get("metadata", {})
            if obj.get("kind") == "PersistentVolumeClaim":
                claims[(meta.get("namespace", "default"), meta["name"])] = obj
            elif obj.get("kind") == "PersistentVolume":
                volumes[meta["name"]] = obj
        return cls(claims=claims, volumes=volumes)


@dataclass(frozen=True)
class Scheduled:
    node: Node


@dataclass(frozen=True)
class Unschedulable:
    message: str
    reasons: Mapping[str, tuple[str, ...]]


# -- matching helpers ---------------------------------------------------------------------------------


def _expression(labels: Mapping[str, str], expr: Mapping[str, Any]) -> bool:
    try:
        return expression_matches(expr, labels)
    except UnknownOperatorError as exc:
        raise UnsupportedPodError(f"node selector operator {str(exc)!r}") from None


def node_selector_terms_match(terms: Sequence[Mapping[str, Any]], node: Node) -> bool:
    """Any term whose matchExpressions and matchFields all match; a term with neither matches nothing."""
    fields = {"metadata.name": node.name}
    for term in terms:
        expressions = term.get("matchExpressions") or []
        field_exprs = term.get("matchFields") or []
        if not expressions and not field_exprs:
            continue
        if all(_expression(node.labels, e) for e in expressions) and all(_expression(fields, e) for e in field_exprs):
            return True
    return False


def label_selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """matching.label_selector_matches, an operator it does not know refused as the scheduler refuses it."""
    try:
        return matching.label_selector_matches(selector, labels)
    except UnknownOperatorError as exc:
        raise UnsupportedPodError(f"label selector operator {str(exc)!r}") from None


def _term_namespaces(term: Mapping[str, Any], namespace: str) -> set[str] | None:
    """The namespaces a pod affinity term selects; None: all namespaces."""
    selector = term.get("namespaceSelector")
    if selector is not None:
        if selector.get("matchLabels") or selector.get("matchExpressions"):
            raise UnsupportedPodError("a pod affinity namespaceSelector with labels is not modelled")
        return None
    return set(term.get("namespaces") or [namespace])


def _term_matches(term: Mapping[str, Any], owner_namespace: str, pod: BoundPod | PodToPlace) -> bool:
    namespaces = _term_namespaces(term, owner_namespace)
    if namespaces is not None and pod.namespace not in namespaces:
        return False
    return label_selector_matches(term.get("labelSelector"), pod.labels)


def _required(affinity: Mapping[str, Any] | None, kind: str) -> list[Mapping[str, Any]]:
    return list(((affinity or {}).get(kind) or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or [])


# -- the filters --------------------------------------------------------------------------------------


def _taint_toleration(pod: PodToPlace, node: Node) -> list[str]:
    tolerations = pod.spec.get("tolerations") or []
    for taint in node.taints:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(tolerates(t, taint) for t in tolerations):
            return [f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"]
    return []


def _node_affinity(pod: PodToPlace, node: Node) -> list[str]:
    selector = pod.spec.get("nodeSelector") or {}
    if any(node.labels.get(k) != v for k, v in selector.items()):
        return [REASON_NODE_AFFINITY]
    required = ((pod.spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required is not None and not node_selector_terms_match(required.get("nodeSelectorTerms") or [], node):
        return [REASON_NODE_AFFINITY]
    return []


def _ports_conflict(want: tuple[str, str, int], have: tuple[str, str, int]) -> bool:
    ip_a, proto_a, port_a = want
    ip_b, proto_b, port_b = have
    return port_a == port_b and proto_a == proto_b and ("0.0.0.0" in (ip_a, ip_b) or ip_a == ip_b)


def _node_ports(pod: PodToPlace, node: Node) -> list[str]:
    wanted = host_ports(pod.spec)
    used = [p for bound in node.pods for p in bound.ports]
    if any(_ports_conflict(w, u) for w in wanted for u in used):
        return [REASON_NODE_PORTS]
    return []


def _resources_fit(requests: Mapping[str, int], node: Node) -> list[str]:
    reasons = []
    if len(node.pods) + 1 > node.allocatable.get(PODS, 0):
        reasons.append(REASON_TOO_MANY_PODS)
    free = node.free()
    for name in (CPU, MEMORY, *sorted(k for k in requests if k not in (CPU, MEMORY))):
        if requests.get(name, 0) > free.get(name, 0):
            reasons.append(f"Insufficient {name}")
    return reasons


def _claims(pod: PodToPlace, volumes: Volumes) -> tuple[list[Mapping[str, Any]], str | None]:
    """The bound volumes of the pod's claims, or the PreFilter message that rejects the pod."""
    bound = []
    for volume in pod.spec.get("volumes") or []:
        source = volume.get("persistentVolumeClaim")
        if not source:
            continue
        claim = volumes.claims.get((pod.namespace, source["claimName"]))
        if claim is None:
            return [], f'persistentvolumeclaim "{source["claimName"]}" not found'
        volume_name = (claim.get("spec") or {}).get("volumeName")
        pv = volumes.volumes.get(volume_name) if volume_name else None
        if pv is None:
            return [], REASON_UNBOUND_CLAIMS
        bound.append(pv)
    return bound, None


def _volume_binding(bound: Sequence[Mapping[str, Any]], node: Node) -> list[str]:
    for pv in bound:
        required = ((pv.get("spec") or {}).get("nodeAffinity") or {}).get("required")
        if required is not None and not node_selector_terms_match(required.get("nodeSelectorTerms") or [], node):
            return [REASON_VOLUME_CONFLICT]
    return []


def _volume_zone(bound: Sequence[Mapping[str, Any]], node: Node) -> list[str]:
    for pv in bound:
        labels = (pv.get("metadata") or {}).get("labels") or {}
        for key in (*ZONE_LABELS, *REGION_LABELS):
            if key in labels and node.labels.get(key) not in set(labels[key].split("__")):
                return [REASON_VOLUME_ZONE]
    return []


def _inter_pod_affinity(pod: PodToPlace, node: Node, nodes: Sequence[Node]) -> list[str]:
    affinity = pod.spec.get("affinity")
    for other in nodes:
        for bound in other.pods:
            for term in bound.anti_affinity:
                key = term.get("topologyKey", "")
                if (
                    key in node.labels
                    and other.labels.get(key) == node.labels[key]
                    and _term_matches(term, bound.namespace, pod)
                ):
                    return [REASON_EXISTING_ANTI_AFFINITY]
    for term in _required(affinity, "podAffinity"):
        key = term.get("topologyKey", "")
        peers = [
            b
            for other in nodes
            if key in node.labels and other.labels.get(key) == node.labels[key]
            for b in other.pods
            if _term_matches(term, pod.namespace, b)
        ]
        anywhere = any(_term_matches(term, pod.namespace, b) for other in nodes for b in other.pods)
        # The first pod of a group may land anywhere when it matches its own term (filtering.go).
        if not peers and (anywhere or not _term_matches(term, pod.namespace, pod)):
            return [REASON_AFFINITY]
    for term in _required(affinity, "podAntiAffinity"):
        key = term.get("topologyKey", "")
        if key not in node.labels:
            continue
        for other in nodes:
            if other.labels.get(key) != node.labels[key]:
                continue
            if any(_term_matches(term, pod.namespace, b) for b in other.pods):
                return [REASON_ANTI_AFFINITY]
    return []


def check_supported(pod: PodToPlace) -> None:
    spec = pod.spec
    for constraint in spec.get("topologySpreadConstraints") or []:
        if constraint.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule":
            raise UnsupportedPodError(
                f"pod {pod.name}: topologySpreadConstraints with whenUnsatisfiable DoNotSchedule is not modelled"
            )
    if spec.get("schedulingGates"):
        raise UnsupportedPodError(f"pod {pod.name}: spec.schedulingGates is not modelled")
    if spec.get("resourceClaims"):
        raise UnsupportedPodError(f"pod {pod.name}: spec.resourceClaims (dynamic resources) is not modelled")


def filter_node(
    pod: PodToPlace,
    node: Node,
    *,
    requests: Mapping[str, int],
    bound_volumes: Sequence[Mapping[str, Any]],
    nodes: Sequence[Node],
) -> list[str]:
    """The reasons of the first filter plugin that rejects `node`, or [] when the pod fits."""
    wanted_node = pod.spec.get("nodeName")
    if wanted_node and wanted_node != node.name:
        return [REASON_NODE_NAME]
    for reasons in (
        _taint_toleration(pod, node),
        _node_affinity(pod, node),
        _node_ports(pod, node),
        _resources_fit(requests, node),
        _volume_binding(bound_volumes, node),
        _volume_zone(bound_volumes, node),
        _inter_pod_affinity(pod, node, nodes),
    ):
        if reasons:
            return reasons
    return []


def fit_error(node_count: int, reasons: Mapping[str, Sequence[str]], prefilter: str | None = None) -> str:
    """FitError.Error() without the PostFilter (preemption) part."""
    message = f"0/{node_count} nodes are available:"
    if prefilter:
        return f"{message} {prefilter}."
    histogram = Counter(r for node_reasons in reasons.values() for r in node_reasons)
    parts = sorted(f"{count} {reason}" for reason, count in histogram.items())
    if parts:
        message += f" {', '.join(parts)}."
    return message


def _least_allocated(requests: Mapping[str, int], node: Node) -> float:
    used = node.requested()
    score = 0.0
    for name in (CPU, MEMORY):
        capacity = node.allocatable.get(name, 0)
        if capacity:
            score += (capacity - used.get(name, 0) - requests.get(name, 0)) / capacity
    return score / 2


def schedule(pod: PodToPlace, nodes: Sequence[Node], volumes: Volumes) -> Scheduled | Unschedulable:
    """Where kube-scheduler would bind `pod` now, or why it stays Pending."""
    check_supported(pod)
    requests = pod_requests(pod.spec)
    bound, prefilter = _claims(pod, volumes)
    if prefilter:
        return Unschedulable(fit_error(len(nodes), {}, prefilter), {n.name: (prefilter,) for n in nodes})
    reasons: dict[str, tuple[str, ...]] = {}
    feasible: list[Node] = []
    for node in nodes:
        found = filter_node(pod, node, requests=requests, bound_volumes=bound, nodes=nodes)
        if found:
            reasons[node.name] = tuple(found)
        else:
            feasible.append(node)
    if not feasible:
        return Unschedulable(fit_error(len(nodes), reasons), reasons)
    best = max(feasible, key=lambda n: _least_allocated(requests, n))
    return Scheduled(best)


def bind(pod: PodToPlace, node: Node) -> BoundPod:
    """Records the pod on the node (kube-scheduler's assume + bind)."""
    bound = BoundPod(
        name=pod.name,
        namespace=pod.namespace,
        labels=dict(pod.labels),
        requests=pod_requests(pod.spec),
        ports=host_ports(pod.spec),
        anti_affinity=_required(pod.spec.get("affinity"), "podAntiAffinity"),
    )
    node.pods.append(bound)
    return bound
