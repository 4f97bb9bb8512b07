"""Ray Train workload charts: the training code as a ConfigMap, one long-lived autoscaling RayCluster
per GPU node group (workers from zero, one GPU type per cluster), and a RayJob for the fine-tune
that brings its own cluster."""

from __future__ import annotations

from pathlib import Path

import cdk8s
import yaml
from constructs import Construct

from infra.spec import Environment
from infra.spec.scheduling import SYSTEM_NODE_SELECTOR
from k8s.fabric_env import FabricProfile
from k8s.fabric_gate_spec import gate_flags
from k8s.images import ImageLock
from k8s.queueing import ELASTIC_JOB_ANNOTATION, queue_labels
from k8s.ray_spec import (
    CHECKPOINT_MOUNT,
    CODE_CONFIGMAPS,
    NAMESPACE,
    RAY_IMAGE,
    WorkloadError,
    checkpoint_claim,
    code_configmap,
    gpu_group,
    hardened_pod,
    ray_cluster_spec,
)
from k8s.workloads import RayClusterConfig, RayFinetuneJob

# Ray Train's RunConfig(storage_path): on the checkpoint claim the head and every worker mount (Ray 2.58 refuses
# a local path the workers cannot see). An FSx claim rather than s3:// through pyarrow: S3 would need the image's
# AWS SDK for C++ (inside pyarrow) to take EKS Pod Identity credentials, which nobody here could verify.
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
    """The long-lived RayCluster for interactive work and `trainctl submit`: one GPU node group's workers
    (one GPU type per Ray job; a job never mixes H100 and L4 workers), started from zero by KubeRay's
    autoscaler while a job asks for GPUs, so an idle cluster holds none of the whole-node capacity a
    Job or RayJob is waiting for."""

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
        self.spec = ray_cluster_spec(
            environment, lock, group=group, job_name=cluster.name, autoscaling=cluster.autoscaling
        )
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
                # Its workers scale from zero by the autoscaler: Kueue admits each scale-up as a slice.
                annotations={ELASTIC_JOB_ANNOTATION: "true"},
            ),
        ).add_json_patch(cdk8s.JsonPatch.add("/spec", self.spec))


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
        gpu = group.instance.gpu
        assert gpu is not None
        self.workers = group.workload_nodes * gpu.count
        # Refuses an environment without the shared claim (head and workers must see one storage path).
        checkpoint_claim(environment, workload=f"RayJob {job.name}", pods=group.workload_nodes + 1)
        # The gate proves the fabric between nodes: a one-node cluster has none to prove.
        gated = job.fabric_gate and group.workload_nodes >= 2
        gate = None
        if gated:
            flags = gate_flags(
                group,
                state_dir=f"{RAY_STORAGE_PATH}/fabric-gate",
                workload=f"RayJob/{job.name}",
                run_seconds=job.active_deadline_seconds,
            )
            gate = [*flags, f"--fabric-gate-run-id={job.name}"]
        cluster = ray_cluster_spec(environment, lock, group=group, job_name=job.name, profile=profile, gated=gated)
        runtime_env = {"pip": list(job.pip), "env_vars": {"HF_HUB_ENABLE_HF_TRANSFER": "0"}}
        self.spec = {
            "entrypoint": finetune_entrypoint(job, self.workers, gate),
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
