"""Kueue on the system nodes: admission for the GPU workloads, all-or-nothing, one queue per GPU group.

Facts (kubernetes-sigs/kueue at tag v0.19.2 unless said otherwise):
- The chart is published only as an OCI artifact (charts/kueue/README.md; infra/spec/versions.py).
  Its CRDs are templates (charts/kueue/templates/crd/), so they arrive with the release.
- The manager reads one Configuration document, the chart value
  managerConfig.controllerManagerConfigYaml (charts/kueue/values.yaml); a value given there replaces
  the chart's whole document, so the chart's defaults for health, metrics, webhook, leader election,
  controller concurrency and client connection are repeated here.
- integrations.frameworks names the job kinds Kueue manages: "batch/job", "ray.io/rayjob",
  "ray.io/raycluster" are the ones the workloads here use (values.yaml lists them).
- waitForPodsReady (config API v1beta2, apis/config/v1beta2/configuration_types.go): after admission
  Kueue waits `timeout` for every pod of the workload to be ready; if not, it evicts the workload
  (suspends the job, pods deleted) and requeues it with exponential backoff; `recoveryTimeout` does
  the same for a running workload that lost a pod; `blockAdmission` admits nothing else until the
  admitted workload's pods are all ready. v1beta2 has no `enable` field (CHANGELOG-0.15: "Delete
  .enable field from WaitForPodsReady"); since v0.19.0 it is on by default with 30 min timeouts
  (CHANGELOG-0.19: "WaitForPodsReady is now enabled by default"). The values are written out here.
- After `backoffLimitCount` requeues the Workload is deactivated (setup_wait_for_pods_ready.md).

Why blockAdmission: the queues' quota is each group's capacity at max_size, while only the nodes
`trainctl scale` brought up exist. Two two-node jobs admitted together onto two nodes would each
get one and wait for ever (the starvation of issue 17 #5); admitted one at a time, the second waits
until the first runs. The price: blockAdmission is per manager, so while one workload's pods start
(image pull on fresh nodes), no other workload is admitted, on any queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct, IDependable

from infra.addons.helm import ChartAddOn
from infra.spec import Environment
from infra.spec.addon_pods import KUEUE_MANAGER_CPU, KUEUE_MANAGER_MEMORY
from infra.spec.errors import ConfigError
from infra.spec.namespaces import NamespaceSpec
from infra.spec.scheduling import SYSTEM_NODE_SELECTOR
from k8s.queueing import queue_objects

CHART = "kueue"

# Kueue's own namespace (the default the chart documents: --namespace kueue-system), created by CDK
# with Pod Security labels before the chart. The manager pod is restricted-compliant
# (values.yaml: runAsNonRoot, RuntimeDefault seccomp, no capabilities); baseline is enforced as for
# the KubeRay operator and restricted reported.
KUEUE = NamespaceSpec(name="kueue-system", purpose="Kueue controller manager", enforce="baseline", warn="restricted")

BATCH_JOB = "batch/job"
RAY_JOB = "ray.io/rayjob"
RAY_CLUSTER = "ray.io/raycluster"


@dataclass(frozen=True, kw_only=True)
class KueueProps:
    namespace: str = KUEUE.name
    ray_integrations: bool = True
    """Manage RayJobs and RayClusters (needs the KubeRay CRDs: only with the KubeRay operator)."""
    # A fresh p5/g6 node pulls the multi-GB training images before any pod is ready (issue 17 #7
    # measured pull skew beyond 60 s per node); 20 minutes covers a cold pull of the largest image
    # on every node of a gang, and is still well under the 30 min default that keeps idle GPUs.
    pods_ready_timeout_minutes: int = 20
    # A running gang that lost a pod: a replacement on a healthy node starts in minutes, a node the
    # managed node group replaces takes about ten; past 15 minutes the remaining nodes sit idle.
    recovery_timeout_minutes: int = 15
    block_admission: bool = True
    # Three evictions for not starting mean the nodes are not there (group not scaled up, capacity
    # short): the Workload is then deactivated, which `kubectl get workloads` shows, instead of
    # being retried every hour for ever.
    requeue_limit: int = 3
    cpu_request: str = KUEUE_MANAGER_CPU
    memory_request: str = KUEUE_MANAGER_MEMORY
    cpu_limit: str = "2"
    memory_limit: str = "512Mi"

    def __post_init__(self) -> None:
        for name in ("pods_ready_timeout_minutes", "recovery_timeout_minutes"):
            value = getattr(self, name)
            if not 1 <= value <= 24 * 60:
                raise ConfigError(f"kueue.{name}", value, "1 to 1440 minutes")
        if not 0 <= self.requeue_limit <= 100:
            raise ConfigError("kueue.requeue_limit", self.requeue_limit, "0 to 100 requeues")


def frameworks(props: KueueProps) -> list[str]:
    return [BATCH_JOB, RAY_JOB, RAY_CLUSTER] if props.ray_integrations else [BATCH_JOB]


def manager_config(props: KueueProps) -> dict[str, Any]:
    """The manager's Configuration (config.kueue.x-k8s.io/v1beta2)."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        # The chart's defaults (values.yaml controllerManagerConfigYaml), unchanged.
        "health": {"healthProbeBindAddress": ":8081"},
        "metrics": {"bindAddress": ":8443"},
        "webhook": {"port": 9443},
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        "controller": {
            "groupKindConcurrency": {
                "Job.batch": 5,
                "Pod": 5,
                "Workload.kueue.x-k8s.io": 10,
                "LocalQueue.kueue.x-k8s.io": 5,
                "ClusterQueue.kueue.x-k8s.io": 5,
                "ResourceFlavor.kueue.x-k8s.io": 1,
            }
        },
        "clientConnection": {"qps": 300, "burst": 500},
        # Only labelled jobs are managed: the jobs CDK and trainctl run for themselves start at once.
        "manageJobsWithoutQueueName": False,
        "waitForPodsReady": {
            "timeout": f"{props.pods_ready_timeout_minutes}m",
            "recoveryTimeout": f"{props.recovery_timeout_minutes}m",
            "blockAdmission": props.block_admission,
            # Creation: a requeued workload keeps its place in the queue instead of going last.
            "requeuingStrategy": {"timestamp": "Creation", "backoffLimitCount": props.requeue_limit},
        },
        "integrations": {"frameworks": frameworks(props)},
    }


def kueue_values(props: KueueProps) -> dict[str, Any]:
    return {
        "controllerManager": {
            "nodeSelector": dict(SYSTEM_NODE_SELECTOR),
            "manager": {
                "resources": {
                    "requests": {"cpu": props.cpu_request, "memory": props.memory_request},
                    "limits": {"cpu": props.cpu_limit, "memory": props.memory_limit},
                }
            },
        },
        "managerConfig": {"controllerManagerConfigYaml": yaml.safe_dump(manager_config(props), sort_keys=False)},
        # Metrics stay inside the cluster.
        "metricsService": {"type": "ClusterIP"},
    }


class Kueue(Construct):
    """The pinned chart, then the queues of the environment (k8s/queueing.py).

    The queues are cluster configuration, applied here by CDK and not shipped in dist/: they follow
    the environment's GPU groups (a group added or resized in infra/spec changes its quota on the
    next deploy of the Platform stack), they must exist before any workload is submitted, and
    ClusterQueues and ResourceFlavors are cluster-scoped objects no workload should own. They are
    in the Platform stack, not the Gpu-<group> stacks, because the Kueue CRDs and webhook come with
    the chart there; a queue whose group has no nodes yet admits nothing it could not run any way
    (waitForPodsReady evicts it).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.ICluster,
        environment: Environment,
        props: KueueProps,
        after: Sequence[IDependable],
        queues_after: Sequence[IDependable],
    ) -> None:
        super().__init__(scope, construct_id)
        self.release = ChartAddOn(
            self,
            "Release",
            cluster=cluster,
            name=CHART,
            namespace=props.namespace,
            values=kueue_values(props),
            after=after,
        )
        self.values = self.release.values
        self.queue_objects = queue_objects(environment)
        # The chart's --wait covers the manager Deployment, which serves the webhooks that validate
        # these objects; the LocalQueues need their namespaces.
        self.queues = eks.KubernetesManifest(
            self, "Queues", cluster=cluster, manifest=self.queue_objects, overwrite=True
        )
        self.queues.node.add_dependency(self.release.chart)
        for dependency in queues_after:
            self.queues.node.add_dependency(dependency)
