"""A GPU group's Kueue quota beside its nodes: read it, set it, plan the order, say when they differ.

The ClusterQueue gpu-<group> (k8s/queueing.py) should cover the nodes that exist (issue 22 #5): a
workload admitted against quota that has no node behind it waits out waitForPodsReady (20 min, four
times) and is then deactivated. At deploy the quota covers scaling.desired_size nodes; `trainctl
scale` moves it with the node group, in an order that never leaves the quota above the nodes:

- shrinking: the quota first, then the node group. Kueue admits nothing onto the nodes that are
  about to go; lowering nominalQuota evicts nothing already admitted (k8s/queueing.py).
- growing: the node group first, then the quota, once the new nodes are usable (Ready with their
  GPUs, EFA interfaces and device plugins; when --wait runs out, the quota covers the usable ones).

Between the two steps the quota is below the nodes (a node idles for the minutes of the wait), never
above. What can still put it above: a `cdk deploy` that resets the node group's desired size
(scaling config changed), or nodes lost later; `trainctl status` compares the two and names the fix.

The quota is set with a JSON merge patch of spec.resourceGroups (custom resources take no strategic
merge patch), written whole from k8s/queueing.py cluster_queue, so it matches what CDK applies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from infra.spec import Environment, GpuNodeGroupConfig
from k8s.queueing import API_VERSION, GPU_RESOURCE, cluster_queue, cluster_queue_name, gpu_flavor_name, quota_nodes
from trainctl.eks_auth import ConnectError
from trainctl.kube import KubeError, api_errors

GROUP, VERSION = API_VERSION.split("/")
PLURAL = "clusterqueues"


@dataclass(frozen=True)
class QueueQuota:
    queue: str
    nodes: int | None
    """Whole nodes of the group its GPU flavor's nvidia.com/gpu quota covers; None when the queue or the
    flavor is not there."""
    missing: str | None = None
    """Why `nodes` is None."""


def gpu_quota_text(queue: dict[str, Any], flavor: str) -> str | None:
    """The nominalQuota of nvidia.com/gpu in `flavor` of a ClusterQueue object, as written."""
    for group in (queue.get("spec") or {}).get("resourceGroups") or []:
        for entry in group.get("flavors") or []:
            if entry.get("name") != flavor:
                continue
            for resource in entry.get("resources") or []:
                if resource.get("name") == GPU_RESOURCE:
                    return str(resource.get("nominalQuota"))
    return None


def read_quota(api: Any, group: GpuNodeGroupConfig, *, timeout: float) -> QueueQuota:
    """The group's ClusterQueue quota in nodes (KubeError: the API could not be asked)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    name = cluster_queue_name(group.name)
    with api_errors(f"get clusterqueue {name}"):
        try:
            queue = client.CustomObjectsApi(api).get_cluster_custom_object(
                GROUP, VERSION, PLURAL, name, _request_timeout=timeout
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            return QueueQuota(name, None, f"ClusterQueue {name} does not exist (is the Platform stack deployed?)")
    text = gpu_quota_text(queue, gpu_flavor_name(group.name))
    if text is None:
        return QueueQuota(name, None, f"ClusterQueue {name} has no {GPU_RESOURCE} quota in flavor {group.name}")
    try:
        gpus = int(text)
    except ValueError:
        return QueueQuota(name, None, f"ClusterQueue {name}: {GPU_RESOURCE} nominalQuota {text!r} is not a count")
    return QueueQuota(name, quota_nodes(group, gpus))


def write_quota(api: Any, env: Environment, group: GpuNodeGroupConfig, nodes: int, *, timeout: float) -> None:
    """Set the group's ClusterQueue quota to `nodes` whole nodes (KubeError: refused or unreachable)."""
    from kubernetes import client

    name = cluster_queue_name(group.name)
    patch = {"spec": {"resourceGroups": cluster_queue(env, group, nodes)["spec"]["resourceGroups"]}}
    with api_errors(f"patch clusterqueue {name}"):
        client.CustomObjectsApi(api).patch_cluster_custom_object(
            GROUP, VERSION, PLURAL, name, patch, _request_timeout=timeout
        )


def plan(current: int, target: int) -> tuple[int | None, bool]:
    """(lower to this before the node group changes, or None; set to the usable nodes after them), for a
    quota covering `current` nodes and a group going to `target` nodes."""
    return (target if current > target else None), target > 0


class QuotaSync:
    """The group's quota around one `trainctl scale` to `target` nodes (the order in the module docstring).

    `connect`: the Kubernetes API client for the environment; `before` opens and closes its own, `after`
    takes the one the node wait uses. Nothing is done where the environment has no Kueue."""

    def __init__(
        self,
        env: Environment,
        group: GpuNodeGroupConfig,
        target: int,
        connect: Callable[[Environment], Any] | None,
        *,
        timeout: float,
        say: Callable[[str], None],
    ) -> None:
        self.env, self.group, self.target = env, group, target
        self.connect, self.timeout, self.say = connect, timeout, say
        self.queue: str | None = None
        self.nodes_before: int | None = None
        self.nodes_after: int | None = None
        self._raise_after = False

    def before(self) -> str | None:
        """Read the quota and lower it when the group shrinks; what went wrong (nothing changed), or None."""
        if not self.env.add_ons.kueue:
            return None
        if self.connect is None:
            return "the Kubernetes API is needed to move the group's Kueue quota with its nodes"
        try:
            api = self.connect(self.env)
        except ConnectError as exc:
            return str(exc)
        try:
            quota = read_quota(api, self.group, timeout=self.timeout)
            self.queue = quota.queue
            if quota.nodes is None:
                return f"{quota.missing}; nothing changed"
            self.nodes_before = self.nodes_after = quota.nodes
            lower, self._raise_after = plan(quota.nodes, self.target)
            if lower is not None:
                self.say(f"lowering the Kueue quota of {quota.queue} from {quota.nodes} to {lower} node(s) first")
                write_quota(api, self.env, self.group, lower, timeout=self.timeout)
                self.nodes_after = lower
        except KubeError as exc:
            return f"{exc}; the node group was not changed"
        finally:
            close = getattr(api, "close", None)
            if close is not None:
                close()
        return None

    def after(self, api: Any, usable: int) -> None:
        """Once the nodes were waited for: the quota covers the usable ones (at most `target`)."""
        if not self._raise_after:
            return
        nodes = min(self.target, usable)
        if nodes != self.nodes_after:
            self.say(f"setting the Kueue quota of {self.queue} to the {nodes} usable node(s)")
            write_quota(api, self.env, self.group, nodes, timeout=self.timeout)
            self.nodes_after = nodes

    def summary(self) -> str | None:
        if self.queue is None or self.nodes_before is None:
            return None
        return f"Kueue quota of {self.queue}: {self.nodes_before} -> {self.nodes_after} node(s)"

    def to_json(self) -> dict[str, Any] | None:
        if self.queue is None:
            return None
        return {"cluster_queue": self.queue, "nodes_before": self.nodes_before, "nodes_after": self.nodes_after}


def difference(
    env: Environment, group: GpuNodeGroupConfig, quota: QueueQuota, usable: int, registered: int
) -> str | None:
    """None when the quota covers exactly the usable nodes; else what differs, what it costs, and the fix
    (`trainctl scale` to the nodes there now: it keeps them and sets the quota to the usable ones)."""
    scale = f"`trainctl scale --env {env.name} --group {group.name} --nodes {registered}`"
    if quota.nodes is None:
        return f"{quota.missing}: nothing is admitted onto {group.name}; {scale} sets the quota to the usable nodes"
    if quota.nodes == usable:
        return None
    if quota.nodes > usable:
        return (
            f"{quota.queue} covers {quota.nodes} node(s) but {usable} are usable: a gang admitted onto the missing "
            f"ones stays Pending until waitForPodsReady evicts it (20 min, four times, then deactivated); "
            f"{scale} sets the quota to the usable nodes"
        )
    return (
        f"{quota.queue} covers {quota.nodes} node(s) of {usable} usable: Kueue admits nothing onto the other "
        f"{usable - quota.nodes} (a Platform deploy resets the quota to desired_size); {scale} raises it"
    )
