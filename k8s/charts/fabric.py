"""Fabric verification jobs, one per GPU node group: an Indexed Job (one pod per node) that
runs the all-reduce probe across nodes and fails, loudly, when NCCL is not on EFA or the bus
bandwidth is under the instance type's floor; and an A/B job that measures the same sweep with
the EFA profile and with the explicit TCP baseline, and prints both and their ratio.

The check and the A/B job are separate charts, so separate files in dist/ (`fabric-check`,
`fabric-ab`): each takes every node of a two-node group, and applied together one of them would
hold a node the other waits for. Apply one, wait for it to finish, then the other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import cdk8s
from constructs import Construct

from infra.spec import Environment, GpuNodeGroupConfig
from infra.spec.fabric_floors import floor_gbps, floor_message_bytes
from infra.spec.namespaces import TRAINING
from infra.spec.network_policies import gang
from infra.spec.scheduling import gpu_group_selector, gpu_toleration
from k8s.charts.network_policies import add_policies
from k8s.fabric_env import FabricProfile, fabric_env
from k8s.images import ImageLock
from k8s.job_parts import (
    efa_container_security,
    efa_job_metadata,
    headless_service,
    one_pod_per_node,
    precondition_script,
)
from k8s.queueing import queue_labels
from k8s.ray_spec import RAY_IMAGE, gpu_pod_parts, hardened_pod, image_packages, precondition_argv

NAMESPACE = TRAINING.name
RENDEZVOUS_PORT = 29500
RESULTS = "/tmp/fabric"


@dataclass(frozen=True, kw_only=True)
class FabricJobConfig:
    # Two nodes: the fabric is what connects nodes, and the published figures the floors come
    # from are 2-node runs (with more nodes the best possible bus bandwidth drops towards the
    # per-node bandwidth, and a 2-node floor would raise false alarms).
    nodes: int = 2
    max_bytes: int = 1 << 30
    iters: int = 20
    active_deadline_seconds: int = 1800
    ttl_seconds_after_finished: int = 86400


def probe_command(
    *, gpus: int, nodes: int, master: str, floor: float | None, max_bytes: int, iters: int, tag: str
) -> str:
    """One torchrun of the probe across the job's nodes, its log kept for the analyzer."""
    floor_arg = f" --floor-gbps {floor:g}" if floor is not None else ""
    return (
        f"torchrun --nnodes={nodes} --nproc-per-node={gpus} --node-rank=$JOB_COMPLETION_INDEX "
        f"--master-addr={master} --master-port={RENDEZVOUS_PORT} "
        f"-m training.fabric_probe --max-bytes {max_bytes} --iters {iters}{floor_arg} "
        f"--output-json {RESULTS}/{tag}.json 2>&1 | tee {RESULTS}/{tag}.log"
    )


def preconditions(group: GpuNodeGroupConfig, lock: ImageLock) -> str:
    """The pod's own checks first (training/pod_checks.py): the image's Python and torch, the NCCL net plugin,
    the group's EFA devices, memlock; a pod that fails them says which, instead of a probe that crawls on TCP."""
    argv = precondition_argv(
        lock=lock, image=RAY_IMAGE, packages=image_packages(lock, RAY_IMAGE, ("torch",)), group=group
    )
    return f"{precondition_script(argv)} || exit 2"


def check_script(group: GpuNodeGroupConfig, nodes: int, master: str, config: FabricJobConfig, lock: ImageLock) -> str:
    gpu = group.instance.gpu
    assert gpu is not None
    probe = probe_command(
        gpus=gpu.count,
        nodes=nodes,
        master=master,
        floor=floor_gbps(group.instance_type),
        # The sweep must reach the size the floor is defined at.
        max_bytes=max(config.max_bytes, floor_message_bytes(group.instance_type)),
        iters=config.iters,
        tag="efa",
    )
    return "\n".join(
        [
            "set -uo pipefail",
            f"mkdir -p {RESULTS}",
            preconditions(group, lock),
            probe,
            # torchrun exits 1 whatever its workers returned; the probe's own verdict is the
            # FABRIC CHECK PASSED/FAILED line it printed above (and exit_code in its JSON).
            "probe=${PIPESTATUS[0]}",
            # Any rank that is not on EFA fails the job, whatever the bandwidth said.
            f"python -m training.fabric_analyzer {RESULTS}/efa.log || "
            '{ echo "FABRIC CHECK FAILED: NCCL is not running over EFA on $(hostname)"; exit 10; }',
            'if [ "$probe" -ne 0 ]; then echo "FABRIC CHECK FAILED: probe exit $probe on $(hostname)"; fi',
            'exit "$probe"',
        ]
    )


def ab_script(group: GpuNodeGroupConfig, nodes: int, master: str, config: FabricJobConfig, lock: ImageLock) -> str:
    gpu = group.instance.gpu
    assert gpu is not None
    tcp_env = " ".join(f"{k}={v!r}" for k, v in fabric_env(group.instance, FabricProfile.TCP_BASELINE).items())

    def probe(tag: str) -> str:
        return probe_command(
            gpus=gpu.count,
            nodes=nodes,
            master=master,
            floor=None,
            max_bytes=config.max_bytes,
            iters=config.iters,
            tag=tag,
        )

    return "\n".join(
        [
            "set -uo pipefail",
            f"mkdir -p {RESULTS}",
            preconditions(group, lock),
            probe("efa"),
            'test "${PIPESTATUS[0]}" -eq 0 || exit 11',
            # The same sweep with the explicit TCP-baseline profile, for this measurement only.
            f"env {tcp_env} " + probe("tcp"),
            'test "${PIPESTATUS[0]}" -eq 0 || exit 12',
            # Rank 0 (on pod 0) wrote both reports: print them side by side with the ratio.
            'if [ "$JOB_COMPLETION_INDEX" = 0 ]; then '
            f"python -m training.fabric_compare {RESULTS}/efa.json {RESULTS}/tcp.json "
            f"--output-json {RESULTS}/ab.json; fi",
        ]
    )


class FabricJob(Enum):
    CHECK = "check"
    AB = "ab"


_SCRIPTS: dict[FabricJob, Callable[[GpuNodeGroupConfig, int, str, FabricJobConfig, ImageLock], str]] = {
    FabricJob.CHECK: check_script,
    FabricJob.AB: ab_script,
}


class FabricJobsChart(cdk8s.Chart):
    """One kind of fabric job (the check or the A/B measurement) for every GPU node group."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        environment: Environment,
        lock: ImageLock,
        kind: FabricJob,
        config: FabricJobConfig | None = None,
    ) -> None:
        super().__init__(scope, construct_id, namespace=NAMESPACE, disable_resource_name_hashes=True)
        config = config or FabricJobConfig()
        self._image = lock.pinned(RAY_IMAGE)
        self.jobs: dict[str, dict[str, Any]] = {}
        for group in environment.gpu_node_groups:
            nodes = config.nodes
            name = f"fabric-{kind.value}-{group.name}"
            master = f"{name}-0.{name}.{NAMESPACE}.svc"
            headless_service(self, name, {"rendezvous": RENDEZVOUS_PORT})
            script = _SCRIPTS[kind](group, nodes, master, config, lock)
            labels = queue_labels(environment, group.name)
            self.jobs[name] = self._job(name, group, nodes, script, config, labels)
            # The probe's pods admit each other (rendezvous and NCCL), no other Job's pods.
            add_policies(self, [gang(NAMESPACE, name)])

    def _job(
        self,
        name: str,
        group: GpuNodeGroupConfig,
        nodes: int,
        script: str,
        config: FabricJobConfig,
        labels: dict[str, str],
    ) -> dict[str, Any]:
        parts = gpu_pod_parts(group)
        pod = hardened_pod(
            {
                "subdomain": name,
                "restartPolicy": "Never",
                "nodeSelector": gpu_group_selector(group.name),
                "tolerations": [gpu_toleration()],
                "affinity": one_pod_per_node(name),
                "containers": [
                    {
                        "name": "probe",
                        "image": self._image,
                        "command": ["/bin/bash", "-c", script],
                        "env": parts.env,
                        "resources": parts.resources,
                        "volumeMounts": parts.mounts,
                        "securityContext": efa_container_security(),
                    }
                ],
                "volumes": parts.volumes,
            }
        )
        spec = {
            "completionMode": "Indexed",
            "completions": nodes,
            "parallelism": nodes,
            # A failed check is an answer, not something to retry.
            "backoffLimit": 0,
            "activeDeadlineSeconds": config.active_deadline_seconds,
            "ttlSecondsAfterFinished": config.ttl_seconds_after_finished,
            "template": {"metadata": {"labels": {"app.kubernetes.io/name": name}}, "spec": pod},
        }
        cdk8s.ApiObject(
            self, name, api_version="batch/v1", kind="Job", metadata=efa_job_metadata(name, labels=labels)
        ).add_json_patch(cdk8s.JsonPatch.add("/spec", spec))
        return spec
