"""Ray Train workload charts: the training code as a ConfigMap, a RayCluster with one worker
group per GPU node group, and a RayJob for the fine-tune that brings its own cluster."""

from __future__ import annotations

from pathlib import Path

import cdk8s
import yaml
from constructs import Construct

from infra.spec import Environment
from infra.spec.scheduling import SYSTEM_NODE_SELECTOR
from k8s.fabric_env import FabricProfile
from k8s.images import ImageLock
from k8s.ray_spec import CODE_CONFIGMAP, NAMESPACE, RAY_IMAGE, gpu_group, hardened_pod, ray_cluster_spec
from k8s.workloads import RayFinetuneJob

TRAINING_PACKAGE = Path(__file__).resolve().parent.parent.parent / "training"


class TrainingCodeChart(cdk8s.Chart):
    """training/*.py shipped as a ConfigMap in each workload namespace and mounted on the pods
    that run it: no image build."""

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
        for namespace in namespaces:
            cdk8s.ApiObject(
                self,
                f"code-{namespace}",
                api_version="v1",
                kind="ConfigMap",
                metadata=cdk8s.ApiObjectMetadata(name=CODE_CONFIGMAP, namespace=namespace),
            ).add_json_patch(cdk8s.JsonPatch.add("/data", files))


class RayClusterChart(cdk8s.Chart):
    """A long-lived RayCluster for interactive work and `trainctl submit`."""

    def __init__(self, scope: Construct, construct_id: str, *, environment: Environment, lock: ImageLock) -> None:
        super().__init__(scope, construct_id, namespace=NAMESPACE, disable_resource_name_hashes=True)
        self.spec = ray_cluster_spec(environment, lock)
        cdk8s.ApiObject(
            self,
            "cluster",
            api_version="ray.io/v1",
            kind="RayCluster",
            metadata=cdk8s.ApiObjectMetadata(name="training", labels={"platform/environment": environment.name}),
        ).add_json_patch(cdk8s.JsonPatch.add("/spec", self.spec))


def finetune_entrypoint(job: RayFinetuneJob, workers: int) -> str:
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
            "--storage-path /tmp/ray/train-results",
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
        cluster = ray_cluster_spec(environment, lock, groups=(group,), profile=profile)
        runtime_env = {"pip": list(job.pip), "env_vars": {"HF_HUB_ENABLE_HF_TRANSFER": "0"}}
        self.spec = {
            "entrypoint": finetune_entrypoint(job, self.workers),
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
            metadata=cdk8s.ApiObjectMetadata(name=job.name, labels={"platform/environment": environment.name}),
        ).add_json_patch(cdk8s.JsonPatch.add("/spec", self.spec))
