"""Whether a GPU node group's nodes can run whole-node GPU and EFA pods: the nodes EKS labelled with the
group's name, their Ready condition, allocatable nvidia.com/gpu and vpc.amazonaws.com/efa against the
instance facts, the gate's taint, and the NVIDIA and EFA device-plugin pods on each (`trainctl scale` waits
on it). Reads the Kubernetes API only."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infra.spec import Environment, GpuNodeGroupConfig
from infra.spec.versions import HELM_CHARTS
from trainctl import gate_taints
from trainctl.eks_auth import DEFAULT_REQUEST_TIMEOUT_S
from trainctl.kube import api_errors

NODEGROUP_LABEL = "eks.amazonaws.com/nodegroup"
"""EKS puts this label, with the node group's name, on every node of a managed node group."""
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
POLL_S = 10.0


@dataclass(frozen=True)
class Plugin:
    """A device-plugin DaemonSet, found by the labels its Helm chart puts on its pods."""

    name: str
    selector: str
    resource: str


# infra/addons/helm.py installs each chart with release name = chart name (HELM_CHARTS keys).
# nvidia-device-plugin (templates/_helpers.tpl "templateLabels"): app.kubernetes.io/name and
# app.kubernetes.io/instance; its GFD and MPS DaemonSets carry other names.
# aws-efa-k8s-device-plugin (templates/daemonset.yaml): `name: <fullname>`, which is the release name
# when it contains the chart name.
_NVIDIA = "nvidia-device-plugin"
_EFA = "aws-efa-k8s-device-plugin"
assert _NVIDIA in HELM_CHARTS
assert _EFA in HELM_CHARTS
NVIDIA_PLUGIN = Plugin(_NVIDIA, f"app.kubernetes.io/name={_NVIDIA},app.kubernetes.io/instance={_NVIDIA}", GPU_RESOURCE)
EFA_PLUGIN = Plugin(_EFA, f"name={_EFA}", EFA_RESOURCE)


@dataclass(frozen=True)
class NodeView:
    name: str
    ready: bool
    ready_reason: str
    allocatable: Mapping[str, str]
    taints: tuple[str, ...]


@dataclass(frozen=True)
class PodView:
    name: str
    namespace: str
    node: str | None
    """spec.nodeName, or (unscheduled) the node its DaemonSet pinned it to."""
    phase: str
    ready: bool
    unscheduled: str | None
    """The PodScheduled=False condition's reason and message."""


def _conditions(obj: Any) -> dict[str, Any]:
    status = obj.status
    return {c.type: c for c in ((status.conditions if status is not None else None) or [])}


def _node_view(item: Any) -> NodeView:
    ready = _conditions(item).get("Ready")
    taints = tuple(f"{t.key}={t.value or ''}:{t.effect}" for t in (item.spec.taints or []))
    return NodeView(
        name=item.metadata.name,
        ready=ready is not None and ready.status == "True",
        ready_reason="no Ready condition yet"
        if ready is None
        else f"Ready={ready.status} ({ready.reason or '-'}: {ready.message or '-'})",
        allocatable=dict((item.status.allocatable if item.status is not None else None) or {}),
        taints=taints,
    )


def _pinned_node(item: Any) -> str | None:
    """The node a DaemonSet pod is for: the controller pins it with a required node affinity on the
    field metadata.name (Kubernetes docs, DaemonSet, "How Daemon Pods are scheduled"), not nodeName."""
    if item.spec.node_name:
        return str(item.spec.node_name)
    affinity = item.spec.affinity
    required = affinity.node_affinity.required_during_scheduling_ignored_during_execution if affinity else None
    if affinity is None or affinity.node_affinity is None or required is None:
        return None
    for term in required.node_selector_terms or []:
        for expression in term.match_fields or []:
            if expression.key == "metadata.name" and expression.operator == "In" and expression.values:
                return str(expression.values[0])
    return None


def _pod_view(item: Any) -> PodView:
    conditions = _conditions(item)
    scheduled = conditions.get("PodScheduled")
    ready = conditions.get("Ready")
    unscheduled = None
    if scheduled is not None and scheduled.status == "False":
        unscheduled = f"{scheduled.reason or 'Unschedulable'}: {scheduled.message or '-'}"
    return PodView(
        name=item.metadata.name,
        namespace=item.metadata.namespace,
        node=_pinned_node(item),
        phase=(item.status.phase if item.status is not None else None) or "Unknown",
        ready=ready is not None and ready.status == "True",
        unscheduled=unscheduled,
    )


def list_nodes(api: Any, selector: str, *, timeout: float) -> list[NodeView]:
    from kubernetes import client

    with api_errors(f"list nodes -l {selector}"):
        items = client.CoreV1Api(api).list_node(label_selector=selector, _request_timeout=timeout)
    return sorted((_node_view(item) for item in items.items), key=lambda n: n.name)


def list_plugin_pods(api: Any, plugin: Plugin, *, timeout: float) -> list[PodView]:
    from kubernetes import client

    with api_errors(f"list pods -A -l {plugin.selector}"):
        items = client.CoreV1Api(api).list_pod_for_all_namespaces(
            label_selector=plugin.selector, _request_timeout=timeout
        )
    return [_pod_view(item) for item in items.items]


@dataclass(frozen=True)
class Expectation:
    nodes: int
    gpus: int
    efa: int
    plugins: tuple[Plugin, ...]


def expectation(env: Environment, group: GpuNodeGroupConfig, nodes: int) -> Expectation:
    """What each of `nodes` nodes of the group must advertise and run to be usable."""
    plugins = tuple(
        plugin
        for plugin, enabled in (
            (NVIDIA_PLUGIN, env.add_ons.nvidia_device_plugin),
            (EFA_PLUGIN, env.add_ons.efa_device_plugin),
        )
        if enabled
    )
    gpu = group.instance.gpu
    assert gpu is not None  # GpuNodeGroupConfig validates it
    return Expectation(nodes=nodes, gpus=gpu.count, efa=group.efa_interface_count, plugins=plugins)


def node_problems(node: NodeView, expected: Expectation, pods: Mapping[str, Sequence[PodView]]) -> list[str]:
    """What keeps one node from running a whole-node GPU+EFA pod; empty when nothing does."""
    problems = gate_taints.problems(node.name, node.taints)
    if not node.ready:
        problems.append(f"not Ready: {node.ready_reason}")
    for resource, want in ((GPU_RESOURCE, expected.gpus), (EFA_RESOURCE, expected.efa)):
        seen = node.allocatable.get(resource)
        if seen != str(want):
            problems.append(f"{resource} allocatable {seen or 'absent'}, expected {want}")
    for plugin in expected.plugins:
        mine = [p for p in pods.get(plugin.name, ()) if p.node == node.name]
        if not mine:
            taints = ", ".join(node.taints) or "none"
            problems.append(
                f"no {plugin.name} pod for this node (its DaemonSet does not select it: compare its nodeSelector "
                f"and tolerations with the node's labels and taints: {taints})"
            )
        elif not any(p.ready for p in mine):
            pod = mine[0]
            why = f"not scheduled: {pod.unscheduled}" if pod.unscheduled else f"{pod.phase}, not Ready"
            problems.append(f"{plugin.name} pod {pod.namespace}/{pod.name} {why}")
    return problems


@dataclass
class NodeReport:
    nodes: list[NodeView] = field(default_factory=list)
    problems: dict[str, list[str]] = field(default_factory=dict)
    missing: int = 0
    """Nodes not launched (or not yet registered) of the N wanted."""

    @property
    def usable(self) -> list[str]:
        return [n.name for n in self.nodes if not self.problems.get(n.name)]


def survey(api: Any, selector: str, expected: Expectation, *, timeout: float) -> NodeReport:
    nodes = list_nodes(api, selector, timeout=timeout)
    pods = {plugin.name: list_plugin_pods(api, plugin, timeout=timeout) for plugin in expected.plugins}
    report = NodeReport(nodes=nodes)
    for node in nodes:
        report.problems[node.name] = node_problems(node, expected, pods)
    report.missing = max(0, expected.nodes - len(nodes))
    return report


def wait_for_nodes(
    api: Any,
    selector: str,
    expected: Expectation,
    *,
    wait_s: float,
    poll_s: float = POLL_S,
    timeout: float = DEFAULT_REQUEST_TIMEOUT_S,
    say: Callable[[str], None] = lambda message: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[bool, NodeReport]:
    """(True, report) once N nodes are usable; (False, the last report) when `wait_s` runs out."""
    deadline = clock() + wait_s
    last_line = ""
    while True:
        report = survey(api, selector, expected, timeout=timeout)
        if len(report.usable) >= expected.nodes:
            return True, report
        line = f"{len(report.usable)} of {expected.nodes} node(s) usable, {len(report.nodes)} registered"
        if line != last_line:
            say(f"waiting: {line}")
            last_line = line
        if clock() >= deadline:
            return False, report
        sleep(min(poll_s, max(0.0, deadline - clock())))
