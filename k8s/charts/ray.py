"""Ray Train workload charts: the training code as a ConfigMap, one long-lived RayCluster on one GPU node
group (a fixed worker count, 0 by default), and a RayJob for the fine-tune that brings its own cluster."""

from __future__ import annotations

from pathlib import Path

import cdk8s
import yaml
from constructs import Construct

from infra.spec import Environment
from infra.spec.network_policies import ray_workload
from infra.spec.scheduling import SYSTEM_NODE_SELECTOR
from k8s.capacity_deadline import on_block
from k8s.charts.network_policies import add_policies
from k8s.fabric_env import FabricProfile
from k8s.fabric_gate_spec import gate_flags
from k8s.images import ImageLock
from k8s.queueing import queue_labels
from k8s.ray_spec import (
    CHECKPOINT_MOUNT,
    CODE_CONFIGMAPS,
    DRIVER_NUM_CPUS,
    NAMESPACE,
    RAY_IMAGE,
    WorkerCount,
    WorkloadError,
    checkpoint_claim,
    code_configmap,
    gpu_group,
    hardened_pod,
    ray_cluster_spec,
)
from k8s.workloads import RayClusterConfig, RayFinetuneJob

# Ray Train's RunConfig(storage_path): on the checkpoint claim every worker mounts, where the job's driver and Ray
# Train's controller run too (Ray 2.58 refuses a path the controller's marker is not visible on; k8s/ray_spec.py
# head_group). An FSx claim rather than s3:// through pyarrow: S3 would need the image's AWS SDK for C++ (inside
# pyarrow) to take EKS Pod Identity credentials, which nobody here could verify.
RAY_STORAGE_PATH = f"{CHECKPOINT_MOUNT}/ray-results"

TRAINING_PACKAGE = Path(__file__).resolve().parent.parent.parent / "training"


# A ConfigMap's data cannot exceed 1 MiB (Kubernetes docs, ConfigMaps). Documented applies are server-side: a
# client-side apply also copies the object into a last-applied annotation, limited to 256 KiB in total
# (apimachinery pkg/api/validation/objectmeta.go TotalAnnotationSizeLimitB), which the code outgrows first.
CONFIGMAP_DATA_LIMIT_BYTES = 1024 * 1024


def configmap_data_bytes(data: dict[str, str]) -> int:
    """The size the API server counts for a ConfigMap's data: keys and UTF-8 values."""
    return sum(len(key.encode()) + len(value.encode()) for key, value in data.items())


class TrainingCodeChart(cdk8s.Chart):
    """training/*.py shipped as ConfigMaps in each workload namespace (the fabric tools in one of their own, see
    k8s/ray_spec.py code_configmap) and projected into one directory on the pods that run it: no image build."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        namespaces: tuple[str, ...] = (NAMESPACE,),
        package: Path = TRAINING_PACKAGE,
    ) -> None:
        super().__init__(scope, construct_id, disable_resource_name_hashes=True)
        files = {p.name: p.read_text() for p in sorted(package.glob("*.py"))}
        if "ray_finetune.py" not in files:
            raise FileNotFoundError(f"{package}/ray_finetune.py is missing: nothing to run")
        size = configmap_data_bytes(files)
        if size > CONFIGMAP_DATA_LIMIT_BYTES:
            largest = ", ".join(sorted(files, key=lambda name: -len(files[name].encode()))[:3])
            raise WorkloadError(
                f"the training-code ConfigMap would hold {size} bytes of {package}/*.py, which exceeds the "
                f"{CONFIGMAP_DATA_LIMIT_BYTES} bytes a ConfigMap may hold (largest: {largest}); split the code into "
                "a second ConfigMap or bake it into the image"
            )
        for namespace in namespaces:
            for configmap in CODE_CONFIGMAPS:
                part = {name: text for name, text in files.items() if code_configmap(name) == configmap}
                suffix = configmap.removeprefix("training-code")
                cdk8s.ApiObject(
                    self,
                    f"code{suffix}-{namespace}",
                    api_version="v1",
                    kind="ConfigMap",
                    metadata=cdk8s.ApiObjectMetadata(name=configmap, namespace=namespace),
                ).add_json_patch(cdk8s.JsonPatch.add("/data", part))


class RayClusterChart(cdk8s.Chart):
    """The long-lived RayCluster for interactive work and `trainctl submit`: one GPU node group's workers (one GPU
    type per Ray job; a job never mixes H100 and L4 workers), a fixed count, by default none.

    No autoscaler (issue 22 #3). Kueue v0.19.2 lets a RayCluster autoscale only as an elastic job ("Should not use
    auto scaler. Once the resources are reserved by queue the cluster should do its best to use them",
    pkg/controller/jobs/raycluster/raycluster_webhook.go validateCreate), and its PodsReady is `status.state ==
    Ready` (raycluster_controller.go PodsReady), which KubeRay v1.7.0 sets once every pod runs and takes back only on
    suspension (ray-operator/controllers/ray/raycluster_controller.go calculateStatus). Each autoscaler scale-up
    is a new Workload slice whose PodsReady the reconciler derives from that state
    (pkg/controller/jobframework/reconciler.go generatePodsReadyCondition): true at once, so Pending workers on a
    group without nodes skip waitForPodsReady and hold the group's quota for as long as the cluster lives (a
    RayCluster never finishes for Kueue). With a fixed count, changing `replicas` makes the Workload no longer match
    the cluster: Kueue suspends it and admits head and workers anew as one gang (reconciler.go ensureOneWorkload,
    "job with no matching workload, suspending"), KubeRay's state goes Suspended and back to Ready only when every
    pod runs, so waitForPodsReady evicts a cluster whose workers find no nodes. The default 0 holds no GPU quota at
    all: the cluster never keeps the nodes a RayJob or the NVRx job waits for."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        environment: Environment,
        lock: ImageLock,
        cluster: RayClusterConfig | None = None,
    ) -> None:
        super().__init__(scope, construct_id, namespace=NAMESPACE, disable_resource_name_hashes=True)
        cluster = cluster or RayClusterConfig()
        group = gpu_group(environment, cluster.gpu_group)
        # minReplicas 0 and maxReplicas max_size: `kubectl patch` of `replicas` alone resizes it (docs/workloads.md).
        count = WorkerCount(replicas=cluster.workers, min_replicas=0, max_replicas=group.scaling.max_size)
        self.workload_name = cluster.name
        self.spec = ray_cluster_spec(environment, lock, group=group, job_name=cluster.name, count=count)
        cdk8s.ApiObject(
            self,
            "cluster",
            api_version="ray.io/v1",
            kind="RayCluster",
            metadata=cdk8s.ApiObjectMetadata(
                name=cluster.name,
                labels={
                    "platform/environment": environment.name,
                    "platform/gpu-group": group.name,
                    **queue_labels(environment, group.name),
                },
            ),
        ).add_json_patch(cdk8s.JsonPatch.add("/spec", self.spec))
        # Its pods admit each other; its head admits the KubeRay operator on the dashboard port.
        add_policies(self, ray_workload(NAMESPACE, cluster.name, rayjob=False))


def finetune_entrypoint(job: RayFinetuneJob, workers: int, gate: list[str] | None = None) -> str:
    return " ".join(
        [
            "python -m training.ray_finetune",
            f"--model {job.model}",
            f"--num-workers {workers}",
            "--use-gpu",
            f"--steps {job.steps}",
            f"--batch-size {job.batch_size}",
            f"--seq-len {job.seq_len}",
            f"--data {job.data}",
            f"--storage-path {RAY_STORAGE_PATH}",
            *(gate or []),
        ]
    )


def job_gated(environment: Environment, job: RayFinetuneJob) -> bool:
    """Whether the RayJob's workers run the fabric gate (and so need its identity, k8s/charts/fabric_gate.py)."""
    # The gate proves the fabric between nodes: a one-node cluster has none to prove (GpuNodeGroupConfig.gated,
    # whose max_size also holds the spare the gang is re-placed onto).
    return job.fabric_gate and gpu_group(environment, job.gpu_group).gated


class RayJobChart(cdk8s.Chart):
    """The fine-tune as a RayJob with its own cluster on one GPU node group, torn down after."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        environment: Environment,
        lock: ImageLock,
        job: RayFinetuneJob,
        profile: FabricProfile = FabricProfile.EFA,
    ) -> None:
        super().__init__(scope, construct_id, namespace=NAMESPACE, disable_resource_name_hashes=True)
        group = gpu_group(environment, job.gpu_group)
        if on_block(group):
            raise WorkloadError(
                f"RayJob {job.name!r} runs on Capacity Block group {group.name!r}: the fine-tune saves only at its end "
                "and has no stop point, so the block's end would take every step with it. Set "
                "RayFinetuneJob(gpu_group=...) to a group that is not on a block, or train on the block with the NVRx "
                "job (NvrxFsdpJob), which checkpoints and stops before the end (docs/gpu-capacity.md)"
            )
        gpu = group.instance.gpu
        assert gpu is not None
        self.workers = group.workload_nodes * gpu.count
        # Refuses an environment without the shared claim (the workers, driver and controller among them, must see one
        # storage path).
        checkpoint_claim(environment, workload=f"RayJob {job.name}", pods=group.workload_nodes)
        gated = job_gated(environment, job)
        gate = None
        if gated:
            flags = gate_flags(
                group,
                state_dir=f"{RAY_STORAGE_PATH}/fabric-gate",
                workload=f"RayJob/{job.name}",
                run_seconds=job.active_deadline_seconds,
            )
            # Names the verdict file the driver reads on the claim (its workers write it); the failures count against
            # the RayJob's uid, which the remediation controller's answer carries (no pod of the cluster is given it).
            gate = [*flags, f"--fabric-gate-run-id={job.name}"]
        cluster = ray_cluster_spec(
            environment,
            lock,
            group=group,
            job_name=job.name,
            count=WorkerCount.fixed(group.workload_nodes),
            profile=profile,
            gated=gated,
        )
        runtime_env = {"pip": list(job.pip), "env_vars": {"HF_HUB_ENABLE_HF_TRANSFER": "0"}}
        self.workload_name = job.name
        self.spec = {
            "entrypoint": finetune_entrypoint(job, self.workers, gate),
            # The driver (and Ray Train's controller beside it) on a worker, where the claim is (head_group).
            "entrypointNumCpus": DRIVER_NUM_CPUS,
            "runtimeEnvYAML": yaml.safe_dump(runtime_env, sort_keys=True),
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": job.ttl_seconds_after_finished,
            "activeDeadlineSeconds": job.active_deadline_seconds,
            "backoffLimit": job.backoff_limit,
            "rayClusterSpec": cluster,
            "submitterPodTemplate": {
                "spec": hardened_pod(
                    {
                        "restartPolicy": "Never",
                        "nodeSelector": dict(SYSTEM_NODE_SELECTOR),
                        "containers": [
                            {
                                "name": "ray-job-submitter",
                                "image": lock.pinned(RAY_IMAGE),
                                "resources": {
                                    "requests": {"cpu": "200m", "memory": "512Mi"},
                                    "limits": {"cpu": "1", "memory": "1Gi"},
                                },
                            }
                        ],
                    }
                )
            },
        }
        cdk8s.ApiObject(
            self,
            "job",
            api_version="ray.io/v1",
            kind="RayJob",
            metadata=cdk8s.ApiObjectMetadata(
                name=job.name,
                labels={"platform/environment": environment.name, **queue_labels(environment, group.name)},
            ),
        ).add_json_patch(cdk8s.JsonPatch.add("/spec", self.spec))
        # Its cluster's pods admit each other; its head admits the submitter and the KubeRay operator on the dashboard
        # port.
        add_policies(self, ray_workload(NAMESPACE, job.name, rayjob=True))
