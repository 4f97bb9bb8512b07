"""Kueue admission for the GPU workloads: the queue label, and the queue objects of an environment.

One ClusterQueue per GPU node group, each with two ResourceFlavors: `system` (the system nodes,
where Ray heads and KubeRay's submitter pods run) and `gpu-<group>` (that group's nodes). A
LocalQueue named after the group in every workload namespace points at the group's ClusterQueue.

Facts relied on (kubernetes-sigs/kueue v0.19.2):
- A job is managed when it carries `kueue.x-k8s.io/queue-name` in its metadata.labels (docs
  tasks/run/jobs.md, rayjobs.md, rayclusters.md "Queue selection"); with
  manageJobsWithoutQueueName false (the default) an unlabelled job is not managed and starts at once.
- The mutating webhooks set `spec.suspend: true` on a labelled batch/v1 Job, RayJob and RayCluster
  at creation (jobframework.ApplyDefaultForSuspend) and Kueue sets it to false on admission
  ("Kueue will unsuspend it by setting spec.suspend to false, regardless of its previous value").
- When admitting, Kueue evaluates each PodSet's nodeSelector and required node affinity against a
  flavor's nodeLabels; a flavor that does not match cannot be assigned to that PodSet. The assigned
  flavor's nodeLabels are added to the pods' nodeSelector and its tolerations to their tolerations
  (docs concepts/resource_flavor.md). Hence the `system` flavor: a Ray head pinned to the system
  nodes cannot take a GPU flavor, and with only a GPU flavor the RayJob would never be admitted.
  `system` is listed first so that a pod without a selector (KubeRay's submitter) lands on the
  system nodes instead of taking a bit of a GPU node; a GPU pod cannot take it (its GPU quota is 0
  and its nodeLabels contradict the GPU pods' role selector).
- Every resource a pod requests must be covered by the ClusterQueue, or the workload is
  inadmissible: cpu, memory, nvidia.com/gpu and vpc.amazonaws.com/efa are what the GPU pods request
  (k8s/ray_spec.py gpu_pod_parts).

The GPU quota covers the nodes that exist, not max_size (issue 22 #5): a workload admitted against
quota with no nodes behind it only waits out waitForPodsReady (20 min, four times) and is then
deactivated. At deploy a group's quota covers scaling.desired_size nodes; `trainctl scale` moves
the quota with the nodes (trainctl/queue_quota.py: lowered before a node group shrinks, raised
once the new nodes are usable), and `trainctl status` says when the two differ. Lowering
nominalQuota below what is admitted evicts nothing: the ClusterQueues here have no preemption
(apis/kueue/v1beta2/clusterqueue_types.go: preemption.withinClusterQueue defaults to Never) and
no eviction reason of Kueue v0.19.2 is a quota change
(site/content/en/docs/reference/metrics.md, kueue_evicted_workloads_total reasons); it only stops
new admissions until usage is back under it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infra.spec import Environment, GpuNodeGroupConfig
from infra.spec.errors import ConfigError
from infra.spec.namespaces import TRAINING_NAMESPACES
from infra.spec.scheduling import SYSTEM_NODE_SELECTOR, gpu_group_selector, gpu_toleration
from k8s.ray_spec import worker_resources

API_VERSION = "kueue.x-k8s.io/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# An autoscaling RayCluster is admitted only as an elastic job (ElasticJobsViaWorkloadSlices, Beta and on by default
# since 0.18): without this annotation Kueue's webhook rejects it ("a kueue-managed RayCluster can use autoscaling
# only as an elastic job", raycluster_webhook.go); each scale-up is then a new Workload slice admitted on its own.
ELASTIC_JOB_ANNOTATION = "kueue.x-k8s.io/elastic-job"
SYSTEM_FLAVOR = "system"
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
# In this order in every flavor of the resource group (Kueue requires the same list and order).
COVERED_RESOURCES = ("cpu", "memory", GPU_RESOURCE, EFA_RESOURCE)
# The namespaces whose workloads may use the GPU queues (the LocalQueues live there).
QUEUE_NAMESPACES = tuple(ns.name for ns in TRAINING_NAMESPACES)


def local_queue_name(group: str) -> str:
    """The LocalQueue of a GPU node group, in every workload namespace: the group's own name."""
    return group


def cluster_queue_name(group: str) -> str:
    return f"gpu-{group}"


def gpu_flavor_name(group: str) -> str:
    return f"gpu-{group}"


def queue_labels(environment: Environment, group: str) -> dict[str, str]:
    """metadata.labels that send a workload on GPU group `group` through its LocalQueue.

    Put them on the object Kueue manages: a batch/v1 Job's, a RayJob's or a RayCluster's own
    metadata (not the pod template; Kueue reads the job's label)."""
    names = [g.name for g in environment.gpu_node_groups]
    if group not in names:
        raise ConfigError(
            "queue group",
            group,
            names or "a GPU node group (the environment has none)",
            f"use one of {environment.name}'s GPU node groups",
        )
    return {QUEUE_LABEL: local_queue_name(group)}


@dataclass(frozen=True, kw_only=True)
class Quota:
    cpu: int
    memory_gib: int
    gpus: int
    efa: int

    def resources(self) -> list[dict[str, Any]]:
        values = (str(self.cpu), f"{self.memory_gib}Gi", str(self.gpus), str(self.efa))
        return [{"name": name, "nominalQuota": value} for name, value in zip(COVERED_RESOURCES, values, strict=True)]


def group_nodes(environment: Environment, scaled: Mapping[str, int] | None = None) -> dict[str, int]:
    """Each GPU group's node count: `scaled[group]` where `trainctl scale` set it, else
    scaling.desired_size (what `cdk deploy` launches, 0 for an On-Demand group without a block).

    The one source of the nodes a queue's quota covers: the Platform stack renders the queues
    with the deploy-time sizes, `trainctl scale` patches a group's quota to the nodes it brought up,
    and the cluster rehearsal (`--nodes g=N`) builds both its nodes and its queues from it."""
    scaled = dict(scaled or {})
    names = [g.name for g in environment.gpu_node_groups]
    for name in scaled:
        if name not in names:
            raise ConfigError("GPU group", name, names or "none", f"name a GPU node group of {environment.name}")
    return {g.name: scaled.get(g.name, g.scaling.desired_size) for g in environment.gpu_node_groups}


def gpu_quota(group: GpuNodeGroupConfig, nodes: int) -> Quota:
    """`nodes` whole nodes of the group, as the whole-node pods request them (k8s/ray_spec.py
    worker_resources): at most `nodes` whole-node pods are admitted at once."""
    instance = group.instance
    assert instance.gpu is not None  # GPU groups are validated on construction
    if not 0 <= nodes <= group.scaling.max_size:
        raise ConfigError(
            f"quota nodes of {group.name}",
            nodes,
            f"0 to the group's max_size ({group.scaling.max_size})",
            "a queue cannot cover more nodes than the group can hold",
        )
    size = worker_resources(instance)
    return Quota(
        cpu=int(size.cpu) * nodes,
        memory_gib=int(size.memory.removesuffix("Gi")) * nodes,
        gpus=instance.gpu.count * nodes,
        efa=group.efa_interface_count * nodes,
    )


def quota_nodes(group: GpuNodeGroupConfig, gpus: int) -> int:
    """How many of the group's whole nodes a GPU quota of `gpus` covers (rounded down)."""
    assert group.instance.gpu is not None
    return gpus // group.instance.gpu.count


def system_quota(environment: Environment) -> Quota:
    """The system nodes at max_size, for Ray heads and submitters. Each GPU queue gets all of it:
    these pods are small and never whole-node, the kube-scheduler packs them, and a head that
    cannot be placed is caught by waitForPodsReady (evicted and requeued), so Kueue need not
    split the system nodes between the groups."""
    system = environment.system_nodes
    nodes = system.scaling.max_size
    return Quota(cpu=system.instance.vcpus * nodes, memory_gib=system.instance.memory_gib * nodes, gpus=0, efa=0)


def _metadata(name: str, environment: Environment, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "labels": {"app.kubernetes.io/managed-by": "ml-platform", "platform/environment": environment.name},
    }
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def resource_flavors(environment: Environment) -> list[dict[str, Any]]:
    system = {
        "apiVersion": API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": _metadata(SYSTEM_FLAVOR, environment),
        "spec": {"nodeLabels": dict(SYSTEM_NODE_SELECTOR)},
    }
    gpus = [
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceFlavor",
            "metadata": _metadata(gpu_flavor_name(g.name), environment),
            # tolerations are added to the admitted pods (resource_flavor.md); the GPU pods bring
            # their own too, so this only matters for a pod that forgot it.
            "spec": {"nodeLabels": gpu_group_selector(g.name), "tolerations": [gpu_toleration()]},
        }
        for g in environment.gpu_node_groups
    ]
    return [system, *gpus]


def cluster_queue(environment: Environment, group: GpuNodeGroupConfig, nodes: int) -> dict[str, Any]:
    """The group's ClusterQueue, its GPU flavor's quota covering `nodes` whole nodes."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ClusterQueue",
        "metadata": _metadata(cluster_queue_name(group.name), environment),
        "spec": {
            # Null admits no namespace at all (ClusterQueue CRD, namespaceSelector).
            "namespaceSelector": {
                "matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "In", "values": list(QUEUE_NAMESPACES)}
                ]
            },
            # Every workload here is a gang of whole nodes: with BestEffortFIFO a one-node job
            # may overtake a pending two-node job for as long as one node keeps freeing up.
            "queueingStrategy": "StrictFIFO",
            "resourceGroups": [
                {
                    "coveredResources": list(COVERED_RESOURCES),
                    "flavors": [
                        {"name": SYSTEM_FLAVOR, "resources": system_quota(environment).resources()},
                        {"name": gpu_flavor_name(group.name), "resources": gpu_quota(group, nodes).resources()},
                    ],
                }
            ],
        },
    }


def local_queues(environment: Environment, group: GpuNodeGroupConfig) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "LocalQueue",
            "metadata": _metadata(local_queue_name(group.name), environment, namespace),
            "spec": {"clusterQueue": cluster_queue_name(group.name)},
        }
        for namespace in QUEUE_NAMESPACES
    ]


def queue_objects(environment: Environment, scaled: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
    """Flavors first, then per group its ClusterQueue and LocalQueues (the order they can be applied in).

    Each group's quota covers its nodes (group_nodes): as deployed without `scaled`."""
    nodes = group_nodes(environment, scaled)
    objects = resource_flavors(environment)
    for group in environment.gpu_node_groups:
        objects += [cluster_queue(environment, group, nodes[group.name]), *local_queues(environment, group)]
    return objects
