"""Whether the pods the workloads put on the system nodes (Ray heads, KubeRay's submitters) always get a node.

Kueue's `system` flavor counts the system nodes' cpu and memory as one pool (k8s/queueing.py system_quota) and knows
nothing of zones or volume affinity, so it admits workloads whose system pods kube-scheduler cannot place; such a pod
stays Pending and, with waitForPodsReady's blockAdmission, holds every queue (issue 22 #1). This check runs at synth
over every workload the environment's manifests hold, since any of them may run at the same time.

The model, each part chosen so that a pass here means a pass on the cluster:
- the nodes: the system group at its min_size (fewer nodes than it deploys with, never more), node i in zone i mod
  (number of zones), as the Auto Scaling group balances its zones (rehearse/cluster/nodes.py cites the EC2 Auto
  Scaling guide); a pod that mounts the zone-pinned checkpoint claim may use only the nodes in the GPU zone;
- each node's room: its allocatable (infra/spec/kubelet.py) less the add-on DaemonSets that run on it and every
  replica of every add-on Deployment on the system nodes, as though all had landed on this node (infra/spec/
  addon_pods.py);
- the scheduler as an adversary: a pod fails when some placement of the other pods, each on a node it may use and
  within that node's room, leaves no node with room for it. Any order and any scoring kube-scheduler uses is one
  such placement.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from infra.spec.addon_pods import ADDON_PODS, Where
from infra.spec.environments import Environment
from infra.spec.errors import ConfigError
from infra.spec.kubelet import node_allocatable

# Above this many placements to try, every pod must fit on each node together with all the others (a stricter test
# that needs no search).
_SEARCH_LIMIT = 100_000


@dataclass(frozen=True, kw_only=True)
class SystemPod:
    """A workload pod on the system nodes, with its effective requests (containers and sidecars summed)."""

    name: str
    cpu_millis: int
    memory_mib: int
    # Mounts a claim whose volume is pinned to the GPU zone (the FSx checkpoint claim).
    zone_pinned: bool = False


@dataclass(frozen=True)
class Room:
    cpu_millis: int
    memory_mib: int

    def holds(self, pods: Sequence[SystemPod]) -> bool:
        return sum(p.cpu_millis for p in pods) <= self.cpu_millis and sum(p.memory_mib for p in pods) <= self.memory_mib


def system_node_room(environment: Environment) -> Room:
    """What one system node has left for workload pods when every add-on Deployment's replicas are on it."""
    allocatable = node_allocatable(environment.system_nodes.instance)
    cpu, memory = allocatable.cpu_millis, allocatable.memory_mib
    for pod in ADDON_PODS:
        if not pod.enabled_in(environment.add_ons):
            continue
        on_system = pod.where in (Where.ALL, Where.SYSTEM)
        if pod.kind == "DaemonSet" and on_system:
            cpu, memory = cpu - pod.cpu_millis, memory - pod.memory_mib
        elif pod.kind == "Deployment" and on_system:
            cpu, memory = cpu - pod.cpu_millis * pod.replicas, memory - pod.memory_mib * pod.replicas
    return Room(cpu_millis=cpu, memory_mib=memory)


def system_node_zones(environment: Environment) -> list[str]:
    """The zone of each system node when the group runs at its min_size."""
    zones = environment.network.availability_zones
    return [zones[i % len(zones)] for i in range(environment.system_nodes.scaling.min_size)]


def _candidates(environment: Environment, pod: SystemPod, zones: list[str]) -> list[int]:
    return [i for i, zone in enumerate(zones) if not pod.zone_pinned or zone == environment.gpu_availability_zone]


def _blocking_placement(
    environment: Environment, pods: Sequence[SystemPod], index: int, zones: list[str], room: Room
) -> dict[int, list[SystemPod]] | None:
    """A placement of the pods other than pods[index] that leaves it no node; None when there is none."""
    pod = pods[index]
    others = [p for i, p in enumerate(pods) if i != index]
    nodes = _candidates(environment, pod, zones)
    choices = [[None, *_candidates(environment, other, zones)] for other in others]
    if not nodes:
        return {}
    combinations = 1
    for choice in choices:
        combinations *= len(choice)
    if combinations > _SEARCH_LIMIT:
        return None if room.holds(pods) else {nodes[0]: others}
    for placement in itertools.product(*choices):
        load: dict[int, list[SystemPod]] = {i: [] for i in range(len(zones))}
        for other, node in zip(others, placement, strict=True):
            if node is not None:
                load[node].append(other)
        if not all(room.holds(placed) for placed in load.values()):
            continue
        if not any(room.holds([*load[n], pod]) for n in nodes):
            return {n: placed for n, placed in load.items() if placed}
    return None


def check_system_pods_fit(environment: Environment, pods: Sequence[SystemPod]) -> None:
    """Refuses the environment when some placement of `pods` on its system nodes leaves one of them Pending."""
    zones = system_node_zones(environment)
    room = system_node_room(environment)
    instance = environment.system_nodes.instance_type
    for index, pod in enumerate(pods):
        blocking = _blocking_placement(environment, pods, index, zones, room)
        if blocking is None:
            continue
        where = (
            f"the {len(_candidates(environment, pod, zones))} system node(s) in {environment.gpu_availability_zone} "
            "(it mounts the zone-pinned checkpoint claim)"
            if pod.zone_pinned
            else f"the {len(zones)} system node(s)"
        )
        taken = "; ".join(
            f"node {n} ({zones[n]}) holds {', '.join(p.name for p in placed)}" for n, placed in blocking.items()
        )
        when = f"stays Pending when {taken}" if taken else "does not fit there even alone"
        raise ConfigError(
            f"{environment.name}.system_nodes",
            f"{environment.system_nodes.scaling.min_size} x {instance}",
            f"system nodes on which every workload pod that may run at the same time gets a node: {pod.name} "
            f"({pod.cpu_millis}m, {pod.memory_mib}Mi) may use {where}, each with {room.cpu_millis}m and "
            f"{room.memory_mib}Mi after the add-on pods, and {when}",
            "raise system_nodes.scaling.min_size or pick a larger system_nodes.instance_type in "
            "infra/spec/environments.py, or run fewer of those workloads on the environment",
        )
