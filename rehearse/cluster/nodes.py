"""The nodes of an environment's cluster, built from infra/spec alone (nothing re-typed here).

- The system node group at its desired size; the GPU groups at the counts asked for (`--nodes
  GROUP=N`, default 0: every On-Demand GPU group deploys at desired 0). N may not exceed the group's
  max_size (the node group's Auto Scaling group would not launch more).
- Zones: a GPU group lives in the environment's GPU zone (one subnet, infra/nodegroups/efa.py). The
  system group spans every private subnet (infra/stage.py), and its Auto Scaling group launches each
  new instance in the enabled zone with the fewest instances, keeping the zones balanced (EC2 Auto
  Scaling user guide, "Rebalancing activities" and "Instance distribution across Availability
  Zones"); ties are taken in the order of the VPC's zones (the subnets' order), so node i of the
  system group is in zone i mod (number of zones).
- Names as EKS gives them (the EC2 private DNS name `ip-a-b-c-d.<region>.compute.internal`, with the
  address counted up from the zone's private subnet, infra/spec/addressing.py subnet_plan), plus a
  short alias `<group>-<i>` for --kill-node.
- Labels: what the kubelet and EKS set (kubernetes.io/hostname, kubernetes.io/os, kubernetes.io/arch,
  node.kubernetes.io/instance-type, topology.kubernetes.io/zone and region,
  eks.amazonaws.com/nodegroup, eks.amazonaws.com/capacityType) and the node group's own labels
  (infra/spec/scheduling.py); taints: the GPU taint on GPU groups.
- Allocatable: infra/spec/kubelet.py (the AL2023 reservation and maxPods); nvidia.com/gpu from the
  instance's GPUs where the NVIDIA device plugin is installed, vpc.amazonaws.com/efa from the group's
  EFA interfaces where the EFA device plugin is. Hugepages and ephemeral storage are not modelled
  (a pod that requests them is refused, exit 2).
- The add-on pods (infra/spec/addon_pods.py) the environment installs: one per DaemonSet on each node
  it selects, and the Deployments' replicas on the system nodes, placed as kube-scheduler would:
  replicas of one Deployment spread over nodes (the default topology spreading on hostnames), then
  the node with the most free cpu and memory (LeastAllocated), ties in node order.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field

from infra.spec import Environment, GpuNodeGroupConfig
from infra.spec.addon_pods import ADDON_PODS, AddOnPod, Where
from infra.spec.addressing import subnet_plan
from infra.spec.environments import CapacityKind
from infra.spec.errors import ConfigError
from infra.spec.instances import InstanceType
from infra.spec.kubelet import node_allocatable
from infra.spec.scheduling import (
    GPU_TAINT_EFFECT,
    GPU_TAINT_KEY,
    GPU_TAINT_VALUE,
    SYSTEM_NODE_SELECTOR,
    gpu_node_labels,
)
from k8s.queueing import group_nodes
from rehearse.cluster.scheduler import CPU, MEMORY, PODS, BoundPod, Node

GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
SYSTEM_GROUP = "system"
MIB = 2**20
# The first host addresses of a subnet are the VPC router, DNS and a reserved one (AWS reserves 5).
_FIRST_HOST = 10


@dataclass
class ClusterNode(Node):
    """A node of the rehearsal's cluster: the scheduler's view plus where it came from."""

    alias: str = ""
    group: str = ""
    instance_type: str = ""
    zone: str = ""
    ready: bool = True
    addon_pods: list[str] = field(default_factory=list)

    def daemonset_requests(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for pod in self.pods:
            if pod.name.startswith("ds/"):
                for k, v in pod.requests.items():
                    total[k] = total.get(k, 0) + v
        return total


def _enabled(pod: AddOnPod, env: Environment) -> bool:
    return pod.enabled_in(env.add_ons)


def _selects(pod: AddOnPod, node: ClusterNode) -> bool:
    gpu = node.group != SYSTEM_GROUP
    if pod.where is Where.ALL:
        return True
    if pod.where is Where.SYSTEM:
        return not gpu
    if pod.where is Where.GPU:
        return gpu
    return gpu and node.instance_type in pod.instance_types


def _bound(pod: AddOnPod, prefix: str) -> BoundPod:
    requests = {CPU: pod.cpu_millis, MEMORY: pod.memory_mib * MIB}
    return BoundPod(
        name=f"{prefix}/{pod.namespace}/{pod.name}",
        namespace=pod.namespace,
        labels={"app.kubernetes.io/name": pod.name},
        requests={k: v for k, v in requests.items() if v},
    )


def _node_name(address: ipaddress.IPv4Address, region: str) -> str:
    domain = "ec2.internal" if region == "us-east-1" else f"{region}.compute.internal"
    return f"ip-{str(address).replace('.', '-')}.{domain}"


def _allocatable(spec: InstanceType, gpu: GpuNodeGroupConfig | None, env: Environment) -> dict[str, int]:
    kubelet = node_allocatable(spec)
    allocatable = {CPU: kubelet.cpu_millis, MEMORY: kubelet.memory_mib * MIB, PODS: kubelet.max_pods}
    if gpu is not None and spec.gpu is not None and env.add_ons.nvidia_device_plugin:
        allocatable[GPU_RESOURCE] = spec.gpu.count
    if gpu is not None and env.add_ons.efa_device_plugin:
        allocatable[EFA_RESOURCE] = gpu.efa_interface_count
    return allocatable


def build_nodes(env: Environment, gpu_nodes: Mapping[str, int] | None = None) -> list[ClusterNode]:
    """The cluster of `env` with `gpu_nodes[group]` nodes in each GPU group (others at desired_size, as deployed:
    k8s/queueing.py group_nodes, which the rehearsal's Kueue quota follows too)."""
    groups = {g.name: g for g in env.gpu_node_groups}
    for name, count in (gpu_nodes or {}).items():
        if name not in groups:
            raise ConfigError("--nodes", name, sorted(groups), f"name a GPU node group of environment {env.name!r}")
        if not 0 <= count <= groups[name].scaling.max_size:
            raise ConfigError(
                f"--nodes {name}",
                count,
                f"0 to {groups[name].scaling.max_size} (the group's max_size)",
                "raise max_size in infra/spec/environments.py or ask for fewer nodes",
            )
    private = {az: ipaddress.IPv4Network(cidrs[1]) for az, cidrs in subnet_plan(env.network).items()}
    used: dict[str, int] = {}

    def make(group: str, index: int, zone: str, spec: InstanceType, gpu: GpuNodeGroupConfig | None) -> ClusterNode:
        used[zone] = used.get(zone, 0) + 1
        address = private[zone].network_address + _FIRST_HOST + used[zone]
        name = _node_name(address, env.region)
        capacity_type = "ON_DEMAND"
        if gpu is not None and gpu.capacity.kind is CapacityKind.CAPACITY_BLOCK:
            capacity_type = "CAPACITY_BLOCK"
        labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": spec.name,
            "topology.kubernetes.io/zone": zone,
            "topology.kubernetes.io/region": env.region,
            "eks.amazonaws.com/nodegroup": f"{env.cluster.name}-{group}",
            "eks.amazonaws.com/capacityType": capacity_type,
            **(dict(SYSTEM_NODE_SELECTOR) if gpu is None else gpu_node_labels(gpu.name, gpu.instance_type)),
        }
        taints = [] if gpu is None else [{"key": GPU_TAINT_KEY, "value": GPU_TAINT_VALUE, "effect": GPU_TAINT_EFFECT}]
        return ClusterNode(
            name=name,
            labels=labels,
            taints=taints,
            allocatable=_allocatable(spec, gpu, env),
            alias=f"{group}-{index}",
            group=group,
            instance_type=spec.name,
            zone=zone,
        )

    zones = env.network.availability_zones
    nodes = [
        make(SYSTEM_GROUP, i, zones[i % len(zones)], env.system_nodes.instance, None)
        for i in range(env.system_nodes.scaling.desired_size)
    ]
    counts = group_nodes(env, gpu_nodes)
    for group in env.gpu_node_groups:
        nodes += [
            make(group.name, i, env.gpu_availability_zone, group.instance, group) for i in range(counts[group.name])
        ]
    _place_addon_pods(env, nodes)
    return nodes


def _place_addon_pods(env: Environment, nodes: list[ClusterNode]) -> None:
    pods = [p for p in ADDON_PODS if _enabled(p, env)]
    for pod in pods:
        if pod.kind == "DaemonSet":
            for node in nodes:
                if _selects(pod, node):
                    node.pods.append(_bound(pod, "ds"))
                    node.addon_pods.append(pod.name)
    for pod in pods:
        if pod.kind != "Deployment":
            continue
        candidates = [n for n in nodes if _selects(pod, n)]
        for _ in range(pod.replicas):
            if not candidates:
                break

            def order(node: ClusterNode, pod: AddOnPod = pod) -> tuple[int, float]:
                free = node.free()
                score = (free[CPU] / node.allocatable[CPU] + free[MEMORY] / node.allocatable[MEMORY]) / 2
                return (node.addon_pods.count(pod.name), -score)

            target = min(candidates, key=order)
            target.pods.append(_bound(pod, "deploy"))
            target.addon_pods.append(pod.name)


def find_node(nodes: list[ClusterNode], text: str) -> ClusterNode:
    """A node by alias (`system-0`, `g6-1`) or name prefix."""
    for node in nodes:
        if text in (node.alias, node.name):
            return node
    matches = [n for n in nodes if n.name.startswith(text)]
    if len(matches) == 1:
        return matches[0]
    raise ConfigError(
        "--kill-node", text, [f"{n.alias} ({n.name})" for n in nodes], "name a node of the rehearsal's cluster"
    )
