"""The fault-tolerant FSDP job with NVRx: an Indexed Job (one pod per node, the node's GPUs and
EFA interfaces) plus a headless Service for the c10d rendezvous, each pod running `ft_launcher`
over training/nvrx_fsdp.py with checkpoints on the FSx claim.

Why a plain Indexed Job and not JobSet or the Kubeflow PyTorchJob: ft_launcher already restarts
workers inside the pods, and the Job controller replaces a lost pod; another operator would add a
third restart layer to reason about and one more thing to install and upgrade on the cluster.
"""

from __future__ import annotations

from typing import Any

import cdk8s
from constructs import Construct

from infra.spec import Environment, GpuNodeGroupConfig
from infra.spec.environments import nodes_with_spare
from infra.spec.images import built_image_name, refuse_start_install
from infra.spec.namespaces import TRAINING
from infra.spec.network_policies import gang
from infra.spec.scheduling import gpu_group_selector, gpu_toleration
from k8s.capacity_deadline import deadline_env, deadline_rules, on_block
from k8s.charts.network_policies import add_policies
from k8s.fabric_gate_spec import EXIT_FAILED, EXIT_RETRY, TOKEN_ACK, gate_env, gate_flags, gate_pod
from k8s.images import ImageLock
from k8s.job_parts import (
    SharedDirCheck,
    efa_container_security,
    efa_job_metadata,
    headless_service,
    job_uid_env,
    one_pod_per_node,
    precondition_script,
)
from k8s.nvrx_spec import NVRX_IMAGE, NvrxFsdpJob, launch_script
from k8s.ofi_nccl import restart_mechanisms
from k8s.queueing import queue_labels
from k8s.ray_spec import (
    CHECKPOINT_MOUNT,
    WorkloadError,
    checkpoint_claim,
    checkpoint_mount,
    emf_env,
    env_list,
    gpu_group,
    gpu_pod_parts,
    hardened_pod,
    image_packages,
    precondition_argv,
)

NAMESPACE = TRAINING.name


def nvrx_job_image(environment: Environment, job: NvrxFsdpJob) -> str:
    """The lock entry the job's pods run: the built image, or the DLC where start_install is allowed and asked for."""
    refuse_start_install(environment.name, environment.add_ons.nvrx_image, job.start_install)
    return NVRX_IMAGE if job.start_install else built_image_name(environment.name)


# Exit code of training/nvrx_fsdp.py for bad arguments: retrying cannot help.
EXIT_BAD_CONFIGURATION = 2


def job_nodes(job: NvrxFsdpJob, group: GpuNodeGroupConfig) -> int:
    nodes = job.nodes if job.nodes is not None else group.workload_nodes
    if not 2 <= nodes <= group.scaling.max_size:
        raise WorkloadError(
            f"nvrx.nodes={nodes} does not fit GPU group {group.name!r} (max_size {group.scaling.max_size}); "
            f"use 2 to {group.scaling.max_size} nodes or raise the group's max_size"
        )
    return nodes


def job_pods(job: NvrxFsdpJob, group: GpuNodeGroupConfig, nodes: int) -> int:
    """The Job's pods, `nodes` active plus the hot spares, checked against the group: with the fabric gate's own spare
    node (GATE_SPARE_NODES: a gang the gate takes a node from is re-placed only onto an untainted node) they must fit
    the group's max_size. Kueue admits the Workload only when the ClusterQueue's quota covers every pod (its PodSet
    count is the parallelism), so `trainctl scale` must bring up nodes + spares + that gate spare."""
    job.check_spares(nodes)
    pods = job.pods(nodes)
    needed = nodes_with_spare(pods)
    if job.spares and needed > group.scaling.max_size:
        raise WorkloadError(
            f"nvrx.spares={job.spares} with nvrx.nodes={nodes} needs {needed} nodes of GPU group {group.name!r} "
            f"({nodes} active + {job.spares} hot spare(s) + {needed - pods} for the fabric gate to re-place onto; "
            f"max_size {group.scaling.max_size}); lower spares or nodes, or raise the group's max_size"
        )
    return pods


class NvrxJobChart(cdk8s.Chart):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        environment: Environment,
        lock: ImageLock,
        job: NvrxFsdpJob,
    ) -> None:
        super().__init__(scope, construct_id, namespace=NAMESPACE, disable_resource_name_hashes=True)
        group = gpu_group(environment, job.gpu_group)
        gpu = group.instance.gpu
        assert gpu is not None
        # Active nodes (the training's world); the Job runs `pods`: those and the hot spares.
        self.nodes = job_nodes(job, group)
        self.pods = job_pods(job, group, self.nodes)
        # Pod 0's stable name through the headless Service: rendezvous and the in-process store.
        host = f"{job.name}-0.{job.name}.{NAMESPACE}.svc"
        launcher = job.ft_launcher.argv(
            nodes=self.nodes, gpus_per_node=gpu.count, rendezvous_host=host, rendezvous_id=job.name, spares=job.spares
        )
        self.launcher_argv = launcher
        gate = (
            gate_flags(
                group,
                state_dir=job.fabric_gate_dir,
                workload=f"Job/{job.name}",
                run_seconds=job.active_deadline_seconds,
            )
            if job.fabric_gate
            else None
        )
        self.training_argv = job.training_argv(store_host=host, gate_flags=gate)
        # Checked at each pod's start: the image's Python and torch (lock), the pinned start-time packages, the
        # NCCL net plugin, EFA devices and memlock; and that every pod sees the checkpoint directory (markers
        # under it, per run of the Job: its uid).
        image = nvrx_job_image(environment, job)
        checks = precondition_argv(
            lock=lock,
            image=image,
            packages=[*image_packages(lock, image, ("torch",)), *job.pip],
            group=group,
            restarts=restart_mechanisms(max_restarts=job.ft_launcher.max_restarts, inprocess=job.inprocess.enabled),
        )
        shared = SharedDirCheck(
            directory=job.checkpoint_dir,
            peers=self.pods,
            timeout_s=job.preconditions_timeout_s,
            peer_host=f"{job.name}-{{index}}.{job.name}",
        )
        self.script = launch_script(
            job,
            launcher_argv=launcher,
            training_argv=self.training_argv,
            preconditions=precondition_script(checks, shared),
            supervised=job.fabric_gate or on_block(group),
        )
        headless_service(self, job.name, job.ports)
        self.spec = self._job_spec(environment, group, job, lock.pinned(image))
        metadata = efa_job_metadata(job.name, labels=queue_labels(environment, group.name))
        if job.fabric_gate:
            metadata = cdk8s.ApiObjectMetadata(
                name=job.name,
                labels=metadata.labels,
                annotations={**(metadata.annotations or {}), "checkov.io/skip2": TOKEN_ACK},
            )
        cdk8s.ApiObject(self, job.name, api_version="batch/v1", kind="Job", metadata=metadata).add_json_patch(
            cdk8s.JsonPatch.add("/spec", self.spec)
        )
        # The gang's pods admit each other on every port (job.ports and NCCL's), no other Job's pods.
        add_policies(self, [gang(NAMESPACE, job.name)])

    def _job_spec(
        self, environment: Environment, group: GpuNodeGroupConfig, job: NvrxFsdpJob, image: str
    ) -> dict[str, Any]:
        parts = gpu_pod_parts(group)
        env = [
            *parts.env,
            *env_list({**job.watchdog_env(), **emf_env(job_name=job.name, group=group)}),
            # Model weights are downloaded once to the shared file system, not once per pod.
            {"name": "HF_HOME", "value": f"{CHECKPOINT_MOUNT}/hf-cache"},
            job_uid_env(),
            *(gate_env() if job.fabric_gate else []),
            *deadline_env(group, job_name=job.name, step_seconds=job.step_seconds),
        ]
        # NVRx checkpoints only on the claim every pod mounts: refused where the environment has none.
        checkpoints = checkpoint_claim(environment, workload=f"NVRx job {job.name}", pods=self.pods)
        pod = hardened_pod(
            {
                "subdomain": job.name,
                "restartPolicy": "Never",
                "nodeSelector": gpu_group_selector(group.name),
                "tolerations": [gpu_toleration()],
                "affinity": one_pod_per_node(job.name),
                # Ranks finish their checkpoint write and ft_launcher stops them cleanly.
                "terminationGracePeriodSeconds": 120,
                "containers": [
                    {
                        "name": "trainer",
                        "image": image,
                        "command": ["/bin/bash", "-c", self.script],
                        "env": env,
                        "resources": parts.resources,
                        "ports": [{"name": name, "containerPort": port} for name, port in job.ports.items()],
                        "volumeMounts": [*parts.mounts, checkpoint_mount()],
                        "securityContext": efa_container_security(),
                    }
                ],
                "volumes": [*parts.volumes, checkpoints],
            }
        )
        if job.fabric_gate:
            pod = gate_pod(pod)
        success = job.success_policy()
        return {
            "completionMode": "Indexed",
            "completions": self.pods,
            "parallelism": self.pods,
            **({"successPolicy": success} if success else {}),
            "backoffLimit": job.backoff_limit_for(self.pods),
            "podFailurePolicy": {
                "rules": [
                    # Bad arguments fail the Job at once instead of burning the retries.
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": "trainer",
                            "operator": "In",
                            "values": [EXIT_BAD_CONFIGURATION],
                        },
                    },
                    # Node drain, preemption, eviction: replace the pod without counting a failure.
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                    *(self._gate_rules() if job.fabric_gate else []),
                    *deadline_rules(group, "trainer"),
                ]
            },
            "activeDeadlineSeconds": job.active_deadline_seconds,
            "ttlSecondsAfterFinished": job.ttl_seconds_after_finished,
            "template": {"metadata": {"labels": {"app.kubernetes.io/name": job.name}}, "spec": pod},
        }

    @staticmethod
    def _gate_rules() -> list[dict[str, Any]]:
        """The fabric gate's exit codes (training/fabric_gate.py): a failure it took a node out for is retried without
        counting against backoffLimit (the gate bounds its own failures per run, on the checkpoint claim, and exits
        EXIT_FAILED when they are spent); EXIT_FAILED fails the Job with the verdict in the termination message."""
        return [
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [EXIT_FAILED]},
            },
            {
                "action": "Ignore",
                "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [EXIT_RETRY]},
            },
        ]
