"""RayCluster and RayJob as KubeRay v1.7.0 runs them, on rehearsal pods.

Mirrored from ray-project/kuberay at tag v1.7.0 (read there, cited per fact):
- ray-operator/controllers/ray/common/pod.go: the Ray container's command becomes
  `/bin/bash -c -- "ulimit -n ${RAY_START_ULIMIT_OPEN_FILES:-65536}; ray start [--head] <params>"`
  (generateRayStartCommand, convertParamMap: flags sorted, "true" values as bare switches); missing
  params: `num-cpus` from the CPU limit (else request), `memory` from the memory limit in bytes, GPUs
  from `nvidia.com/gpu`, `metrics-export-port=8080`, `block`, `dashboard-agent-listen-port=52365`,
  head `dashboard-host=0.0.0.0`, worker `address=<FQDN of the head Service>:6379`
  (setMissingRayStartParams); injected env RAY_CLUSTER_NAME, RAY_CLUSTER_NAMESPACE,
  RAY_CLOUD_INSTANCE_ID, RAY_NODE_TYPE_NAME, KUBERAY_GEN_RAY_START_CMD, RAY_PORT, RAY_ADDRESS
  (head 127.0.0.1:6379, worker FQ_RAY_IP:6379), FQ_RAY_IP and RAY_IP on workers,
  RAY_USAGE_STATS_KUBERAY_IN_USE=1 (setContainerEnvVars); workers get the `wait-gcs-ready` init
  container that loops on `ray health-check` against the head.
- ray-operator/controllers/ray/utils/util.go: pod names `<cluster>-head-<5>` and
  `<cluster>-<group>-worker-<5>` (PodName), head Service `<cluster>-head-svc` (GenerateHeadServiceName),
  its FQDN `<svc>.<ns>.svc.cluster.local` (GenerateFQDNServiceName), a RayJob's cluster
  `<rayjob>-<5>` (GenerateRayClusterName) and job id `<rayjob>-<5>` (GenerateRayJobId).
- ray-operator/controllers/ray/common/job.go (BuildJobSubmitCommand, K8sJobMode) and
  rayjob_controller.go (configureSubmitterContainer): the submitter is a Job named after the RayJob
  whose container runs `/bin/bash -ce --` with: wait for the dashboard's `api/gcs_healthz`, then
  `ray job submit --address http://<head-svc FQDN>:8265 --no-wait --runtime-env-json ... --submission-id
  <id> [--entrypoint-num-cpus N] -- <entrypoint>` unless `ray job status` knows the id, then `ray job logs
  --follow`; env RAY_DASHBOARD_ADDRESS, RAY_JOB_SUBMISSION_ID, PYTHONUNBUFFERED=1. The RayJob's jobStatus is the Ray
  job's status read from the dashboard; jobDeploymentStatus Complete, or Failed when the Ray job
  FAILED (reason AppFailed) or the deadline passed; shutdownAfterJobFinishes deletes the cluster.

Ray's dashboard: `ray job submit`, the RayJob's jobStatus and the RayCluster node check all go through the
head's dashboard HTTP server, which Ray starts only when its dashboard packages are importable (ray[default];
otherwise the dashboard runs `--minimal` and logs "http server disabled": ray/_private/services.py
start_api_server, ray/_private/utils.py get_dashboard_dependency_error, Ray 2.58). The images ship
ray[default]; the pods here run this machine's Python, so a minimal Ray is refused before any pod starts
(`dashboard_dependency_error`) instead of a submitter that waits forever for a dashboard that never answers.

Rehearsal difference: the dashboard is read from inside the head pod's network namespace (KubeRay reads it
through the Service). `num-gpus` is KubeRay's, on CPU too: Ray places GPU workers by the count.
"""

from __future__ import annotations

import copy
import json
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any

import yaml

from infra.spec.network_policies import RAY_DASHBOARD_PORT, RAY_JOB_KIND, RAY_ORIGIN_KIND_LABEL, RAY_ORIGIN_NAME_LABEL
from rehearse.controller import PodAPI
from rehearse.errors import RehearsalError
from rehearse.jobs import JobController
from rehearse.pods import CLUSTER_DOMAIN, Pod, PodPlan, object_uid, random_suffix

GCS_PORT = 6379
METRICS_PORT = 8080
DASHBOARD_AGENT_LISTEN_PORT = 52365
RAY_CONTAINER = 0
AUTOSCALER_CPU = "500m"
AUTOSCALER_MEMORY = "512Mi"
CLUSTER_SELECTOR_KEY = "ray.io/cluster"  # utils/constant.go RayJobClusterSelectorKey
TERMINAL_JOB_STATUSES = ("SUCCEEDED", "FAILED", "STOPPED")
# checkBackoffLimitAndUpdateStatusIfNeeded (rayjob_controller.go): the failure reasons backoffLimit never retries.
NOT_RETRIED = ("DeadlineExceeded", "JobStatusCheckTimeoutExceeded")
# What KubeRay's submitter Job uses when submitterConfig.backoffLimit is unset.
SUBMITTER_BACKOFF_LIMIT = 2
# KubeRay replaces an ended RayCluster pod without limit; the rehearsal reports a cluster that needed more.
MAX_REPLACED_PODS = 5

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


RAY_TRAIN_HEALTH_CHECK = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
REHEARSAL_HEALTH_CHECK_S = "0.5"


def pod_labels(node_type: str, cluster: str, group: str, template_labels: dict[str, str]) -> dict[str, str]:
    """KubeRay v1.7.0 common/pod.go labelPod: its labels, then the template's, which override all but the cluster,
    node type and group (utils/constant.go names them). NetworkPolicies select Ray pods by these."""
    identifier = f"{cluster}-{node_type}"[-63:]  # utils.CheckLabel(utils.GenerateIdentifier(...)): the last 63
    if not identifier[0].isalnum():
        identifier = "r" + identifier[1:]
    fixed = {"ray.io/cluster": cluster, "ray.io/node-type": node_type, "ray.io/group": group}
    return {
        "ray.io/is-ray-node": "yes",
        "ray.io/identifier": identifier,
        "app.kubernetes.io/name": "kuberay",
        "app.kubernetes.io/created-by": "kuberay-operator",
        **template_labels,
        **fixed,
    }


def submitter_labels(rayjob: str) -> dict[str, str]:
    """The labels KubeRay v1.7.0 puts on the submitter Job's pod template (rayjob_controller.go
    getSubmitterTemplate; utils/constant.go RayOriginatedFromCRDLabelValue(RayJobCRD) is "RayJob")."""
    return {
        RAY_ORIGIN_NAME_LABEL: rayjob,
        RAY_ORIGIN_KIND_LABEL: RAY_JOB_KIND,
        "app.kubernetes.io/created-by": "kuberay-operator",
    }


def gpu_limit(container: dict[str, Any]) -> int:
    """The GPUs KubeRay v1.7.0 has Ray advertise for a container (common/pod.go addWellKnownAcceleratorResources): the
    first limit, keys sorted, whose name ends in "gpu" and is non-zero (utils/resources.go IsGPUResourceKey; MIG
    slices are not modelled); 0 without one."""
    limits = (container.get("resources") or {}).get("limits") or {}
    for key in sorted(limits):
        if key.endswith("gpu") and quantity(limits[key]) != 0:
            return int(quantity(limits[key]))
    return 0


def quantity(text: str | int) -> float:
    """A Kubernetes resource quantity as a number (CPU cores or bytes)."""
    value = str(text)
    if value.endswith("m"):
        return float(value[:-1]) / 1000
    for table in (_BINARY, _DECIMAL):
        for suffix, factor in table.items():
            if value.endswith(suffix):
                return float(value[: -len(suffix)]) * factor
    return float(value)


def convert_params(params: dict[str, str]) -> str:
    flags = []
    for key in sorted(params):
        value = str(params[key])
        if value.lower() in ("true", "false") and key not in ("log-color", "include-dashboard", "include-log-monitor"):
            if value.lower() == "true":
                flags.append(f"--{key}")
        else:
            flags.append(f"--{key}={value}")
    return " ".join(flags)


@dataclass
class RayClusterPods:
    """The pods of one RayCluster spec, built as KubeRay builds them."""

    name: str
    namespace: str
    spec: dict[str, Any]
    workload: str
    notes: list[str] = field(default_factory=list)
    # The RayCluster's metadata.ownerReferences: a RayJob's cluster is owned by it (KubeRay v1.7.0
    # rayjob_controller.go constructRayClusterForRayJob: ctrl.SetControllerReference(rayJobInstance, rayCluster)).
    owner_references: list[dict[str, Any]] = field(default_factory=list)

    @property
    def uid(self) -> str:
        return object_uid("RayCluster", self.namespace, self.name)

    @property
    def head_service(self) -> str:
        return f"{self.name}-head-svc"

    @property
    def head_fqdn(self) -> str:
        return f"{self.head_service}.{self.namespace}.svc.{CLUSTER_DOMAIN}"

    def services(self) -> list[dict[str, Any]]:
        return [
            {
                "metadata": {"name": self.head_service, "namespace": self.namespace},
                "spec": {"selector": {"ray.io/cluster": self.name, "ray.io/node-type": "head"}},
            }
        ]

    def _start_params(self, node_type: str, params: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
        result = {k: str(v) for k, v in params.items()}
        resources = container.get("resources", {})
        limits, requests = resources.get("limits", {}), resources.get("requests", {})
        if node_type == "worker":
            result.setdefault("address", f"{self.head_fqdn}:{GCS_PORT}")
        else:
            result.setdefault("dashboard-host", "0.0.0.0")
        result.setdefault("metrics-export-port", str(METRICS_PORT))
        result["block"] = "true"
        result.setdefault("dashboard-agent-listen-port", str(DASHBOARD_AGENT_LISTEN_PORT))
        cpu = limits.get("cpu") or requests.get("cpu")
        if "num-cpus" not in result and cpu:
            result["num-cpus"] = str(int(quantity(cpu)))
        if "memory" not in result and limits.get("memory"):
            result["memory"] = str(int(quantity(limits["memory"])))
        # Kept on CPU: Ray only schedules against the count and opens no device for it, and Ray Train places one-GPU
        # workers by it (4 per g6 node); training/ray_finetune.py plan_device computes on CPU in a rehearsal.
        gpus = gpu_limit(container)
        if "num-gpus" not in result and gpus:
            result["num-gpus"] = str(gpus)
        return result

    def plan(self, node_type: str, group: dict[str, Any]) -> PodPlan:
        template = copy.deepcopy(group["template"])
        spec = template["spec"]
        container = spec["containers"][RAY_CONTAINER]
        group_name = "headgroup" if node_type == "head" else group["groupName"]
        name = (
            f"{self.name}-head-{random_suffix()}"
            if node_type == "head"
            else f"{self.name}-{group_name}-worker-{random_suffix()}"
        )
        params = self._start_params(node_type, group.get("rayStartParams", {}), container)
        ray_start = f"ray start{' --head' if node_type == 'head' else ''} {convert_params(params)}"
        command = f"ulimit -n ${{RAY_START_ULIMIT_OPEN_FILES:-65536}}; {ray_start}"
        user_cmd = " ".join([*container.get("command", []), *container.get("args", [])])
        if "ray start" not in user_cmd:
            container["command"] = ["/bin/bash", "-c", "--"]
            container["args"] = [f"{user_cmd} && {command}" if user_cmd else command]
        address = "127.0.0.1" if node_type == "head" else self.head_fqdn
        env = [
            {"name": "RAY_CLUSTER_NAME", "value": self.name},
            {"name": "RAY_CLUSTER_NAMESPACE", "value": self.namespace},
            {"name": "RAY_CLOUD_INSTANCE_ID", "value": name},
            {"name": "RAY_NODE_TYPE_NAME", "value": group_name},
            {"name": "KUBERAY_GEN_RAY_START_CMD", "value": ray_start},
            {"name": "RAY_PORT", "value": str(GCS_PORT)},
            {"name": "RAY_ADDRESS", "value": f"{address}:{GCS_PORT}"},
            {"name": "RAY_USAGE_STATS_KUBERAY_IN_USE", "value": "1"},
            {"name": "RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE", "value": "1"},
        ]
        if node_type == "worker":
            env += [
                {"name": "FQ_RAY_IP", "value": self.head_fqdn},
                {"name": "RAY_IP", "value": self.head_service},
            ]
            wait = (
                "SECONDS=0; while true; do "
                f"if ray health-check --address {self.head_fqdn}:{GCS_PORT} > /dev/null 2>&1; then "
                'echo "GCS is ready."; break; fi; '
                'echo "$SECONDS seconds elapsed: Waiting for GCS to be ready."; sleep 5; done'
            )
            spec["initContainers"] = [
                {
                    "name": "wait-gcs-ready",
                    "image": container.get("image"),
                    "command": ["/bin/bash", "-c", "--"],
                    "args": [wait],
                    "env": list(container.get("env", [])),
                    "volumeMounts": list(container.get("volumeMounts", [])),
                },
                *spec.get("initContainers", []),
            ]
        # A rehearsal difference: Ray Train 2.58's controller notices a run's end at a health-check poll, every 2 s by
        # default (ray/train/v2/_internal/constants.py DEFAULT_HEALTH_CHECK_INTERVAL_S); 0.5 s here, unless set.
        if not any(e.get("name") == RAY_TRAIN_HEALTH_CHECK for e in container.get("env", [])):
            env.append({"name": RAY_TRAIN_HEALTH_CHECK, "value": REHEARSAL_HEALTH_CHECK_S})
        container["env"] = [*container.get("env", []), *env]
        # RayCluster pods are restartPolicy Always by default: a failed Ray container restarts in place.
        spec.setdefault("restartPolicy", "Always")
        labels = pod_labels(node_type, self.name, group_name, template.get("metadata", {}).get("labels", {}))
        unrun = []
        if node_type == "head" and self.spec.get("enableInTreeAutoscaling"):
            unrun.append(self.autoscaler_container())
            self.notes.append("head: KubeRay's autoscaler sidecar is counted by a cluster's scheduler, not run")
        return PodPlan(
            name=name,
            namespace=self.namespace,
            spec=spec,
            workload=self.workload,
            labels=labels,
            unrun_containers=unrun,
            # KubeRay v1.7.0 raycluster_controller.go createHeadPod/createWorkerPod:
            # controllerutil.SetControllerReference(instance, &pod): controller and blockOwnerDeletion true.
            owner_references=[
                {
                    "apiVersion": "ray.io/v1",
                    "kind": "RayCluster",
                    "name": self.name,
                    "uid": self.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        )

    def autoscaler_container(self) -> dict[str, Any]:
        """The sidecar KubeRay adds to the head pod with enableInTreeAutoscaling (ray-operator/controllers/
        ray/common/pod.go BuildAutoscalerContainer: requests and limits 500m / 512Mi unless
        autoscalerOptions.resources says otherwise)."""
        options = self.spec.get("autoscalerOptions") or {}
        resources = options.get("resources") or {
            "requests": {"cpu": AUTOSCALER_CPU, "memory": AUTOSCALER_MEMORY},
            "limits": {"cpu": AUTOSCALER_CPU, "memory": AUTOSCALER_MEMORY},
        }
        return {"name": "autoscaler", "image": options.get("image", "(the head's image)"), "resources": resources}

    def plans(self) -> list[PodPlan]:
        plans = [self.plan("head", self.spec["headGroupSpec"])]
        for group in self.spec.get("workerGroupSpecs", []):
            if group.get("suspend"):
                continue
            plans += [self.plan("worker", group) for _ in range(int(group.get("replicas", 1)))]
        return plans


def dashboard_dependency_error() -> str | None:
    """Why this Python environment's Ray would start its dashboard without the HTTP server, or None."""
    from ray._private.utils import get_dashboard_dependency_error

    error = get_dashboard_dependency_error()
    if error is None:
        return None
    import ray

    return (
        f"Ray's dashboard HTTP server (ray job submit, jobStatus, the node check) needs ray[default], and this "
        f"Python environment ({sys.prefix}) has a minimal Ray: {error}. The Ray images ship ray[default]; install "
        f"ray[default]=={ray.__version__} in the environment the rehearsal runs pods with"
    )


@dataclass
class RayClusterController:
    """A standalone RayCluster: brought up, Ready once every Ray node has joined the head, then kept running
    until the run ends (loop.py: every finite workload done, or only clusters and each is Ready) or --timeout.

    KubeRay v1.7.0 (ray-operator/controllers/ray/raycluster_controller.go) never deletes a RayCluster of its
    own accord: it lives until it is deleted, so a Job of the same run may submit to it for as long as it runs.
    Ready here is every Ray node ALIVE in the head's dashboard (KubeRay's state `ready`: all pods running and
    ready, utils.CheckAllPodsRunning/calculateStatus), and, as in KubeRay, once Ready it stays Ready."""

    obj: dict[str, Any]
    kind: str = "RayCluster"
    pods: list[Pod] = field(default_factory=list)
    started: float = 0.0
    finished: float | None = None
    status: str = "Pending"
    message: str = ""
    ready: bool = False
    long_lived: bool = True
    conditions: list[dict[str, str]] = field(default_factory=list)
    # Pods replaced after they ended (on_pod_end).
    replaced: int = 0
    _last_probe: float = 0.0

    def __post_init__(self) -> None:
        meta = self.obj["metadata"]
        self.name = meta["name"]
        self.namespace = meta.get("namespace", "default")
        self.cluster = RayClusterPods(self.name, self.namespace, self.obj["spec"], f"RayCluster/{self.name}")
        self.services = self.cluster.services()
        self.notes = self.cluster.notes

    @property
    def done(self) -> bool:
        return self.finished is not None and not any(p.running for p in self.pods)

    @property
    def head(self) -> Pod | None:
        heads = [p for p in self.pods if p.plan.labels.get("ray.io/node-type") == "head" and p.running]
        return heads[0] if heads else None

    def start(self, api: PodAPI) -> None:
        self.started = api.now()
        self.finished = None
        self.status = "Pending" if not self.ready else self.status
        self.pods += [api.start(plan) for plan in self.cluster.plans()]

    def on_pod_end(self, api: PodAPI, pod: Pod) -> None:
        """A pod that ended (Failed or Succeeded: its containers restart in place until then) is replaced, as
        reconcilePods does with shouldDeletePod: deleted, then a head created when there is none (a standalone
        cluster; shouldSkipHeadPodRestart is only for a RayJob's) and workers up to the group's replicas."""
        if self.finished is not None or pod.deleted_by_controller:
            return
        node_type = pod.plan.labels.get("ray.io/node-type", "")
        what = f"{node_type} pod {pod.name} ended ({pod.phase}, exit codes {pod.exit_codes})"
        if self.replaced >= MAX_REPLACED_PODS:
            self._end(
                api,
                "Failed",
                f"{what} after {self.replaced} pods of the cluster were replaced; KubeRay would keep replacing it, "
                "the rehearsal stops here",
            )
            return
        self.replaced += 1
        spec = self.obj["spec"]
        group_name = pod.plan.labels.get("ray.io/group")
        group = (
            spec["headGroupSpec"]
            if node_type == "head"
            else next(g for g in spec.get("workerGroupSpecs", []) if g["groupName"] == group_name)
        )
        replacement = api.start(self.cluster.plan(node_type, group))
        self.pods.append(replacement)
        self.notes.append(f"{what}: deleted and {replacement.name} created, as KubeRay's reconcilePods does")

    def _end(self, api: PodAPI, status: str, message: str) -> None:
        self.status, self.message, self.finished = status, message, api.now()
        for pod in self.pods:
            if pod.running:
                pod.deleted_by_controller = True
                api.kill(pod)

    def tick(self, api: PodAPI) -> None:
        if self.ready or self.finished is not None or api.now() - self._last_probe < 2:
            return
        self._last_probe = api.now()
        head = self.head
        nodes = api.dashboard_get(head, "nodes?view=summary") if head is not None else None
        if nodes is None:
            return
        alive = [n for n in nodes.get("data", {}).get("summary", []) if n.get("raylet", {}).get("state") == "ALIVE"]
        if len(alive) == len([p for p in self.pods if p.running]):
            self.ready = True
            self.status = "Ready"
            self.message = f"{len(alive)} Ray nodes joined at {api.now() - self.started:.1f} s"

    def suspend(self, api: PodAPI, reason: str) -> None:
        for pod in self.pods:
            if pod.running:
                pod.deleted_by_controller = True
                api.kill(pod)
        self.status = "Suspended"

    def status_fields(self) -> dict[str, str]:
        return {"state": "ready" if self.ready else ""}

    def stop(self, api: PodAPI, reason: str) -> None:
        if self.ready:
            self._end(api, "Ready", f"{self.message}; kept running until {reason}, then stopped")
        else:
            self._end(api, "NotReady", f"not every Ray node had joined when {reason}")

    def state(self) -> tuple[str, str]:
        return self.status, self.message


@dataclass
class RayJobController:
    obj: dict[str, Any]
    backoff_base_s: float = 10.0
    kind: str = "RayJob"
    pods: list[Pod] = field(default_factory=list)
    started: float = 0.0
    finished: float | None = None
    job_status: str = "NEW"
    deployment_status: str = "Initializing"
    message: str = ""
    submitter: JobController | None = None
    long_lived: bool = False
    conditions: list[dict[str, str]] = field(default_factory=list)
    # The other workloads of the run (clusterSelector picks a RayCluster among them).
    run_objects: list[dict[str, Any]] = field(default_factory=list)
    # status.failed / status.succeeded: the attempts that ended Failed / Complete with SUCCEEDED.
    failed: int = 0
    succeeded: int = 0

    def __post_init__(self) -> None:
        meta, spec = self.obj["metadata"], self.obj["spec"]
        self.name = meta["name"]
        self.namespace = meta.get("namespace", "default")
        self.uid: str = str(meta.get("uid") or object_uid("RayJob", self.namespace, self.name))
        self.spec = spec
        mode = spec.get("submissionMode", "K8sJobMode")
        if mode == "InteractiveMode":
            raise RehearsalError(
                f"RayJob/{self.name}: submissionMode InteractiveMode waits for a user to submit the Ray job "
                "(KubeRay v1.7.0 rayjob_controller.go sets jobDeploymentStatus Waiting and submits nothing); the "
                "rehearsal has no user to wait for. Rehearse it with submissionMode K8sJobMode and an entrypoint, "
                "or as a RayCluster plus a Job that runs `ray job submit` against it"
            )
        if mode != "K8sJobMode":
            raise RehearsalError(
                f"RayJob/{self.name}: submissionMode {mode} is not emulated by the rehearsal (K8sJobMode is); "
                "use K8sJobMode to rehearse the same entrypoint"
            )
        self.job_id = f"{self.name}-{random_suffix()}"
        self.cluster_pods: list[Pod] = []
        # clusterSelector: KubeRay uses the RayCluster named by the selector's ray.io/cluster value and never
        # creates or deletes one (rayjob_controller.go initRayJobStatusIfNeed, RayJobClusterSelectorKey in
        # utils/constant.go; "skipping resource deletion" for a terminal RayJob).
        self.selected: RayClusterController | None = None
        selector = spec.get("clusterSelector") or {}
        if selector:
            wanted = selector.get(CLUSTER_SELECTOR_KEY, "")
            found = [
                o
                for o in self.run_objects
                if o["kind"] == "RayCluster"
                and o["metadata"]["name"] == wanted
                and o["metadata"].get("namespace", "default") == self.namespace
            ]
            if not found:
                raise RehearsalError(
                    f"RayJob/{self.name}: clusterSelector {selector} names no RayCluster of this run "
                    f"({CLUSTER_SELECTOR_KEY}={wanted or '<missing>'} in namespace {self.namespace}); KubeRay "
                    "v1.7.0 would wait for that cluster forever. Give the RayCluster's manifest in the same files"
                )
            self.cluster = RayClusterPods(wanted, self.namespace, found[0]["spec"], f"RayCluster/{wanted}")
            self.services: list[dict[str, Any]] = []
            self.notes: list[str] = [f"runs on RayCluster/{wanted} of this run (clusterSelector)"]
            return
        self.cluster = self._new_cluster([])
        self.services = self.cluster.services()
        self.notes = self.cluster.notes

    def _new_cluster(self, notes: list[str]) -> RayClusterPods:
        """The RayJob's own cluster, named as KubeRay names each attempt's (utils.GenerateRayClusterName)."""
        name = f"{self.name}-{random_suffix()}"
        return RayClusterPods(
            name,
            self.namespace,
            self.spec["rayClusterSpec"],
            f"RayJob/{self.name}",
            notes=notes,
            owner_references=[self.owner_reference()],
        )

    def owner_reference(self) -> dict[str, Any]:
        """What KubeRay's ctrl.SetControllerReference(rayJobInstance, ...) writes on the RayJob's RayCluster and
        submitter Job (KubeRay v1.7.0 rayjob_controller.go)."""
        return {
            "apiVersion": "ray.io/v1",
            "kind": "RayJob",
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    @property
    def head(self) -> Pod | None:
        if self.selected is not None:
            return self.selected.head
        return self.cluster_pods[0] if self.cluster_pods and self.cluster_pods[0].running else None

    @property
    def done(self) -> bool:
        return self.finished is not None and not any(p.running for p in self.pods)

    def start(self, api: PodAPI) -> None:
        self.started = api.now()
        if self.selected is not None:
            # The submitter is made once the selected cluster is Ready (tick), as KubeRay waits for it.
            return
        self.cluster_pods = [api.start(plan) for plan in self.cluster.plans()]
        self.pods = list(self.cluster_pods)
        self.submitter = None
        self.deployment_status = "Initializing"
        self._submit_when_ready(api)

    def _retry(self, api: PodAPI, message: str) -> None:
        """KubeRay v1.7.0 rayjob_controller.go: checkBackoffLimitAndUpdateStatusIfNeeded turns a Failed RayJob with
        status.failed < backoffLimit + 1 (and a reason other than NOT_RETRIED) into Retrying before the status is
        written, so Kueue never sees it Failed (its RayJob.Finished is Complete or Failed only). The Retrying case
        deletes the RayCluster (not one chosen by clusterSelector) and the submitter Job, waits until both are gone,
        resets the status and goes to New; initRayJobStatusIfNeed then names a new cluster and job id and resets
        StartTime, so activeDeadlineSeconds counts per attempt. There is no exit-code filter: any failure retries."""
        limit = int(self.spec["backoffLimit"])
        self.deployment_status, self.message = "Retrying", message
        self.notes.append(
            f"Retrying at {api.now() - self.started:.1f} s of its attempt: failed {self.failed} of backoffLimit "
            f"{limit} + 1 ({message}); a new RayCluster and Ray job id follow"
        )
        self._delete_attempt(api)

    def _delete_attempt(self, api: PodAPI) -> None:
        """Deletes the attempt's submitter pods and its own cluster's pods (none with clusterSelector)."""
        active = self.submitter.active if self.submitter is not None else []
        for pod in [*active, *self.cluster_pods]:
            pod.deleted_by_controller = True
            api.kill(pod)

    def _after_retry(self, api: PodAPI) -> None:
        """Retrying -> New -> Initializing once the old cluster's and submitter's pods are gone."""
        if any(p.running for p in self.pods):
            return
        self.job_status, self.message, self.submitter = "NEW", "", None
        self.job_id = f"{self.name}-{random_suffix()}"
        self.started = api.now()
        if self.selected is not None:
            self.deployment_status = "Initializing"
            return
        self.cluster = self._new_cluster(self.notes)
        for service in self.cluster.services():
            self.services.append(service)
            api.add_service(service)
        self.cluster_pods = [api.start(plan) for plan in self.cluster.plans()]
        self.pods += self.cluster_pods
        self.deployment_status = "Initializing"
        self._submit_when_ready(api)

    def _submit_when_ready(self, api: PodAPI) -> None:
        """KubeRay creates the submitter Job once the RayCluster is ready (rayjob_controller.go: the RayJob
        stays Initializing until the cluster's state is Ready, then Running): here once every cluster pod
        runs, so a Ray pod left Pending (no node fits it) keeps the RayJob Initializing."""
        if self.selected is not None or self.submitter is not None or any(p.pending for p in self.cluster_pods):
            return
        self._submit(api)

    def _submit(self, api: PodAPI) -> None:
        self.deployment_status = "Running"
        self.submitter = JobController(self._submitter_job(), backoff_base_s=self.backoff_base_s)
        self.submitter.start(api)
        self.pods += self.submitter.pods

    def _submit_command(self) -> str:
        address = f"http://{self.cluster.head_fqdn}:{RAY_DASHBOARD_PORT}"
        health = (
            'python -c "import urllib.request; r=urllib.request.urlopen('
            f"'{address}/api/gcs_healthz', timeout=10); exit(0 if b'success' in r.read() else 1)\""
        )
        submit = ["ray", "job", "submit", "--address", address, "--no-wait"]
        runtime_env = self.spec.get("runtimeEnvYAML")
        if runtime_env:
            submit += ["--runtime-env-json", shlex.quote(json.dumps(yaml.safe_load(runtime_env)))]
        if self.spec.get("metadata"):
            submit += ["--metadata-json", shlex.quote(json.dumps(self.spec["metadata"]))]
        submit += ["--submission-id", self.job_id]
        if float(self.spec.get("entrypointNumCpus", 0)) > 0:
            submit += ["--entrypoint-num-cpus", f"{float(self.spec['entrypointNumCpus']):f}"]  # Go's %f
        submit += ["--", self.spec["entrypoint"].strip()]
        return " ".join(
            [
                f"until {health} >/dev/null 2>&1 ; do echo "
                f'"Waiting for Ray Dashboard GCS to become healthy at {address} ..." ; sleep 2 ; done ;',
                f"if ! ray job status --address {address} {self.job_id} >/dev/null 2>&1 ; then",
                " ".join(submit),
                "; fi ;",
                f"ray job logs --address {address} --follow {self.job_id}",
            ]
        )

    def _submitter_job(self) -> dict[str, Any]:
        template = copy.deepcopy(self.spec.get("submitterPodTemplate") or {"spec": {"restartPolicy": "Never"}})
        spec = template["spec"]
        if not spec.get("containers"):
            head = self.cluster.spec["headGroupSpec"]["template"]["spec"]["containers"][RAY_CONTAINER]
            spec["containers"] = [{"name": "ray-job-submitter", "image": head.get("image")}]
        container = spec["containers"][0]
        if not container.get("command"):
            container["command"] = ["/bin/bash", "-ce", "--"]
            container["args"] = [self._submit_command()]
        container["env"] = [
            *container.get("env", []),
            {"name": "RAY_DASHBOARD_ADDRESS", "value": f"{self.cluster.head_fqdn}:{RAY_DASHBOARD_PORT}"},
            {"name": "RAY_JOB_SUBMISSION_ID", "value": self.job_id},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
        ]
        template.setdefault("metadata", {})
        template["metadata"]["labels"] = {**(template["metadata"].get("labels") or {}), **submitter_labels(self.name)}
        backoff = (self.spec.get("submitterConfig") or {}).get("backoffLimit", SUBMITTER_BACKOFF_LIMIT)
        # A new Job per attempt (the Retrying case deletes the old one, so each has its own uid), owned by the RayJob.
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": self.name, "namespace": self.namespace, "ownerReferences": [self.owner_reference()]},
            "spec": {"backoffLimit": backoff, "template": template},
        }

    def on_pod_end(self, api: PodAPI, pod: Pod) -> None:
        if self.finished is not None or pod.deleted_by_controller or self.deployment_status == "Retrying":
            return
        if pod in self.cluster_pods:
            # Restarted in place under restartPolicy Always on a cluster; a head loss ends the job here.
            self._finish(api, "Failed", f"Ray pod {pod.name} ended (exit codes {pod.exit_codes})")
            return
        assert self.submitter is not None
        self.submitter.on_pod_end(api, pod)
        self.pods += [p for p in self.submitter.pods if p not in self.pods]

    def _finish(self, api: PodAPI, deployment: str, message: str, *, reason: str = "") -> None:
        if deployment == "Failed":
            self.failed += 1
        elif self.job_status == "SUCCEEDED":
            self.succeeded += 1
        limit = self.spec.get("backoffLimit")
        if deployment == "Failed" and limit is not None and self.failed < int(limit) + 1 and reason not in NOT_RETRIED:
            self._retry(api, message)
            return
        self.deployment_status, self.message, self.finished = deployment, message, api.now()
        self._delete_attempt(api)
        self.notes.append(cleanup_after_finish(self.spec, self.job_status, deployment))

    def tick(self, api: PodAPI) -> None:
        if self.deployment_status == "Retrying":
            self._after_retry(api)
            return
        if self.finished is None and self.submitter is None and self.selected is not None:
            if self.selected.done:
                self._finish(api, "Failed", f"RayCluster/{self.selected.name} ended before the job was submitted")
            elif self.selected.ready:
                self._submit(api)
            return
        if self.finished is not None or self.deployment_status == "Suspended":
            return
        deadline = self.spec.get("activeDeadlineSeconds")
        if deadline is not None and api.now() - self.started > deadline:
            self._finish(
                api,
                "Failed",
                "DeadlineExceeded: the RayJob ran longer than activeDeadlineSeconds",
                reason="DeadlineExceeded",
            )
            return
        self._submit_when_ready(api)
        if self.submitter is None:
            return
        self.submitter.tick(api)
        self.pods += [p for p in self.submitter.pods if p not in self.pods]
        if not self.submitter.done:
            return
        head = self.head
        info = api.dashboard_get(head, f"api/jobs/{self.job_id}") if head is not None else None
        if info is not None:
            self.job_status = str(info.get("status", "UNKNOWN"))
            self.message = str(info.get("message") or "")
        if self.job_status in TERMINAL_JOB_STATUSES:
            failed = self.job_status == "FAILED"
            self._finish(api, "Failed" if failed else "Complete", self.message)
        else:
            condition = self.submitter.condition
            reason = f"{condition.reason}: {condition.message}" if condition else "submitter ended"
            self._finish(api, "Failed", f"submitter Job {reason}; Ray job status {self.job_status}")

    def suspend(self, api: PodAPI, reason: str) -> None:
        for pod in self.pods:
            if pod.running:
                pod.deleted_by_controller = True
                api.kill(pod)
        self.deployment_status = "Suspended"

    def stop(self, api: PodAPI, reason: str) -> None:
        self.suspend(api, reason)

    def status_fields(self) -> dict[str, str]:
        return {
            "jobDeploymentStatus": self.deployment_status,
            "jobStatus": self.job_status,
            "failed": str(self.failed),
            "succeeded": str(self.succeeded),
        }

    def state(self) -> tuple[str, str]:
        return self.deployment_status, f"jobStatus {self.job_status}: {self.message}".strip()


# selectMostImpactfulRule (rayjob_controller.go): the order in which overdue deletion rules win.
_IMPACT = {"DeleteSelf": 4, "DeleteCluster": 3, "DeleteWorkers": 2, "DeleteNone": 1}


def cleanup_after_finish(spec: dict[str, Any], job_status: str, deployment_status: str) -> str:
    """What KubeRay v1.7.0 does with a finished RayJob's cluster (rayjob_controller.go, the Complete/Failed
    case of Reconcile): clusterSelector skips deletion; else deletionStrategy (feature RayJobDeletionPolicy,
    on by default in v1.7.0: pkg/features/features.go), either `deletionRules` (handleDeletionRules: each rule
    matching jobStatus or jobDeploymentStatus fires ttlSeconds after the end, the most impactful overdue one
    first) or the legacy onSuccess/onFailure policy after ttlSecondsAfterFinished; else
    shutdownAfterJobFinishes deletes the cluster after ttlSecondsAfterFinished; else it is kept.
    The rehearsal itself always stops the cluster's pods when the RayJob ends; this says what the cluster does."""
    ending = "the rehearsal stops the cluster's pods when the RayJob ends"
    if spec.get("clusterSelector"):
        return "clusterSelector: KubeRay never deletes the selected RayCluster; it keeps running after the job"
    ttl = int(spec.get("ttlSecondsAfterFinished") or 0)
    strategy = spec.get("deletionStrategy")
    if strategy:
        rules = strategy.get("deletionRules")
        if rules is not None:
            matched = []
            for rule in rules:
                condition = rule.get("condition") or {}
                if "jobStatus" in condition:
                    hit = condition["jobStatus"] == job_status
                else:
                    hit = condition.get("jobDeploymentStatus") == deployment_status
                if hit:
                    matched.append((int(condition.get("ttlSeconds") or 0), str(rule.get("policy"))))
            if not matched:
                return f"deletionStrategy: no deletionRule matches jobStatus {job_status}: KubeRay keeps it; {ending}"
            steps = ", then ".join(
                f"{policy} {seconds} s after the end"
                for seconds, policy in sorted(matched, key=lambda m: (m[0], -_IMPACT.get(m[1], 0)))
            )
            return f"deletionStrategy rules for jobStatus {job_status}: KubeRay would {steps}; {ending}"
        side = "onSuccess" if job_status == "SUCCEEDED" else "onFailure" if job_status == "FAILED" else None
        if side is None:
            return f"deletionStrategy: jobStatus {job_status} selects no policy: KubeRay keeps the cluster; {ending}"
        policy = str((strategy.get(side) or {}).get("policy"))
        if policy == "DeleteNone":
            return f"deletionStrategy {side} DeleteNone: KubeRay keeps the cluster; {ending}"
        return f"deletionStrategy {side} {policy}: KubeRay would apply it {ttl} s after the end; {ending}"
    if spec.get("shutdownAfterJobFinishes"):
        return f"shutdownAfterJobFinishes: KubeRay deletes the cluster {ttl} s after the end; {ending}"
    return f"shutdownAfterJobFinishes is false: KubeRay keeps the cluster; {ending}"
