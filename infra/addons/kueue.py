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
- The manager's Configuration (waitForPodsReady, integrations) is pure data in infra/spec/kueue.py, which
  the cluster rehearsal reads too.

Why no blockAdmission (infra/spec/kueue.py): it is per manager, so one workload that cannot start
(nodes not scaled up, capacity short) stopped admission on every queue. The queues' quota covers the
nodes that exist instead (k8s/queueing.py: desired_size at deploy, moved by `trainctl scale`), so
two jobs admitted together onto one group fit its nodes together (the starvation of issue 17 #5),
and a job on a group without nodes is not admitted at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct, IDependable

from infra.addons.helm import ChartAddOn
from infra.spec import Environment
from infra.spec.kueue import KueueProps, manager_config
from infra.spec.network_policies import KUEUE_RELEASE
from infra.spec.scheduling import SYSTEM_NODE_SELECTOR
from k8s.queueing import queue_objects

# The pinned chart and its release name, which the manager pods' labels carry (kueue-system admits them).
CHART = KUEUE_RELEASE


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
    the chart there. Each GPU quota covers the group's deploy-time nodes (desired_size); `trainctl
    scale` patches it afterwards, and a Platform deploy that changes these objects sets it back
    (to no more than the nodes: `trainctl status` names the difference and the command that
    closes it).
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
