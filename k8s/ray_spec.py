"""RayCluster specs built from the environment, the instance facts and the image lock.

Plain dictionaries in the shape of the KubeRay v1 CRDs (k8s/crds/kuberay-v1.7.0/), so the
same spec serves a standalone RayCluster and the cluster a RayJob brings with it; the
gates and tests validate them against the CRD schema.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from infra.spec import Environment, GpuNodeGroupConfig, InstanceType
from infra.spec.namespaces import RAY
from infra.spec.network_policies import RAY_DASHBOARD_PORT, ray_workload_labels
from infra.spec.scheduling import SYSTEM_NODE_SELECTOR, gpu_group_selector, gpu_toleration
from infra.spec.versions import RAY_VERSION
from k8s.fabric_env import FabricProfile, fabric_env
from k8s.fabric_gate_spec import TOKEN_ACK, gate_env, gate_pod
from k8s.images import ImageLock
from k8s.nvrx_support import NVRX_SUPPORT
from k8s.ofi_nccl import INPROCESS, LEAK_FIXED
from training.emf import CONTAINER_LOG_ENV, CONTAINER_STDOUT, INSTANCE_TYPE_ENV, JOB_NAME_ENV

RAY_IMAGE = "ray-train"
CODE_CONFIGMAP = "training-code"
# The fabric tools (training/fabric_*.py, nccl_tests.py) in a ConfigMap of their own: with them, one ConfigMap
# would pass the 256 KiB that `kubectl apply` can store in its last-applied annotation.
FABRIC_CODE_CONFIGMAP = "training-code-fabric"
CODE_CONFIGMAPS = (CODE_CONFIGMAP, FABRIC_CODE_CONFIGMAP)


def code_configmap(filename: str) -> str:
    """Which ConfigMap carries training/<filename>."""
    return FABRIC_CODE_CONFIGMAP if filename.startswith("fabric_") or filename == "nccl_tests.py" else CODE_CONFIGMAP


CODE_ROOT = "/opt/ml-platform"
# Ray's ports: GCS, dashboard and job API, client. ClusterIP only: nothing leaves the cluster.
HEAD_PORTS = (("gcs", 6379), ("dashboard", RAY_DASHBOARD_PORT), ("client", 10001))


class WorkloadError(ValueError):
    """A workload that does not fit the environment it is synthesized for."""


# Where every workload mounts the checkpoint claim (FSx for Lustre, infra/addons/fsx_checkpoints.py): the NVRx
# job in `training`, Ray head and workers in `ray` (Ray Train's storage_path lives under it).
CHECKPOINT_MOUNT = "/checkpoints"
CHECKPOINT_VOLUME = "checkpoints"
# libfabric registers (pins) every buffer it hands to the EFA device; with CAP_IPC_LOCK the kernel does not hold
# the registration to RLIMIT_MEMLOCK (ib_umem_get charges pinned pages against it only without the capability).
# The AL2023 EKS AMI template sets no LimitMEMLOCK for containerd (amazon-eks-ami templates/al2023/runtime/rootfs/
# etc/systemd/system/containerd.service.d/ holds only 00-runtime-slice.conf), so containers get systemd's default
# rlimit, far below what EFA registers: EFA pods add IPC_LOCK and check for `unlimited` or the capability.
MEMLOCK_NEEDED = "unlimited"


@dataclass(frozen=True, kw_only=True)
class Resources:
    cpu: str
    memory: str


def head_resources(instance: InstanceType) -> tuple[Resources, Resources]:
    """(requests, limits) for the head on a system node: half the node requested, three
    quarters at most, the rest for the operator and cluster add-ons (m7i.xlarge: 2/8Gi, 3/12Gi)."""
    return (
        Resources(cpu=str(instance.vcpus // 2), memory=f"{instance.memory_gib // 2}Gi"),
        Resources(cpu=str(instance.vcpus * 3 // 4), memory=f"{instance.memory_gib * 3 // 4}Gi"),
    )


def worker_resources(instance: InstanceType) -> Resources:
    """What a worker pod may use of a GPU node: five sixths of its CPU and memory. The last
    sixth covers kubelet and system reservations and the DaemonSets (CNI, kube-proxy, device
    plugins, node monitoring, FSx node driver). g6.12xlarge: 40 CPU, 160Gi."""
    return Resources(cpu=str(instance.vcpus * 5 // 6), memory=f"{instance.memory_gib * 5 // 6}Gi")


# Restricted-style hardening: no privilege escalation, no Linux capabilities (EFA containers add IPC_LOCK alone),
# the runtime's seccomp profile, no Kubernetes API token (no Ray pod talks to the API server).
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
POD_SECURITY = {"seccompProfile": {"type": "RuntimeDefault"}}


def hardened_pod(spec: dict[str, Any]) -> dict[str, Any]:
    """`spec` with the pod- and container-level settings above applied; a container that brings
    its own securityContext (built on CONTAINER_SECURITY, e.g. with IPC_LOCK for EFA) keeps it."""
    containers = [
        {**c, "securityContext": c.get("securityContext", dict(CONTAINER_SECURITY))} for c in spec["containers"]
    ]
    return {
        **spec,
        "containers": containers,
        "securityContext": dict(POD_SECURITY),
        "automountServiceAccountToken": False,
    }


def env_list(values: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in values.items()]


def code_volume() -> tuple[dict[str, Any], dict[str, Any]]:
    """(volume, mount) of the training-code ConfigMaps, projected into one directory at CODE_ROOT/training."""
    volume = {"name": "training-code", "projected": {"sources": [{"configMap": {"name": n}} for n in CODE_CONFIGMAPS]}}
    mount = {"name": "training-code", "mountPath": f"{CODE_ROOT}/training", "readOnly": True}
    return volume, mount


@dataclass(frozen=True, kw_only=True)
class GpuPodParts:
    """What every whole-node GPU container needs: the node's GPUs and EFA interfaces with CPU and
    memory (requests = limits), the fabric env, /dev/shm and the training code."""

    resources: dict[str, Any]
    env: list[dict[str, str]]
    mounts: list[dict[str, Any]]
    volumes: list[dict[str, Any]]


def gpu_pod_parts(group: GpuNodeGroupConfig, profile: FabricProfile = FabricProfile.EFA) -> GpuPodParts:
    instance = group.instance
    assert instance.gpu is not None  # GPU groups are validated on construction
    size = worker_resources(instance)
    limits = {
        "cpu": size.cpu,
        "memory": size.memory,
        "nvidia.com/gpu": str(instance.gpu.count),
        "vpc.amazonaws.com/efa": str(group.efa_interface_count),
    }
    memory_gib = int(size.memory.removesuffix("Gi"))
    code, code_mount = code_volume()
    return GpuPodParts(
        # Requests equal limits: Guaranteed QoS, so NCCL threads are never throttled.
        resources={"requests": dict(limits), "limits": dict(limits)},
        env=env_list({**fabric_env(instance, profile), "PYTHONPATH": CODE_ROOT}),
        mounts=[{"name": "dshm", "mountPath": "/dev/shm"}, code_mount],
        volumes=[
            # NCCL's intra-node transport and the data loaders use shared memory; the
            # container default (64Mi) makes NCCL fail. A quarter of the pod's memory.
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{memory_gib // 4}Gi"}},
            code,
        ],
    )


# Ray folds lines that differ only in words containing digits into "[repeated Nx across cluster]" in the driver log
# (Ray logging docs), which hides all but one rank's NCCL network lines from a fabric verdict: off on every Ray pod.
RAY_LOG_ENV: Mapping[str, str] = MappingProxyType({"RAY_DEDUP_LOGS": "0"})


def emf_env(*, job_name: str, group: GpuNodeGroupConfig) -> dict[str, str]:
    """What training/emf.py reads: the job and instance type its EMF lines carry (the alarms group by them). The lines
    reach CloudWatch from the container's own log (the add-on's Fluent Bit reads the workload namespaces' container
    logs: infra/addons/observability.py), so there is no endpoint to name."""
    return {JOB_NAME_ENV: job_name, INSTANCE_TYPE_ENV: group.instance_type}


# A Ray worker's training processes write to Ray's log files, not to the container's stdout: training/emf.py copies
# each line to the container's stdout as well, where Fluent Bit reads it.
RAY_WORKER_EMF_ENV: Mapping[str, str] = MappingProxyType({CONTAINER_LOG_ENV: CONTAINER_STDOUT})


# The packages the Ray fine-tune imports, checked at each worker's start at the versions the lock records.
RAY_WORKER_PACKAGES = ("ray", "torch", "transformers")
PRECONDITIONS_CONTAINER = "preconditions"
_WORKER_IPC_LOCK_ACK = "CKV_K8S_25=IPC_LOCK only: EFA memory registration pins buffers"


# What a job's driver asks of Ray (RayJob entrypointNumCpus, `ray job submit --entrypoint-num-cpus`): any resource
# asked for lets Ray's job manager place the driver off the head (ray/dashboard/modules/job/job_manager.py
# _get_label_selector); one CPU of a worker's 40 or more.
DRIVER_NUM_CPUS = 1
# The head advertises no CPUs to Ray, so nothing that asks for one (a job's driver with entrypoint_num_cpus, Ray Train's
# workers, tasks) is scheduled on it; it runs GCS, the dashboard and the job API only.
HEAD_START_PARAMS: Mapping[str, str] = MappingProxyType({"dashboard-host": "0.0.0.0", "num-cpus": "0", "num-gpus": "0"})


def head_group(environment: Environment, lock: ImageLock, *, job_name: str) -> dict[str, Any]:
    """The head on any system node, without the checkpoint claim. Ray Train 2.58 writes its storage marker from the
    controller, which it attaches to the node of the job's driver (ray/train/v2/api/data_parallel_trainer.py
    _initialize_and_run_controller: label_selector on the driver's node id), and Ray's job manager pins a driver to
    the head only when the job asks for no resources (ray/dashboard/modules/job/job_manager.py _get_label_selector):
    the RayJob's entrypointNumCpus (and `trainctl submit`'s --entrypoint-num-cpus) with this head's num-cpus 0 put
    driver and controller on a worker, which mounts the claim (worker_group). Without the claim the head is not
    pinned to the file system's zone, where one system node could not hold both clusters' heads (issue 22 #1)."""
    instance = environment.system_nodes.instance
    requests, limits = head_resources(instance)
    code, code_mount = code_volume()
    spec = hardened_pod(
        {
            "nodeSelector": dict(SYSTEM_NODE_SELECTOR),
            "containers": [
                {
                    "name": "ray-head",
                    "image": lock.pinned(RAY_IMAGE),
                    "ports": [{"name": name, "containerPort": port} for name, port in HEAD_PORTS],
                    "env": env_list(
                        {
                            # The head runs on a GPU-less node; without this the image's
                            # NVIDIA hooks fail with "failed to initialize NVML".
                            "NVIDIA_VISIBLE_DEVICES": "void",
                            "PYTHONPATH": CODE_ROOT,
                            **RAY_LOG_ENV,
                        }
                    ),
                    "resources": {
                        "requests": {"cpu": requests.cpu, "memory": requests.memory},
                        "limits": {"cpu": limits.cpu, "memory": limits.memory},
                    },
                    "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", "ray stop"]}}},
                    "volumeMounts": [{"name": "ray-logs", "mountPath": "/tmp/ray"}, code_mount],
                }
            ],
            "volumes": [{"name": "ray-logs", "emptyDir": {}}, code],
        }
    )
    return {
        "serviceType": "ClusterIP",
        "rayStartParams": dict(HEAD_START_PARAMS),
        "template": {
            "metadata": {"labels": {"app.kubernetes.io/component": "ray-head", **ray_workload_labels(job_name)}},
            "spec": spec,
        },
    }


@dataclass(frozen=True, kw_only=True)
class WorkerCount:
    """A worker group's replicas and the bounds KubeRay clamps them to (utils/util.go GetWorkerGroupDesiredReplicas),
    while Kueue counts `replicas` as written (raycluster/common.go effectiveWorkerCount)."""

    replicas: int
    min_replicas: int
    max_replicas: int

    @classmethod
    def fixed(cls, workers: int) -> WorkerCount:
        return cls(replicas=workers, min_replicas=workers, max_replicas=workers)


def worker_group(
    environment: Environment,
    group: GpuNodeGroupConfig,
    lock: ImageLock,
    profile: FabricProfile,
    count: WorkerCount,
    *,
    job_name: str,
    gated: bool = False,
) -> dict[str, Any]:
    """One GPU worker group; `gated`: its pods run the fabric gate (training/fabric_gate.py) with its identity."""
    parts = gpu_pod_parts(group, profile)
    gpus = parts.resources["limits"]["nvidia.com/gpu"]
    mounts: list[dict[str, Any]] = [{"name": "ray-logs", "mountPath": "/tmp/ray"}, *parts.mounts]
    volumes: list[dict[str, Any]] = [{"name": "ray-logs", "emptyDir": {}}, *parts.volumes]
    if environment.add_ons.checkpoint_storage is not None:
        volumes.append(
            checkpoint_claim(environment, workload=f"Ray worker group {group.name}", pods=count.max_replicas)
        )
        mounts.append(checkpoint_mount())
    image = lock.pinned(RAY_IMAGE)
    security = {**CONTAINER_SECURITY, "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]}}
    checks = precondition_argv(
        lock=lock,
        image=RAY_IMAGE,
        packages=image_packages(lock, RAY_IMAGE, RAY_WORKER_PACKAGES),
        group=group,
        profile=profile,
    )
    pod = hardened_pod(
        {
            "nodeSelector": gpu_group_selector(group.name),
            "tolerations": [gpu_toleration()],
            # KubeRay owns the worker container's command (`ray start`), so the pod's preconditions run
            # first as an init container of the same image with the same GPUs and EFA devices (the kubelet
            # hands an init container's devices on to the app container): a worker that cannot train
            # never joins the cluster, and `kubectl describe` names the failed check.
            "initContainers": [
                {
                    "name": PRECONDITIONS_CONTAINER,
                    "image": image,
                    "command": checks,
                    "env": parts.env,
                    "resources": parts.resources,
                    "volumeMounts": parts.mounts,
                    "securityContext": security,
                }
            ],
            "containers": [
                {
                    "name": "ray-worker",
                    "image": image,
                    "env": [
                        *parts.env,
                        *env_list({**RAY_LOG_ENV, **emf_env(job_name=job_name, group=group), **RAY_WORKER_EMF_ENV}),
                        *(gate_env() if gated else []),
                    ],
                    "resources": parts.resources,
                    "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", "ray stop"]}}},
                    "volumeMounts": mounts,
                    # EFA memory registration (see MEMLOCK_NEEDED), as on the NVRx and fabric pods.
                    "securityContext": security,
                }
            ],
            "volumes": volumes,
        }
    )
    annotations = {"checkov.io/skip1": _WORKER_IPC_LOCK_ACK}
    if gated:
        pod = gate_pod(pod)
        annotations["checkov.io/skip2"] = TOKEN_ACK
    return {
        "groupName": group.name,
        "replicas": count.replicas,
        "minReplicas": count.min_replicas,
        "maxReplicas": count.max_replicas,
        # Must equal the GPU limit, or Ray schedules more (or fewer) GPU tasks than exist.
        "rayStartParams": {"num-gpus": gpus},
        "template": {
            "metadata": {
                "labels": {
                    "app.kubernetes.io/component": "ray-worker",
                    "platform/gpu-group": group.name,
                    **ray_workload_labels(job_name),
                },
                "annotations": annotations,
            },
            "spec": pod,
        },
    }


def gpu_group(environment: Environment, name: str | None) -> GpuNodeGroupConfig:
    groups = {g.name: g for g in environment.gpu_node_groups}
    if not groups:
        raise WorkloadError(f"environment {environment.name!r} has no GPU node group for Ray workers")
    if name is None:
        return environment.gpu_node_groups[0]
    if name not in groups:
        raise WorkloadError(
            f"gpu_group={name!r} is not a GPU node group of environment {environment.name!r}; "
            f"allowed: {', '.join(groups)}"
        )
    return groups[name]


def ray_cluster_spec(
    environment: Environment,
    lock: ImageLock,
    *,
    group: GpuNodeGroupConfig,
    job_name: str,
    count: WorkerCount,
    profile: FabricProfile = FabricProfile.EFA,
    gated: bool = False,
) -> dict[str, Any]:
    """A Ray cluster over one GPU node group (one GPU type per Ray job: a job never mixes H100 and L4 workers) with
    `count` workers and no autoscaler: Kueue v0.19.2 admits an autoscaling RayCluster only as an elastic job, whose
    scale-up slices skip the gang guard (k8s/charts/ray.py RayClusterChart)."""
    if not 0 <= count.replicas <= group.scaling.max_size:
        raise WorkloadError(
            f"{job_name}: {count.replicas} workers on GPU group {group.name!r}, which has at most "
            f"{group.scaling.max_size} nodes (scaling.max_size); ask for 0 to {group.scaling.max_size}"
        )
    return {
        "rayVersion": RAY_VERSION,
        "enableInTreeAutoscaling": False,
        "headGroupSpec": head_group(environment, lock, job_name=job_name),
        "workerGroupSpecs": [worker_group(environment, group, lock, profile, count, job_name=job_name, gated=gated)],
    }


NAMESPACE = RAY.name


def checkpoint_claim(environment: Environment, *, workload: str, pods: int) -> dict[str, Any]:
    """The volume of the checkpoint claim; an environment without one cannot run a multi-pod workload.

    A per-pod emptyDir or node disk is not shared: pod 1's ranks cannot write into the step directory rank 0
    created on pod 0 (NVRx, DCP), and Ray Train 2.58 refuses a storage path the head and workers do not share
    ("A local path on the head node is not accessible by worker nodes"). Raising here keeps such a job out of dist/.
    """
    storage = environment.add_ons.checkpoint_storage
    if storage is None:
        raise WorkloadError(
            f"environment {environment.name!r}: add_ons.checkpoint_storage=None, but {workload} runs {pods} pods "
            "that must share one checkpoint directory; fix: give the environment a CheckpointStorageConfig in "
            "infra/spec/environments.py (FSx for Lustre, e.g. deployment=SCRATCH_2, storage_capacity_gib=1200)"
        )
    return {"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": storage.claim_name}}


def checkpoint_mount() -> dict[str, Any]:
    return {"name": CHECKPOINT_VOLUME, "mountPath": CHECKPOINT_MOUNT}


def image_packages(lock: ImageLock, image: str, names: tuple[str, ...]) -> list[str]:
    """NAME==VERSION for `names`, versions from the image's runtime facts in the lock (one place for each)."""
    runtime = lock.get(image).runtime
    if runtime is None:
        raise WorkloadError(f"images.{image}.runtime is missing in the lock: the pods cannot check their packages")
    missing = [n for n in names if n not in runtime.packages]
    if missing:
        raise WorkloadError(f"images.{image}.runtime.packages lacks {missing}: record their versions in the lock")
    return [f"{n}=={runtime.packages[n]}" for n in names]


def precondition_argv(
    *,
    lock: ImageLock,
    image: str,
    packages: list[str],
    group: GpuNodeGroupConfig,
    profile: FabricProfile = FabricProfile.EFA,
    restarts: tuple[str, ...] = (),
) -> list[str]:
    """`python -m training.pod_checks` with what this pod must find before it trains: the image's Python (the
    lock's runtime facts), `packages` (NAME==VERSION), the NCCL net plugin of the fabric profile and the group's
    EFA devices, and memlock; with `restarts` (k8s/ofi_nccl.py restart_mechanisms), an aws-ofi-nccl without the
    per-teardown leak when the plugin is in use, and for in-process restart an NCCL outside the range it crashes on.
    Exit 2 with the failed check named (training/pod_checks.py)."""

    runtime = lock.get(image).runtime
    if runtime is None:
        raise WorkloadError(f"images.{image}.runtime is missing in the lock: the pods cannot check their Python")
    argv = ["python", "-m", "training.pod_checks", "--python", runtime.python]
    for package in packages:
        argv += ["--package", package]
    plugin = fabric_env(group.instance, profile).get("NCCL_NET_PLUGIN")
    if plugin and plugin != "none":
        argv += ["--nccl-net-plugin", plugin, "--efa-devices", str(group.efa_interface_count)]
    for mechanism in restarts:
        argv += ["--restart", mechanism]
    if restarts and plugin == "ofi":
        argv += ["--min-aws-ofi-nccl", str(LEAK_FIXED)]
    if INPROCESS in restarts:
        low, high = NVRX_SUPPORT.inprocess_nccl_bad
        argv += ["--inprocess-bad-nccl", f"{low}-{high}"]
    return [*argv, "--memlock", MEMLOCK_NEEDED]
