"""The Kueue manager's Configuration (config.kueue.x-k8s.io/v1beta2) and the props it is rendered from.

Pure data, so that both the Platform stack (infra/addons/kueue.py, the chart value) and the cluster
rehearsal (rehearse/cluster/kueue.py, the admission it emulates) read the same document.

Facts (kubernetes-sigs/kueue at tag v0.19.2 unless said otherwise):
- waitForPodsReady (config API v1beta2, apis/config/v1beta2/configuration_types.go): after admission
  Kueue waits `timeout` for every pod of the workload to be ready; if not, it evicts the workload
  (suspends the job, pods deleted) and requeues it with exponential backoff; `recoveryTimeout` does
  the same for a running workload that lost a pod; `blockAdmission` admits nothing else until the
  admitted workload's pods are all ready. v1beta2 has no `enable` field (CHANGELOG-0.15: "Delete
  .enable field from WaitForPodsReady"); since v0.19.0 it is on by default with 30 min timeouts
  (CHANGELOG-0.19: "WaitForPodsReady is now enabled by default"). The values are written out here.
- After `backoffLimitCount` requeues the Workload is deactivated (setup_wait_for_pods_ready.md).
- No timeout per workload, per kind or per queue exists at v0.19.2: the workload controller holds one
  waitForPodsReadyConfig (timeout, recoveryTimeout, requeuing backoff) for the whole manager
  (pkg/controller/core/workload_controller.go waitForPodsReadyConfig, admittedNotReadyWorkload),
  and the Workload API's only time limit is maximumExecutionTimeSeconds (the
  kueue.x-k8s.io/max-exec-time-seconds label), a limit on running, not on starting. One timeout,
  sized for the slowest start (a cold image pull on fresh p5 nodes), serves every kind.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from infra.spec.errors import ConfigError
from infra.spec.namespaces import NamespaceSpec
from infra.spec.node_loss import lost_node_recovery_s

# Kueue's own namespace (the default the chart documents: --namespace kueue-system), created by CDK
# with Pod Security labels before the chart. The manager pod is restricted-compliant
# (values.yaml: runAsNonRoot, RuntimeDefault seccomp, no capabilities); baseline is enforced as for
# the KubeRay operator and restricted reported.
KUEUE = NamespaceSpec(name="kueue-system", purpose="Kueue controller manager", enforce="baseline", warn="restricted")

# The manager's webhook server (the chart's default, kept: manager_config below) and the visibility API server,
# whose port the chart fixes (templates/manager/manager.yaml containerPort 8082 `visibility`,
# templates/visibility/service.yaml targetPort 8082) and whose APIService it always installs
# (templates/visibility/apiservice_v1beta2.yaml; the VisibilityOnDemand feature gate is on by default since 0.9,
# pkg/features/kube_features.go). The API server calls both (infra/spec/network_policies.py).
WEBHOOK_PORT = 9443
VISIBILITY_PORT = 8082

BATCH_JOB = "batch/job"
RAY_JOB = "ray.io/rayjob"
RAY_CLUSTER = "ray.io/raycluster"
PODS_READY_TIMEOUT_MINUTES = 20


@dataclass(frozen=True, kw_only=True)
class KueueProps:
    namespace: str = KUEUE.name
    ray_integrations: bool = True
    """Manage RayJobs and RayClusters (needs the KubeRay CRDs: only with the KubeRay operator)."""
    # A fresh p5/g6 node pulls the multi-GB training images before any pod is ready (issue 17 #7
    # measured pull skew beyond 60 s per node); 20 minutes covers a cold pull of the largest image
    # on every node of a gang, and is still well under the 30 min default that keeps idle GPUs.
    pods_ready_timeout_minutes: int = PODS_READY_TIMEOUT_MINUTES
    # A running gang that lost a pod: counted from PodsReady=False (Kueue apis/config/v1beta2
    # configuration_types.go RecoveryTimeout: "measured since the last transition to the PodsReady=false
    # condition"), after which the whole gang is evicted and requeued. A node that stops answering
    # takes grace period + default toleration + replacement + a cold start before its pod is ready on
    # a new node (infra/spec/node_loss.py: 50 + 300 + 300 + 1200 s = 31 min); a shorter timeout would
    # evict a gang that was about to recover, and count a requeue against requeue_limit.
    recovery_timeout_minutes: int = math.ceil(lost_node_recovery_s(PODS_READY_TIMEOUT_MINUTES * 60) / 60)
    # Off (issue 22 #5). blockAdmission is per manager, not per queue: while any admitted workload of
    # any ClusterQueue is not PodsReady the scheduler admits nothing anywhere (v0.19.2
    # pkg/scheduler/scheduler.go waitForPodsReadyIfNeeded, pkg/cache/scheduler/cache.go
    # podsReadyForAllAdmittedWorkloads), so one gang that cannot start froze every queue for up to
    # 4 x 20 min (and a recovering one would for up to recoveryTimeout). What it protected against, two
    # gangs admitted together each holding part of too few nodes (issue 17 #5), needs quota above the
    # nodes: the quota now covers the nodes that exist (k8s/queueing.py, trainctl scale), so the gangs
    # Kueue admits together fit together.
    block_admission: bool = False
    # Three evictions for not starting mean the nodes are not there (group not scaled up, capacity
    # short): the Workload is then deactivated, which `kubectl get workloads` shows, instead of
    # being retried every hour for ever.
    requeue_limit: int = 3
    cpu_request: str = "500m"
    memory_request: str = "512Mi"
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
        "webhook": {"port": WEBHOOK_PORT},
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


def kueue_props(kuberay_operator: bool) -> KueueProps:
    """The props an environment's Platform stack renders Kueue with (infra/addons/stack.py)."""
    return KueueProps(ray_integrations=kuberay_operator)
