"""Kueue v0.19.2 admission, emulated: pure, deterministic, driven by events on an explicit clock.

`Kueue(queues, config)` takes the queue objects the Platform stack applies (k8s/queueing.py
queue_objects) and the manager Configuration it renders (infra/spec/kueue.py manager_config). The
caller reports what happens to the jobs (`submit`, `pods_ready`, `finished`, `scale`, `delete`,
each with `now` in cluster seconds) and acts on the `Event`s every call returns: `Admitted` means
unsuspend the job (ungate its pods, up to the admitted counts) with the flavors' nodeLabels and
tolerations added to its pods; `Evicted` and `Deactivated` mean suspend it (its pods are deleted).
`next_deadline()` says when a timeout or a backoff ends without any other event; call `advance`.

Sources (kubernetes-sigs/kueue, tag v0.19.2):
- Queueing: one head per ClusterQueue, StrictFIFO keeps a head that does not fit at the front,
  BestEffortFIFO lets the next one try; order by priority, then the creation timestamp (or the
  PodsReady eviction time with requeuingStrategy.timestamp Eviction): pkg/cache/queue/cluster_queue.go,
  pkg/workload/workload.go GetQueueOrderTimestamp, pkg/scheduler/scheduler.go makeClassicalIterator.
- Flavor assignment: flavors tried in the ClusterQueue's order; a flavor is skipped when one of
  its nodeTaints is not tolerated or the PodSet's nodeSelector / required node affinity, reduced to
  the flavor's own label keys, does not match its nodeLabels; then every requested resource of the
  group must fit: pkg/scheduler/flavorassigner/flavorassigner.go (findFlavorForPodSets,
  checkFlavorForPodSets, flavorSelector, fitsResourceQuota, Assignment.Message, Status.Message).
- blockAdmission: the scheduler waits while any admitted workload in any ClusterQueue is not
  PodsReady (pkg/cache/scheduler/cache.go podsReadyForAllAdmittedWorkloads, clusterqueue.go
  WorkloadsNotReady; pkg/scheduler/scheduler.go waitForPodsReadyIfNeeded): the whole scheduling
  loop blocks, so no queue admits anything until it clears.
- waitForPodsReady: timeout from the Admitted transition (WaitForStart), recoveryTimeout from the
  PodsReady=False transition after a workload was ready (WaitForRecovery); the timeout evicts
  (PodsReadyTimeout, "Exceeded the PodsReady timeout ns/name"), counts a requeue and sets the
  backoff base*2^(n-1) capped at max; when count+1 > backoffLimitCount the workload is deactivated
  instead: pkg/controller/core/workload_controller.go (reconcileNotReadyTimeout,
  triggerDeactivation, admittedNotReadyWorkload), pkg/workload/workload.go UpdateRequeueState,
  pkg/util/wait/backoff.go, apis/config/v1beta2/defaults.go; PodsReady reasons from
  pkg/controller/jobframework/reconciler.go generatePodsReadyCondition.
- PodSets: batch/v1 Job one PodSet of min(parallelism, completions) pods, PodsReady when
  ready+succeeded >= that count (pkg/controller/jobs/job/job_controller.go); RayCluster head
  (plus the autoscaler sidecar KubeRay injects, and the Redis cleanup with GCS FT) and one PodSet per
  worker group of replicas*numOfHosts, PodsReady when status.state == ready, never finished
  (pkg/controller/jobs/raycluster/common.go BuildPodSets, raycluster_controller.go); RayJob the
  same plus the submitter PodSet in K8sJobMode (or the submitter sidecar on the head in
  SidecarMode), finished when JobDeploymentStatus is Complete or Failed
  (pkg/controller/jobs/rayjob/rayjob_controller.go).
- Per-pod requests: limits stand in for missing requests (pkg/workload/resources.go
  UseLimitsAsMissingRequestsInPod), then Kubernetes' PodRequests (k8s.io/component-helpers
  resource.PodRequests: containers summed, each init container maxed against it, sidecar init
  containers added; pod overhead added).
- Elastic jobs (ElasticJobsViaWorkloadSlices, Beta and on in 0.19): a scale-down updates the
  admitted Workload in place; a scale-up creates a new Workload slice that must fit only the
  difference, keeps the old slice's flavors, and replaces it when admitted
  (pkg/workloadslicing/workloadslicing.go EnsureWorkloadSlices, flavorassigner.go); pods past the
  admitted counts keep the kueue.x-k8s.io/elastic-job scheduling gate
  (pkg/controller/elasticjobs/elastic_job_ungater.go).
- ClusterQueue spec.stopPolicy (set when created or merge-patched at run time): a stopped queue is inactive and
  no head is taken from it (pkg/cache/scheduler/clusterqueue.go updateQueueStatus, pkg/cache/queue/manager.go
  heads); its pending workloads say "ClusterQueue NAME is inactive" (workload_controller.go getQueueBlocker).
  Hold lets admitted workloads run on; HoldAndDrain evicts them (ClusterQueueStopped) with Requeued False until
  the policy is None again (Requeued True, ClusterQueueRestarted): workload_controller.go
  reconcileOnClusterQueueActiveState, pkg/controller/jobframework/reconciler.go. Without admission checks a
  reservation is an admission, so Hold's cancelling of reservations not yet admitted has nothing to act on here.

Not modelled (refused with `UnsupportedError` where a manifest or queue asks for it): cohorts and
borrowing, preemption, fair sharing, admission checks, topology-aware scheduling, partial admission,
LimitRanges, WorkloadPriorityClasses, pod-level resources, manageJobsWithoutQueueName, a LocalQueue's stopPolicy.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Literal, Protocol, TypeVar

from rehearse.cluster.matching import UnknownOperatorError, expression_matches, tolerates
from rehearse.cluster.quantity import QuantityError, format_quantity, parse_quantity

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
ELASTIC_JOB_ANNOTATION = "kueue.x-k8s.io/elastic-job"
ELASTIC_JOB_SCHEDULING_GATE = "kueue.x-k8s.io/elastic-job"
CONFIG_API = "config.kueue.x-k8s.io/v1beta2"
QUEUE_API = "kueue.x-k8s.io/v1beta2"
P = TypeVar("P")
FRAMEWORK_OF_KIND = {"Job": "batch/job", "RayJob": "ray.io/rayjob", "RayCluster": "ray.io/raycluster"}

# apis/config/v1beta2/defaults.go
DEFAULT_PODS_READY_TIMEOUT = 30 * 60.0
DEFAULT_BACKOFF_BASE_SECONDS = 60
DEFAULT_BACKOFF_MAX_SECONDS = 3600

# Condition types and reasons (apis/kueue/v1beta2/workload_types.go).
QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"
PODS_READY = "PodsReady"
EVICTED = "Evicted"
REQUEUED = "Requeued"
FINISHED = "Finished"
REASON_PENDING = "Pending"  # UnadmittedWorkloadsObservability is off by default in 0.19 (the fallback reason)
REASON_WAITING = "Waiting"  # the fallback for WaitingForPodsReady, same gate
REASON_PODS_READY_TIMEOUT = "PodsReadyTimeout"
REASON_DEACTIVATED = "Deactivated"
REASON_REQUEUING_LIMIT = "RequeuingLimitExceeded"
REASON_BACKOFF_FINISHED = "BackoffFinished"
REASON_WAIT_FOR_START = "WaitForStart"
REASON_WAIT_FOR_RECOVERY = "WaitForRecovery"
REASON_STARTED = "Started"
REASON_RECOVERED = "Recovered"
REASON_SUCCEEDED = "Succeeded"
REASON_FAILED = "Failed"
REASON_SLICE_REPLACED = "WorkloadSliceReplaced"
REASON_INADMISSIBLE = "Inadmissible"
REASON_CQ_STOPPED = "ClusterQueueStopped"
REASON_CQ_RESTARTED = "ClusterQueueRestarted"
STOP_POLICIES = ("None", "Hold", "HoldAndDrain")  # apis/kueue/v1beta2/constants.go StopPolicy

MSG_WAITING_FOR_PODS_READY = "waiting for all admitted workloads to be in PodsReady condition"
MSG_NOT_READY = "Not all pods are ready or succeeded"
MSG_WAITING_FOR_RECOVERY = "At least one pod has failed, waiting for recovery"
MSG_READY = "All pods reached readiness and the workload is running"
MSG_ADMITTED = "The workload is admitted"
MSG_DEACTIVATED_LIMIT = "The workload is deactivated due to exceeding the maximum number of re-queuing retries"
MSG_BACKOFF_FINISHED = "The workload backoff was finished"
MSG_NAMESPACE_MISMATCH = "workload namespace doesn't match ClusterQueue selector"
MSG_CQ_STOPPED = "The ClusterQueue is stopped"
MSG_CQ_RESTARTED = "The ClusterQueue was restarted after being stopped"
# The webhooks' answers to autoscaling without the elastic-job annotation: raycluster_webhook.go validateCreate
# for a RayCluster, raycluster/common.go ValidateCreate (called by rayjob_webhook.go) for a RayJob.
MSG_RAYCLUSTER_AUTOSCALING = (
    "a kueue-managed RayCluster can use autoscaling only as an elastic job: enable the "
    'ElasticJobsViaWorkloadSlices feature gate and set the "kueue.x-k8s.io/elastic-job": "true" annotation'
)
MSG_RAYJOB_AUTOSCALING = "a kueue managed job should only use autoscaling when workload slicing is enabled"

# KubeRay v1.7.0 values Kueue compares against (ray-operator/apis/ray/v1).
RAY_CLUSTER_READY = "ready"
RAY_JOB_FINISHED_DEPLOYMENT_STATUSES = ("Complete", "Failed")


class KueueError(Exception):
    """A manifest or queue object this emulator cannot take."""


class UnsupportedError(KueueError):
    """Kueue behaviour the emulator does not model (the rehearsal exits 2 and names it)."""


class RejectedError(KueueError):
    """What Kueue's admission webhook would deny at `kubectl apply`."""


# ---------------------------------------------------------------------------------------------
# Quantities and durations


def quantity_value(resource: str, text: str | int | float) -> int:
    """A quantity as Kueue counts it (resources.ResourceValue): milli-units for cpu, whole units
    (rounded up, as resource.Quantity.Value does) for everything else."""
    try:
        return parse_quantity(text, milli=resource == "cpu")
    except QuantityError as error:
        raise KueueError(f"{resource}: {error}") from None


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(h|m|s|ms)")


def duration_seconds(text: str) -> float:
    """A Go time.Duration string as the Configuration carries it (metav1.Duration): 20m, 1h30m, 90s."""
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise KueueError(f"{text!r} is not a duration (e.g. 20m, 1h30m, 90s)")
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * scale[u] for n, u in parts)


# ---------------------------------------------------------------------------------------------
# The manager Configuration


@dataclass(frozen=True, kw_only=True)
class WaitForPodsReady:
    timeout: float
    recovery_timeout: float | None
    block_admission: bool
    backoff_base: float
    backoff_max: float
    backoff_limit_count: int | None
    timestamp: Literal["Eviction", "Creation"]

    def backoff(self, requeue_count: int) -> float:
        """The wait before the n-th requeue: base*2^(n-1), capped (wait.Backoff with factor 2; the
        0.0001 jitter, a few milliseconds, is left out so runs are deterministic)."""
        return min(self.backoff_base * 2.0 ** (requeue_count - 1), self.backoff_max)


@dataclass(frozen=True, kw_only=True)
class KueueConfig:
    wait_for_pods_ready: WaitForPodsReady
    frameworks: tuple[str, ...]

    @classmethod
    def from_configuration(cls, document: Mapping[str, Any]) -> KueueConfig:
        """The Configuration document, with apis/config/v1beta2/defaults.go applied (waitForPodsReady
        is on by default since v0.19 with a 30 minute timeout; recoveryTimeout defaults to it)."""
        if document.get("apiVersion") != CONFIG_API or document.get("kind") != "Configuration":
            raise KueueError(f"not a Kueue Configuration ({CONFIG_API}): {document.get('apiVersion')}")
        if document.get("manageJobsWithoutQueueName"):
            raise UnsupportedError("manageJobsWithoutQueueName: true (only labelled jobs are emulated)")
        if document.get("fairSharing") or document.get("admissionFairSharing"):
            raise UnsupportedError("fairSharing / admissionFairSharing")
        wait = dict(document.get("waitForPodsReady") or {})
        timeout = duration_seconds(wait["timeout"]) if wait.get("timeout") else DEFAULT_PODS_READY_TIMEOUT
        requeuing = dict(wait.get("requeuingStrategy") or {})
        timestamp = requeuing.get("timestamp", "Eviction")
        if timestamp not in ("Eviction", "Creation"):
            raise KueueError(f"waitForPodsReady.requeuingStrategy.timestamp {timestamp!r}: Eviction or Creation")
        limit = requeuing.get("backoffLimitCount")
        return cls(
            wait_for_pods_ready=WaitForPodsReady(
                timeout=timeout,
                recovery_timeout=duration_seconds(wait["recoveryTimeout"]) if wait.get("recoveryTimeout") else timeout,
                block_admission=bool(wait.get("blockAdmission", False)),
                backoff_base=float(requeuing.get("backoffBaseSeconds", DEFAULT_BACKOFF_BASE_SECONDS)),
                backoff_max=float(requeuing.get("backoffMaxSeconds", DEFAULT_BACKOFF_MAX_SECONDS)),
                backoff_limit_count=None if limit is None else int(limit),
                timestamp=timestamp,
            ),
            frameworks=tuple((document.get("integrations") or {}).get("frameworks") or ("batch/job",)),
        )


# ---------------------------------------------------------------------------------------------
# Queue objects


@dataclass(frozen=True)
class ResourceFlavor:
    name: str
    node_labels: Mapping[str, str]
    node_taints: tuple[Mapping[str, str], ...] = ()
    tolerations: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class FlavorQuotas:
    flavor: str
    nominal: Mapping[str, int]


@dataclass(frozen=True)
class ResourceGroup:
    covered: tuple[str, ...]
    flavors: tuple[FlavorQuotas, ...]


@dataclass(frozen=True)
class ClusterQueue:
    name: str
    strategy: Literal["StrictFIFO", "BestEffortFIFO"]
    namespaces: frozenset[str] | None
    """The namespaces its selector admits; None: every namespace (an empty selector)."""
    groups: tuple[ResourceGroup, ...]
    stop_policy: str = "None"
    """spec.stopPolicy: None, Hold or HoldAndDrain."""

    @property
    def active(self) -> bool:
        return self.stop_policy == "None"

    def active_condition(self) -> tuple[bool, str, str]:
        """status.conditions[Active] as status, reason, message (clusterqueue.go inactiveReason)."""
        if self.active:
            return True, "Ready", "Can admit new workloads"
        return False, "Stopped", "Can't admit new workloads: is stopped."

    def group_of(self, resource: str) -> ResourceGroup | None:
        return next((g for g in self.groups if resource in g.covered), None)

    def nominal(self, flavor: str, resource: str) -> int:
        for group in self.groups:
            for quotas in group.flavors:
                if quotas.flavor == flavor and resource in group.covered:
                    return quotas.nominal.get(resource, 0)
        return 0


_CLUSTER_QUEUE_FIELDS = {"namespaceSelector", "queueingStrategy", "resourceGroups", "flavorFungibility", "stopPolicy"}


def _namespaces(selector: Mapping[str, Any] | None, queue: str) -> frozenset[str] | None:
    if selector is None:
        return frozenset()  # a null selector admits no namespace (ClusterQueue CRD)
    if selector.get("matchLabels"):
        raise UnsupportedError(f"ClusterQueue {queue}: namespaceSelector.matchLabels")
    expressions = selector.get("matchExpressions") or []
    if not expressions:
        return None
    allowed: frozenset[str] | None = None
    for expression in expressions:
        if expression.get("key") != "kubernetes.io/metadata.name" or expression.get("operator") != "In":
            raise UnsupportedError(f"ClusterQueue {queue}: namespaceSelector other than kubernetes.io/metadata.name In")
        values = frozenset(expression.get("values") or ())
        allowed = values if allowed is None else allowed & values
    return allowed


@dataclass(frozen=True)
class Queues:
    flavors: Mapping[str, ResourceFlavor]
    cluster_queues: Mapping[str, ClusterQueue]
    local_queues: Mapping[tuple[str, str], str]
    """(namespace, LocalQueue name) -> ClusterQueue name."""

    @classmethod
    def from_objects(cls, objects: Iterable[Mapping[str, Any]]) -> Queues:
        """ResourceFlavors, ClusterQueues and LocalQueues as k8s/queueing.py queue_objects renders them."""
        flavors: dict[str, ResourceFlavor] = {}
        queues: dict[str, ClusterQueue] = {}
        local: dict[tuple[str, str], str] = {}
        for obj in objects:
            kind, meta, spec = obj.get("kind"), obj["metadata"], obj.get("spec") or {}
            if obj.get("apiVersion") != QUEUE_API:
                raise KueueError(f"{kind} {meta['name']}: apiVersion {obj.get('apiVersion')}, expected {QUEUE_API}")
            if kind == "ResourceFlavor":
                if spec.get("topologyName"):
                    raise UnsupportedError(f"ResourceFlavor {meta['name']}: topologyName (topology-aware scheduling)")
                flavors[meta["name"]] = ResourceFlavor(
                    name=meta["name"],
                    node_labels=dict(spec.get("nodeLabels") or {}),
                    node_taints=tuple(spec.get("nodeTaints") or ()),
                    tolerations=tuple(spec.get("tolerations") or ()),
                )
            elif kind == "ClusterQueue":
                name = meta["name"]
                extra = set(spec) - _CLUSTER_QUEUE_FIELDS
                if extra:
                    fields = ", ".join(sorted(extra))
                    raise UnsupportedError(f"ClusterQueue {name}: {fields} (cohorts, preemption, checks)")
                stop_policy = spec.get("stopPolicy", "None")
                if stop_policy not in STOP_POLICIES:
                    raise KueueError(f"ClusterQueue {name}: stopPolicy {stop_policy!r}: None, Hold or HoldAndDrain")
                groups = []
                for group in spec.get("resourceGroups") or ():
                    covered = tuple(group["coveredResources"])
                    group_flavors = []
                    for flavor in group["flavors"]:
                        nominal = {}
                        for resource in flavor["resources"]:
                            if "borrowingLimit" in resource or "lendingLimit" in resource:
                                raise UnsupportedError(f"ClusterQueue {name}: borrowingLimit/lendingLimit")
                            nominal[resource["name"]] = quantity_value(resource["name"], resource["nominalQuota"])
                        group_flavors.append(FlavorQuotas(flavor=flavor["name"], nominal=nominal))
                    groups.append(ResourceGroup(covered=covered, flavors=tuple(group_flavors)))
                queues[name] = ClusterQueue(
                    name=name,
                    strategy=spec.get("queueingStrategy", "BestEffortFIFO"),
                    namespaces=_namespaces(spec.get("namespaceSelector", {}), name),
                    groups=tuple(groups),
                    stop_policy=stop_policy,
                )
            elif kind == "LocalQueue":
                if spec.get("stopPolicy", "None") != "None":
                    raise UnsupportedError(f"LocalQueue {meta['name']}: stopPolicy {spec['stopPolicy']}")
                local[(meta["namespace"], meta["name"])] = spec["clusterQueue"]
            else:
                raise KueueError(f"{kind} {meta.get('name')}: not a Kueue queue object")
        return cls(flavors=flavors, cluster_queues=queues, local_queues=local)


# ---------------------------------------------------------------------------------------------
# Workloads from manifests


@dataclass(frozen=True)
class PodSet:
    name: str
    count: int
    requests: Mapping[str, int]
    """Per pod, as Kueue counts them (cpu in milli-units)."""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    node_affinity_terms: tuple[tuple[Mapping[str, Any], ...], ...] | None = None
    """requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[*].matchExpressions."""
    tolerations: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class WorkloadSpec:
    kind: str
    namespace: str
    name: str
    queue_name: str
    pod_sets: tuple[PodSet, ...]
    elastic: bool = False
    priority: int = 0

    @property
    def job(self) -> str:
        """The key every call takes: Kind/namespace/name of the job object."""
        return f"{self.kind}/{self.namespace}/{self.name}"

    @property
    def workload_name(self) -> str:
        # GetWorkloadNameForOwnerWithGVK appends a hash of the owner's UID, which a rehearsal has not.
        return f"{self.kind.lower()}-{self.name}"


def _resources(container: Mapping[str, Any]) -> dict[str, int]:
    resources = container.get("resources") or {}
    requests = {k: quantity_value(k, v) for k, v in (resources.get("requests") or {}).items()}
    for k, v in (resources.get("limits") or {}).items():
        requests.setdefault(k, quantity_value(k, v))  # UseLimitsAsMissingRequestsInPod
    return requests


def _add(into: dict[str, int], other: Mapping[str, int]) -> None:
    for k, v in other.items():
        into[k] = into.get(k, 0) + v


def _max(into: dict[str, int], other: Mapping[str, int]) -> None:
    for k, v in other.items():
        into[k] = max(into.get(k, 0), v)


def pod_requests(pod_spec: Mapping[str, Any]) -> dict[str, int]:
    """Kubernetes' PodRequests (component-helpers resource/helpers.go) over Kueue's per-container
    requests: containers and sidecar init containers summed, each regular init container (plus the
    sidecars started before it) maxed against that, pod overhead added."""
    if pod_spec.get("resources"):
        raise UnsupportedError("pod-level resources (spec.resources)")
    total: dict[str, int] = {}
    for container in pod_spec.get("containers") or ():
        _add(total, _resources(container))
    sidecars: dict[str, int] = {}
    init_max: dict[str, int] = {}
    for container in pod_spec.get("initContainers") or ():
        own = _resources(container)
        if container.get("restartPolicy") == "Always":
            _add(total, own)
            _add(sidecars, own)
            _max(init_max, sidecars)
        else:
            step = dict(own)
            _add(step, sidecars)
            _max(init_max, step)
    _max(total, init_max)
    _add(total, {k: quantity_value(k, v) for k, v in (pod_spec.get("overhead") or {}).items()})
    return {k: v for k, v in total.items() if v > 0}


def _pod_set(name: str, count: int, template: Mapping[str, Any], extra: Sequence[Mapping[str, Any]] = ()) -> PodSet:
    spec = dict(template.get("spec") or {})
    if spec.get("priorityClassName"):
        raise UnsupportedError(f"PodSet {name}: priorityClassName (workload priority and preemption)")
    topology = [
        a for a in (template.get("metadata") or {}).get("annotations") or {} if a.startswith("kueue.x-k8s.io/podset-")
    ]
    if topology:
        raise UnsupportedError(f"PodSet {name}: {', '.join(sorted(topology))} (topology-aware scheduling)")
    if extra:
        spec["containers"] = [*(spec.get("containers") or ()), *extra]
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or None
    terms = None
    if required is not None:
        terms = tuple(tuple(t.get("matchExpressions") or ()) for t in required.get("nodeSelectorTerms") or ())
    return PodSet(
        name=name.lower(),  # kueue.NewPodSetReference
        count=count,
        requests=pod_requests(spec),
        node_selector=dict(spec.get("nodeSelector") or {}),
        node_affinity_terms=terms,
        tolerations=tuple(spec.get("tolerations") or ()),
    )


def _resource_container(name: str, cpu: str, memory: str, limit_cpu: str, limit_memory: str) -> dict[str, Any]:
    return {
        "name": name,
        "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": limit_cpu, "memory": limit_memory}},
    }


# raycluster/common.go defaultAutoscalerResources; rayjob_controller.go defaultSubmitterResources;
# raycluster/common.go redisCleanupResourceRequests.
_AUTOSCALER = _resource_container("autoscaler", "500m", "512Mi", "500m", "512Mi")
_SUBMITTER = _resource_container("ray-job-submitter", "500m", "200Mi", "1", "1Gi")
_REDIS_CLEANUP = {"cpu": quantity_value("cpu", "200m"), "memory": quantity_value("memory", "256Mi")}


def _ray_cluster_pod_sets(spec: Mapping[str, Any], annotations: Mapping[str, str]) -> list[PodSet]:
    head_template = spec["headGroupSpec"]["template"]
    extra: list[Mapping[str, Any]] = []
    if spec.get("enableInTreeAutoscaling"):
        options = spec.get("autoscalerOptions") or {}
        own = options.get("resources")
        extra.append({"name": "autoscaler", "resources": own} if own else _AUTOSCALER)
    head = _pod_set("head", 1, head_template, extra)
    if spec.get("gcsFaultToleranceOptions") or annotations.get("ray.io/ft-enabled") == "true":
        requests = dict(head.requests)
        _max(requests, _REDIS_CLEANUP)  # MergeResourceListKeepMax on the Ray container, approximated per pod
        head = replace(head, requests=requests)
    sets = [head]
    for group in spec.get("workerGroupSpecs") or ():
        if group["groupName"] == "head":
            raise RejectedError('spec.workerGroupSpecs.groupName: Forbidden: "head" is reserved for the head group')
        replicas = group.get("replicas", 1)
        count = int(replicas) * max(int(group.get("numOfHosts", 1)), 1)
        sets.append(_pod_set(group["groupName"], count, group["template"]))
    return sets


def workload_from_manifest(obj: Mapping[str, Any], config: KueueConfig) -> WorkloadSpec | None:
    """The Workload Kueue creates for a Job, RayJob or RayCluster; None when Kueue does not manage
    the object (no queue label, or its framework is not in integrations.frameworks)."""
    kind = obj.get("kind", "")
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    framework = FRAMEWORK_OF_KIND.get(kind)
    if framework is None or framework not in config.frameworks or QUEUE_LABEL not in labels:
        return None
    spec = obj.get("spec") or {}
    name, namespace = meta["name"], meta.get("namespace", "default")
    if "kueue.x-k8s.io/priority-class" in labels:
        raise UnsupportedError(f"{kind} {name}: kueue.x-k8s.io/priority-class (WorkloadPriorityClass)")
    elastic = annotations.get(ELASTIC_JOB_ANNOTATION) == "true"
    if kind == "Job":
        if "kueue.x-k8s.io/job-min-parallelism" in annotations:
            raise UnsupportedError(f"Job {name}: kueue.x-k8s.io/job-min-parallelism (partial admission)")
        parallelism = int(spec.get("parallelism", 1))
        completions = spec.get("completions")
        count = min(parallelism, int(completions)) if completions is not None else parallelism
        pod_sets = [_pod_set("main", count, spec["template"])]
    elif kind == "RayCluster":
        if spec.get("enableInTreeAutoscaling") and not elastic:
            raise RejectedError(f"spec.enableInTreeAutoscaling: Invalid value: true: {MSG_RAYCLUSTER_AUTOSCALING}")
        pod_sets = _ray_cluster_pod_sets(spec, annotations)
    else:  # RayJob
        if spec.get("clusterSelector"):
            return None  # rayjob_controller.go Skip: a RayJob on an existing cluster is not managed
        cluster = spec["rayClusterSpec"]
        if cluster.get("enableInTreeAutoscaling") and not elastic:
            raise RejectedError(
                f"spec.rayClusterSpec.enableInTreeAutoscaling: Invalid value: true: {MSG_RAYJOB_AUTOSCALING}"
            )
        pod_sets = _ray_cluster_pod_sets(cluster, annotations)
        mode = spec.get("submissionMode", "K8sJobMode")  # the RayJob CRD's default
        if mode == "K8sJobMode":
            template = spec.get("submitterPodTemplate") or {"spec": {"containers": [_SUBMITTER]}}
            pod_sets.append(_pod_set("submitter", 1, template))
        elif mode == "SidecarMode":
            head = pod_sets[0]
            requests = dict(head.requests)
            _add(requests, _resources(_SUBMITTER))
            pod_sets[0] = replace(head, requests=requests)
    return WorkloadSpec(
        kind=kind,
        namespace=namespace,
        name=name,
        queue_name=labels[QUEUE_LABEL],
        pod_sets=tuple(pod_sets),
        elastic=elastic,
    )


# ---------------------------------------------------------------------------------------------
# Flavor assignment (pkg/scheduler/flavorassigner)


def _taint_string(taint: Mapping[str, str]) -> str:
    value = taint.get("value", "")
    return f"{taint['key']}={value}:{taint['effect']}" if value else f"{taint['key']}:{taint['effect']}"


def _expression_matches(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    try:
        return expression_matches(expression, labels)
    except UnknownOperatorError as exc:
        raise KueueError(f"node affinity operator {str(exc)!r}") from None


def flavor_mismatch(pod_set: PodSet, flavor: ResourceFlavor) -> str | None:
    """checkFlavorForPodSets: why this flavor cannot take the PodSet, in Kueue's words, or None."""
    tolerations = (*pod_set.tolerations, *flavor.tolerations)
    for taint in flavor.node_taints:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(tolerates(t, taint) for t in tolerations):
            return f"untolerated taint {_taint_string(taint)} in flavor {flavor.name}"
    keys = set(flavor.node_labels)
    labels = flavor.node_labels
    if any(labels[k] != v for k, v in pod_set.node_selector.items() if k in keys):
        return f"flavor {flavor.name} doesn't match node affinity"
    if pod_set.node_affinity_terms is not None:
        terms: list[list[Mapping[str, Any]]] = []
        for term in pod_set.node_affinity_terms:
            kept = [e for e in term if e["key"] in keys]
            if not kept:  # an emptied term matches any flavor (flavorSelector)
                terms = []
                break
            terms.append(kept)
        if terms and not any(all(_expression_matches(e, labels) for e in term) for term in terms):
            return f"flavor {flavor.name} doesn't match node affinity"
    return None


@dataclass(frozen=True)
class PodSetAdmission:
    name: str
    count: int
    flavors: Mapping[str, str]
    """resource -> flavor."""
    usage: Mapping[str, int]
    """resource -> total over the PodSet's pods."""
    node_labels: Mapping[str, str]
    """The assigned flavors' nodeLabels, added to the pods' nodeSelector (podset.Merge)."""
    tolerations: tuple[Mapping[str, Any], ...]
    """The assigned flavors' tolerations, added to the pods' tolerations."""


@dataclass(frozen=True)
class Admission:
    cluster_queue: str
    pod_sets: tuple[PodSetAdmission, ...]

    def usage(self) -> dict[tuple[str, str], int]:
        total: dict[tuple[str, str], int] = {}
        for ps in self.pod_sets:
            for resource, amount in ps.usage.items():
                key = (ps.flavors[resource], resource)
                total[key] = total.get(key, 0) + amount
        return total

    def counts(self) -> dict[str, int]:
        return {ps.name: ps.count for ps in self.pod_sets}


@dataclass(frozen=True)
class _Assignment:
    fits: bool
    """Every PodSet got a flavor with enough unused quota."""
    admission: Admission | None
    message: str
    exceeds_max: bool = False


def assign_flavors(
    spec: WorkloadSpec,
    queue: ClusterQueue,
    flavors: Mapping[str, ResourceFlavor],
    usage: Mapping[tuple[str, str], int],
    replaces: Admission | None = None,
) -> _Assignment:
    """FlavorAssigner.assignFlavors for a ClusterQueue without a cohort: each PodSet takes the first
    flavor (in the queue's order) that matches it and where every requested resource fits; a
    replacement slice keeps the flavors of the slice it replaces and needs only the difference."""
    assigned: list[PodSetAdmission] = []
    assumed: dict[tuple[str, str], int] = {}
    messages: list[str] = []
    all_fit = True
    exceeds = False
    for index, pod_set in enumerate(spec.pod_sets):
        total = {r: v * pod_set.count for r, v in pod_set.requests.items()}
        previous = replaces.pod_sets[index] if replaces is not None else None
        reasons: list[str] = []
        chosen: dict[str, str] | None = None
        chosen_fits = False
        groups: list[ResourceGroup] = []
        for resource in total:
            group = queue.group_of(resource)
            if group is None:
                reasons = [f"resource {resource} unavailable in ClusterQueue"]
                groups = []
                chosen = None
                break
            if group not in groups:
                groups.append(group)
        else:
            chosen = {}
        if chosen is not None:
            for group in groups:
                requested = {r: v for r, v in total.items() if r in group.covered}
                best: dict[str, str] | None = None
                group_reasons: list[str] = []
                for quotas in group.flavors:
                    flavor = flavors.get(quotas.flavor)
                    if flavor is None:
                        group_reasons.append(f"flavor {quotas.flavor} not found")
                        continue
                    mismatch = flavor_mismatch(pod_set, flavor)
                    if mismatch is not None:
                        group_reasons.append(mismatch)
                        continue
                    mode = "fit"
                    for resource, amount in requested.items():
                        if previous is not None:
                            original = previous.flavors.get(resource)
                            if original != quotas.flavor:
                                group_reasons.append(
                                    f"could not assign {quotas.flavor} flavor since the original workload is "
                                    f"assigned: {original}"
                                )
                                mode = "nofit"
                                break
                            amount -= previous.usage.get(resource, 0)
                        key = (quotas.flavor, resource)
                        maximum = queue.nominal(quotas.flavor, resource)
                        value = assumed.get(key, 0) + amount
                        if value > maximum:
                            group_reasons.append(
                                f"insufficient quota for {resource} in flavor {quotas.flavor}, previously considered "
                                f"podsets requests ({format_quantity(resource, assumed.get(key, 0))}) + current podset "
                                f"request ({format_quantity(resource, amount)}) > maximum capacity "
                                f"({format_quantity(resource, maximum)})"
                            )
                            mode = "nofit"
                            exceeds = True
                        elif value > maximum - usage.get(key, 0):
                            available = maximum - usage.get(key, 0)
                            group_reasons.append(
                                f"insufficient unused quota for {resource} in flavor {quotas.flavor}, "
                                f"{format_quantity(resource, value - available)} more needed"
                            )
                            if mode == "fit":
                                mode = "wait"
                    if mode == "fit":
                        best = {r: quotas.flavor for r in requested}
                        chosen_fits = True
                        group_reasons = []
                        break
                    if mode == "wait" and best is None:
                        best = {r: quotas.flavor for r in requested}
                if best is None:
                    chosen = None
                    reasons += group_reasons
                    break
                if not chosen_fits:
                    reasons += group_reasons
                chosen.update(best)
        if chosen is None:
            messages.append(f"couldn't assign flavors to pod set {pod_set.name}: {', '.join(sorted(reasons))}")
            return _Assignment(fits=False, admission=None, message="; ".join(messages), exceeds_max=exceeds)
        if reasons:
            all_fit = False
            messages.append(f"couldn't assign flavors to pod set {pod_set.name}: {', '.join(sorted(reasons))}")
        for resource, amount in total.items():
            delta = amount - (previous.usage.get(resource, 0) if previous is not None else 0)
            key = (chosen[resource], resource)
            assumed[key] = assumed.get(key, 0) + delta
        used = {chosen[r] for r in total}
        node_labels: dict[str, str] = {}
        tolerations: list[Mapping[str, Any]] = []
        for name in sorted(used):
            node_labels.update(flavors[name].node_labels)
            tolerations += flavors[name].tolerations
        assigned.append(
            PodSetAdmission(
                name=pod_set.name,
                count=pod_set.count,
                flavors=dict(chosen),
                usage=total,
                node_labels=node_labels,
                tolerations=tuple(tolerations),
            )
        )
    admission = Admission(cluster_queue=queue.name, pod_sets=tuple(assigned))
    return _Assignment(fits=all_fit, admission=admission, message="; ".join(messages), exceeds_max=exceeds)


# ---------------------------------------------------------------------------------------------
# The engine


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str
    time: float


EventKind = Literal["Pending", "Admitted", "PodsReady", "Evicted", "Requeued", "Deactivated", "Finished", "Deleted"]


@dataclass(frozen=True)
class Event:
    """One thing Kueue did, at cluster time `time` (seconds)."""

    time: float
    job: str
    workload: str
    kind: EventKind
    reason: str
    message: str
    admission: Admission | None = None


@dataclass
class Workload:
    spec: WorkloadSpec
    name: str
    created: float
    seq: int
    conditions: dict[str, Condition] = field(default_factory=dict)
    admission: Admission | None = None
    requeue_count: int = 0
    requeue_at: float | None = None
    evicted_at: float | None = None
    active: bool = True
    finished: bool = False
    replaces: Workload | None = field(default=None, repr=False)
    ever_admitted: bool = False

    def condition(self, kind: str) -> Condition | None:
        return self.conditions.get(kind)

    @property
    def admitted(self) -> bool:
        return self.admission is not None

    @property
    def pods_ready(self) -> bool:
        c = self.conditions.get(PODS_READY)
        return c is not None and c.status

    @property
    def pending(self) -> bool:
        return self.active and not self.finished and self.admission is None


class Kueue:
    """The admission of one cluster: every public call takes `now` (cluster seconds, never
    decreasing) and returns the Events it caused, timeouts that fell due before `now` included."""

    def __init__(self, queues: Queues, config: KueueConfig) -> None:
        self.queues = queues
        self.config = config
        self.now = 0.0
        self.history: list[Event] = []
        self._jobs: dict[str, list[Workload]] = {}
        self._job_ready: dict[str, bool] = {}
        self._seq = 0
        self._blocked: Workload | None = None
        self._out: list[Event] = []

    # -- queries

    def manages(self, manifest: Mapping[str, Any]) -> bool:
        return workload_from_manifest(manifest, self.config) is not None

    def _slices(self, job: str) -> list[Workload]:
        if job not in self._jobs:
            raise KueueError(f"{job} is not a workload Kueue admits (never submitted, deleted, or unlabelled)")
        return self._jobs[job]

    def workload(self, job: str) -> Workload:
        """The job's current Workload (for an elastic job, the newest slice not finished)."""
        slices = self._slices(job)
        live = [w for w in slices if not w.finished]
        return (live or slices)[-1]

    def all_workloads(self) -> list[Workload]:
        """Every Workload the model holds (each job's slices), for the rehearsal's API server to list."""
        # Copies first: the API server's thread reads while the run loop submits.
        return [w for slices in list(self._jobs.values()) for w in list(slices)]

    def admitted_counts(self, job: str) -> dict[str, int] | None:
        """Pods per PodSet the job may run now (ungated), or None while it is not admitted."""
        admitted = [w for w in self._slices(job) if w.admission is not None and not w.finished]
        if not admitted:
            return None
        assert admitted[-1].admission is not None
        return admitted[-1].admission.counts()

    def blocked_by(self) -> list[str]:
        """While blockAdmission holds the scheduler: the admitted workloads not yet PodsReady."""
        if self._blocked is None:
            return []
        return [w.name for w in self._workloads() if w.admission is not None and not w.finished and not w.pods_ready]

    def head_before(self, job: str) -> str | None:
        """The head of a StrictFIFO ClusterQueue the job's pending Workload waits behind, in words."""
        wl = self.workload(job)
        name = self._queue_name(wl)
        if not wl.pending or name is None or self.queues.cluster_queues[name].strategy != "StrictFIFO":
            return None
        queued = sorted((w for w in self._queued() if self._queue_name(w) == name), key=self._order_key)
        if not queued or queued[0] is wl:
            return None
        return f"{queued[0].name} in StrictFIFO ClusterQueue {name}"

    def next_deadline(self) -> float | None:
        times = [t for t in (self._deadline(w) for w in self._workloads()) if t is not None]
        return min(times) if times else None

    # -- events in

    def submit(self, manifest: Mapping[str, Any], now: float) -> list[Event]:
        """A job was created; raises RejectedError (the webhook's denial) or UnsupportedError."""
        spec = workload_from_manifest(manifest, self.config)
        if spec is None:
            return []
        if spec.job in self._jobs:
            raise KueueError(f"{spec.job} was already submitted")
        self._catch_up(now)
        self._jobs[spec.job] = [self._new_workload(spec)]
        self._job_ready[spec.job] = False
        self._schedule()
        return self._drain()

    def pods_ready(self, job: str, ready: bool, now: float) -> list[Event]:
        """The job's PodsReady as Kueue reads it (see job_pods_ready, ray_cluster_pods_ready)."""
        slices = self._slices(job)
        self._catch_up(now)
        self._job_ready[job] = ready
        for wl in slices:
            if wl.admission is not None and not wl.finished:
                self._sync_pods_ready(wl)
        self._schedule()
        return self._drain()

    def finished(self, job: str, now: float, *, succeeded: bool, message: str = "") -> list[Event]:
        """The job finished (Job Complete/Failed; RayJob JobDeploymentStatus Complete/Failed): quota is released."""
        slices = self._slices(job)
        self._catch_up(now)
        for wl in slices:
            if not wl.finished:
                self._finish(wl, REASON_SUCCEEDED if succeeded else REASON_FAILED, message)
        self._schedule()
        return self._drain()

    def delete(self, job: str, now: float) -> list[Event]:
        self._slices(job)
        self._catch_up(now)
        for wl in self._jobs.pop(job):
            if self._blocked is wl:
                self._blocked = None
            wl.finished = True
            wl.admission = None
            self._emit(wl, "Deleted", "Deleted", "the job was deleted")
        self._job_ready.pop(job, None)
        self._schedule()
        return self._drain()

    def scale(self, job: str, worker_counts: Mapping[str, int], now: float) -> list[Event]:
        """An elastic RayCluster's autoscaler set workerGroupSpecs[*].replicas (by group name)."""
        self._catch_up(now)
        current = self.workload(job)
        if not current.spec.elastic:
            raise UnsupportedError(f"{job}: only an elastic job (kueue.x-k8s.io/elastic-job) changes size")
        sets = []
        for ps in current.spec.pod_sets:
            count = worker_counts.get(ps.name, ps.count) if ps.name != "head" else ps.count
            sets.append(replace(ps, count=int(count)))
        unknown = set(worker_counts) - {ps.name for ps in current.spec.pod_sets if ps.name != "head"}
        if unknown:
            raise KueueError(f"{job}: no worker group {', '.join(sorted(unknown))}")
        new_spec = replace(current.spec, pod_sets=tuple(sets))
        old = {ps.name: ps.count for ps in current.spec.pod_sets}
        new = {ps.name: ps.count for ps in sets}
        if old == new:
            return self._drain()
        scaled_down = any(new[k] < old[k] for k in old) and not any(new[k] > old[k] for k in old)
        if current.admission is None or scaled_down:
            # EnsureWorkloadSlices: a pending slice or a scale-down is updated in place.
            current.spec = new_spec
            if current.admission is not None:
                current.admission = self._rescaled(current.admission, new_spec)
        else:
            replacement = self._new_workload(new_spec, slice_index=len(self._jobs[job]))
            replacement.replaces = current
            self._jobs[job].append(replacement)
        self._schedule()
        return self._drain()

    def advance(self, now: float) -> list[Event]:
        self._catch_up(now)
        self._schedule()
        return self._drain()

    def update_cluster_queue(self, queue: ClusterQueue) -> None:
        """A ClusterQueue changed (its quota, its stopPolicy): admission goes by it from the next call on, which
        takes its `now`. Kueue's cache and queue manager take a ClusterQueue update at once (pkg/cache
        ClusterQueue update, then the queue manager requeues); an admitted workload keeps its admission (a lower
        quota evicts nothing without preemption; HoldAndDrain does evict, see _reconcile_stop_policies)."""
        queues = self.queues
        self.queues = Queues(
            flavors=queues.flavors,
            cluster_queues={**queues.cluster_queues, queue.name: queue},
            local_queues=queues.local_queues,
        )

    # -- internals

    def _workloads(self) -> list[Workload]:
        return [w for slices in self._jobs.values() for w in slices]

    def _new_workload(self, spec: WorkloadSpec, slice_index: int = 0) -> Workload:
        self._seq += 1
        name = spec.workload_name if slice_index == 0 else f"{spec.workload_name}-slice-{slice_index}"
        return Workload(spec=spec, name=name, created=self.now, seq=self._seq)

    def _emit(
        self, wl: Workload, kind: EventKind, reason: str, message: str, admission: Admission | None = None
    ) -> None:
        event = Event(self.now, wl.spec.job, wl.name, kind, reason, message, admission)
        self.history.append(event)
        self._out.append(event)

    def _drain(self) -> list[Event]:
        out, self._out = self._out, []
        return out

    def _set(self, wl: Workload, kind: str, status: bool, reason: str, message: str) -> bool:
        old = wl.conditions.get(kind)
        if old is not None and (old.status, old.reason, old.message) == (status, reason, message):
            return False
        time = old.time if old is not None and old.status == status else self.now
        wl.conditions[kind] = Condition(kind, status, reason, message, time)
        return True

    def _deadline(self, wl: Workload) -> float | None:
        wait = self.config.wait_for_pods_ready
        if wl.finished or not wl.active:
            return None
        if wl.admission is None:
            return wl.requeue_at if wl.requeue_at is not None else None
        ready = wl.conditions.get(PODS_READY)
        if ready is None or ready.status:
            return None
        if ready.reason == REASON_WAIT_FOR_RECOVERY:
            return None if wait.recovery_timeout is None else ready.time + wait.recovery_timeout
        admitted = wl.conditions[ADMITTED]
        return admitted.time + wait.timeout

    def _catch_up(self, now: float) -> None:
        if now < self.now:
            raise KueueError(f"time went backwards: {now} < {self.now}")
        while True:
            due = [(d, w.seq, w) for w in self._workloads() if (d := self._deadline(w)) is not None and d <= now]
            if not due:
                break
            deadline, _, wl = min(due, key=lambda item: (item[0], item[1]))
            self.now = max(self.now, deadline)
            self._fire(wl)
            self._schedule()
        self.now = now

    def _fire(self, wl: Workload) -> None:
        if wl.admission is None:  # backoff over: back in the queue
            wl.requeue_at = None
            self._set(wl, REQUEUED, True, REASON_BACKOFF_FINISHED, MSG_BACKOFF_FINISHED)
            self._emit(wl, "Requeued", REASON_BACKOFF_FINISHED, MSG_BACKOFF_FINISHED)
            return
        wait = self.config.wait_for_pods_ready
        limit = wait.backoff_limit_count
        if limit is not None and wl.requeue_count + 1 > limit:
            reason = f"{REASON_DEACTIVATED}DueTo{REASON_REQUEUING_LIMIT}"
            self._release(wl)
            wl.active = False
            wl.requeue_at = None
            self._set(wl, EVICTED, True, reason, MSG_DEACTIVATED_LIMIT)
            self._set(wl, REQUEUED, False, REASON_DEACTIVATED, MSG_DEACTIVATED_LIMIT)
            self._emit(wl, "Deactivated", reason, MSG_DEACTIVATED_LIMIT)
            return
        message = f"Exceeded the PodsReady timeout {wl.spec.namespace}/{wl.name}"
        self._release(wl)
        wl.requeue_count += 1
        wl.requeue_at = self.now + wait.backoff(wl.requeue_count)
        wl.evicted_at = self.now
        self._set(wl, EVICTED, True, REASON_PODS_READY_TIMEOUT, message)
        self._set(wl, REQUEUED, False, REASON_PODS_READY_TIMEOUT, message)
        self._emit(wl, "Evicted", REASON_PODS_READY_TIMEOUT, message)

    def _release(self, wl: Workload) -> None:
        wl.admission = None
        self._job_ready[wl.spec.job] = False  # a suspended job's pods are deleted
        self._set(wl, QUOTA_RESERVED, False, REASON_PENDING, "")
        self._set(wl, ADMITTED, False, "NoReservation", "The workload has no reservation")
        self._set(wl, PODS_READY, False, REASON_WAIT_FOR_START, MSG_NOT_READY)

    def _finish(self, wl: Workload, reason: str, message: str) -> None:
        if self._blocked is wl:
            self._blocked = None
        wl.finished = True
        wl.admission = None
        self._set(wl, FINISHED, True, reason, message)
        self._emit(wl, "Finished", reason, message)

    def _sync_pods_ready(self, wl: Workload) -> None:
        """generatePodsReadyCondition."""
        ready = self._job_ready[wl.spec.job]
        current = wl.conditions.get(PODS_READY)
        if ready:
            recovered = current is not None and current.reason in (REASON_WAIT_FOR_RECOVERY, REASON_RECOVERED)
            reason = REASON_RECOVERED if recovered else REASON_STARTED
            if self._set(wl, PODS_READY, True, reason, MSG_READY) and not (current is not None and current.status):
                self._emit(wl, "PodsReady", reason, MSG_READY)
        elif current is not None and (current.status or current.reason == REASON_WAIT_FOR_RECOVERY):
            if self._set(wl, PODS_READY, False, REASON_WAIT_FOR_RECOVERY, MSG_WAITING_FOR_RECOVERY):
                self._emit(wl, "PodsReady", REASON_WAIT_FOR_RECOVERY, MSG_WAITING_FOR_RECOVERY)
        else:
            self._set(wl, PODS_READY, False, REASON_WAIT_FOR_START, MSG_NOT_READY)

    def _all_ready(self) -> bool:
        return all(w.pods_ready for w in self._workloads() if w.admission is not None and not w.finished)

    def _usage(self, queue: str) -> dict[tuple[str, str], int]:
        total: dict[tuple[str, str], int] = {}
        for wl in self._workloads():
            if wl.admission is not None and not wl.finished and wl.admission.cluster_queue == queue:
                for key, amount in wl.admission.usage().items():
                    total[key] = total.get(key, 0) + amount
        return total

    def _order_key(self, wl: Workload) -> tuple[int, float, int]:
        stamp = wl.created
        if self.config.wait_for_pods_ready.timestamp == "Eviction" and wl.evicted_at is not None:
            stamp = wl.evicted_at
        return (-wl.spec.priority, stamp, wl.seq)

    def _cluster_queue(self, wl: Workload) -> tuple[ClusterQueue | None, str]:
        spec = wl.spec
        name = self.queues.local_queues.get((spec.namespace, spec.queue_name))
        if name is None:
            return None, f"LocalQueue {spec.queue_name} doesn't exist"
        queue = self.queues.cluster_queues.get(name)
        if queue is None:
            return None, f"ClusterQueue {name} not found"
        if queue.namespaces is not None and spec.namespace not in queue.namespaces:
            return None, MSG_NAMESPACE_MISMATCH
        return queue, ""

    def _pending_message(self, wl: Workload, message: str, reason: str = REASON_PENDING) -> None:
        if self._set(wl, QUOTA_RESERVED, False, reason, message):
            self._emit(wl, "Pending", reason, message)

    def _schedule(self) -> None:
        """Scheduling cycles until nothing more is admitted (Scheduler.schedule)."""
        wait = self.config.wait_for_pods_ready
        while True:
            self._reconcile_stop_policies()
            if self._blocked is not None:
                # The scheduler sits in cache.WaitForPodsReady with this entry in hand.
                if not self._all_ready():
                    return
                entry, self._blocked = self._blocked, None
                if entry.pending and self._try_admit(entry, block=False):
                    continue
            heads: list[Workload] = []
            for queue_name in self.queues.cluster_queues:
                queued = sorted(
                    (w for w in self._queued() if self._queue_name(w) == queue_name),
                    key=self._order_key,
                )
                if not queued or not self.queues.cluster_queues[queue_name].active:
                    continue  # manager.go heads: an inactive ClusterQueue gives no head
                strategy = self.queues.cluster_queues[queue_name].strategy
                heads += queued[:1] if strategy == "StrictFIFO" else queued
            for wl in self._queued():
                if self._queue_name(wl) is None:
                    _, message = self._cluster_queue(wl)
                    self._pending_message(wl, message)
            admitted_any = False
            admitted_queues: set[str] = set()  # one admission per ClusterQueue and cycle (one head each)
            for wl in sorted(heads, key=self._order_key):
                head_queue = self._queue_name(wl)
                assert head_queue is not None
                if head_queue in admitted_queues:
                    continue
                if self._try_admit(wl, block=wait.block_admission):
                    admitted_any = True
                    admitted_queues.add(head_queue)
                if self._blocked is not None:
                    return
            if not admitted_any:
                return

    def _queued(self) -> list[Workload]:
        """Pending workloads in the queues (not in backoff, not deactivated, not Requeued False: cluster_queue.go
        backoffWaitingTimeExpired)."""
        return [
            w
            for w in self._workloads()
            if w.pending and w.requeue_at is None and ((c := w.conditions.get(REQUEUED)) is None or c.status)
        ]

    def _stopped_queue(self, wl: Workload) -> ClusterQueue | None:
        """The workload's ClusterQueue when it is stopped (whatever its namespaceSelector: getQueueBlocker checks
        the queue's activity first)."""
        name = self.queues.local_queues.get((wl.spec.namespace, wl.spec.queue_name))
        queue = self.queues.cluster_queues.get(name) if name is not None else None
        return queue if queue is not None and not queue.active else None

    def _reconcile_stop_policies(self) -> None:
        """What the workload controller does for a stopped or restarted ClusterQueue (workload_controller.go,
        Kueue v0.19.2, Reconcile and reconcileOnClusterQueueActiveState)."""
        for wl in self._workloads():
            if wl.finished or not wl.active:
                continue
            queue = self._stopped_queue(wl)
            if wl.admission is not None:
                held = self.queues.cluster_queues.get(wl.admission.cluster_queue)
                if held is not None and held.stop_policy == "HoldAndDrain":
                    # workloadevict.Evict(ClusterQueueStopped); the job reconciler then stops the job and, the
                    # reason being neither preemption nor node failure, sets Requeued False and QuotaReserved False
                    # (WorkloadPending, the fallback reason) with the eviction's message
                    # (pkg/controller/jobframework/reconciler.go, "handle eviction"). The queue order goes back to
                    # the creation time (pkg/workload/workload.go GetQueueOrderTimestamp: only PodsReadyTimeout and
                    # admission-check evictions move it).
                    self._release(wl)
                    wl.evicted_at = None
                    self._set(wl, EVICTED, True, REASON_CQ_STOPPED, MSG_CQ_STOPPED)
                    self._set(wl, REQUEUED, False, REASON_CQ_STOPPED, MSG_CQ_STOPPED)
                    self._set(wl, QUOTA_RESERVED, False, REASON_PENDING, MSG_CQ_STOPPED)
                    self._emit(wl, "Evicted", REASON_CQ_STOPPED, MSG_CQ_STOPPED)
                continue
            requeued = wl.conditions.get(REQUEUED)
            if queue is not None:
                # getQueueBlocker / resolveLegacyUnadmittedQuotaReservedCondition (UnadmittedWorkloadsObservability
                # off in 0.19: reason Inadmissible).
                self._pending_message(wl, f"ClusterQueue {queue.name} is inactive", REASON_INADMISSIBLE)
            elif requeued is not None and not requeued.status and requeued.reason == REASON_CQ_STOPPED:
                # isDisabledRequeuedByClusterQueueStopped and the queue's stopPolicy None again.
                self._set(wl, REQUEUED, True, REASON_CQ_RESTARTED, MSG_CQ_RESTARTED)
                self._emit(wl, "Requeued", REASON_CQ_RESTARTED, MSG_CQ_RESTARTED)

    def _queue_name(self, wl: Workload) -> str | None:
        queue, _ = self._cluster_queue(wl)
        return queue.name if queue is not None else None

    def _try_admit(self, wl: Workload, *, block: bool) -> bool:
        queue, message = self._cluster_queue(wl)
        if queue is None:
            self._pending_message(wl, message)
            return False
        replaces = wl.replaces.admission if wl.replaces is not None else None
        assignment = assign_flavors(wl.spec, queue, self.queues.flavors, self._usage(queue.name), replaces)
        if not assignment.fits or assignment.admission is None:
            self._pending_message(wl, assignment.message)
            return False
        if block and not self._all_ready():
            self._pending_message(wl, MSG_WAITING_FOR_PODS_READY, REASON_WAITING)
            self._blocked = wl
            return False
        self._admit(wl, assignment.admission)
        return True

    def _admit(self, wl: Workload, admission: Admission) -> None:
        wl.admission = admission
        wl.ever_admitted = True
        wl.evicted_at = None
        self._set(wl, QUOTA_RESERVED, True, QUOTA_RESERVED, f"Quota reserved in ClusterQueue {admission.cluster_queue}")
        self._set(wl, ADMITTED, True, ADMITTED, MSG_ADMITTED)
        wl.conditions.pop(EVICTED, None)
        self._emit(wl, "Admitted", ADMITTED, f"Quota reserved in ClusterQueue {admission.cluster_queue}", admission)
        old = wl.replaces
        if old is not None and not old.finished:
            # replaceOldWorkloadSlice: the old slice is finished, the job's pods carry on.
            old.finished = True
            old.admission = None
            self._set(old, FINISHED, True, REASON_SLICE_REPLACED, f"Replaced by workload slice {wl.name}")
            self._emit(old, "Finished", REASON_SLICE_REPLACED, f"Replaced by workload slice {wl.name}")
        else:
            self._job_ready[wl.spec.job] = False
        wl.conditions.pop(PODS_READY, None)
        self._sync_pods_ready(wl)

    def _rescaled(self, admission: Admission, spec: WorkloadSpec) -> Admission:
        sets = []
        for ps_admission, ps in zip(admission.pod_sets, spec.pod_sets, strict=True):
            usage = {r: v * ps.count for r, v in ps.requests.items()}
            sets.append(replace(ps_admission, count=ps.count, usage=usage))
        return replace(admission, pod_sets=tuple(sets))


# ---------------------------------------------------------------------------------------------
# What the integrator reports, in Kueue's terms


def job_pods_ready(job: Mapping[str, Any], *, ready: int, succeeded: int) -> bool:
    """batch/v1 Job: status.ready + status.succeeded >= min(parallelism, completions) (job_controller.go PodsReady)."""
    spec = job.get("spec") or {}
    parallelism = int(spec.get("parallelism", 1))
    completions = spec.get("completions")
    count = min(parallelism, int(completions)) if completions is not None else parallelism
    return ready + succeeded >= count


def ray_cluster_pods_ready(state: str | None) -> bool:
    """RayCluster (status.state) and RayJob (status.rayClusterStatus.state): PodsReady is state == ready.
    KubeRay v1.7.0 sets ready once all pods first run and does not set it back when a pod is lost."""
    return state == RAY_CLUSTER_READY


def ray_job_finished(deployment_status: str | None) -> bool:
    """RayJob.Finished: JobDeploymentStatus Complete or Failed (the cluster may live on for ttlSecondsAfterFinished)."""
    return deployment_status in RAY_JOB_FINISHED_DEPLOYMENT_STATUSES


@dataclass(frozen=True)
class TimeScale:
    """One factor for every controller timeout: cluster time = wall time * factor, so a 20 minute
    waitForPodsReady timeout is rehearsed in 20*60/factor wall seconds."""

    factor: float = 1.0

    def __post_init__(self) -> None:
        if not self.factor > 0:
            raise KueueError(f"--time-scale {self.factor}: a factor above 0 (e.g. 60: one cluster minute per second)")

    def cluster(self, wall_seconds: float) -> float:
        return wall_seconds * self.factor

    def wall(self, cluster_seconds: float) -> float:
        return cluster_seconds / self.factor


# ---------------------------------------------------------------------------------------------
# The rehearsal's Admission seam (rehearse/seams.py): Kueue behind admit / pod_ready / pod_ended /
# workload_finished / evictions, polled by the run loop on its clock.


class _WorkloadRef(Protocol):
    @property
    def kind(self) -> str: ...

    @property
    def key(self) -> str: ...

    @property
    def obj(self) -> dict[str, Any]: ...


class _Plan(Protocol):
    @property
    def labels(self) -> dict[str, str]: ...


class _Pod(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def phase(self) -> str: ...

    @property
    def plan(self) -> _Plan: ...

    @property
    def deleted_by_controller(self) -> bool: ...


class _Clock(Protocol):
    def now(self) -> float: ...


def pod_set_of(kind: str, pod_labels: Mapping[str, str]) -> str:
    """The PodSet a pod of the job belongs to: a Job's pods are `main`; a Ray pod's is its
    ray.io/node-type head or its ray.io/group (lower-cased, kueue.NewPodSetReference); a RayJob's
    pod without a Ray node type is the submitter's."""
    if kind == "Job":
        return "main"
    node_type = pod_labels.get("ray.io/node-type")
    if node_type == "head":
        return "head"
    if node_type == "worker":
        return pod_labels.get("ray.io/group", "").lower()
    return "submitter"


class KueueAdmission(Generic[P]):
    """`Admission` (rehearse/seams.py) over a `Kueue`: cluster time is the run clock's elapsed time
    times `time_scale.factor`; `pending` builds the seam's Pending(reason)."""

    def __init__(self, kueue: Kueue, *, clock: _Clock, time_scale: TimeScale, pending: Callable[[str], P]) -> None:
        self.kueue = kueue
        self.clock = clock
        self.time_scale = time_scale
        self._pending = pending
        self._start: float | None = None
        self._managed: dict[str, bool] = {}
        self._running: dict[str, dict[str, str]] = {}
        """job -> running pod name -> its PodSet."""
        self._succeeded: dict[str, set[str]] = {}
        self._ray_ready: dict[str, str] = {}
        """job -> the Ray cluster (ray.io/cluster) whose state became ready (KubeRay sets it once and keeps it)."""
        self._evicted: list[tuple[_WorkloadRef, str]] = []
        self._refs: dict[str, _WorkloadRef] = {}
        self._clusters: dict[str, str] = {}
        """job -> the Ray cluster of its newest running pod."""
        self._cluster_deleted: dict[str, _WorkloadRef] = {}

    def cluster_now(self) -> float:
        now = self.clock.now()
        if self._start is None:
            self._start = now
        return self.time_scale.cluster(now - self._start)

    def _take(self, events: list[Event]) -> None:
        for event in events:
            if event.kind in ("Evicted", "Deactivated") and event.job in self._refs:
                self._evicted.append((self._refs[event.job], f"{event.reason}: {event.message}"))
                self._running[event.job] = {}
                self._succeeded[event.job] = set()
                self._ray_ready.pop(event.job, None)

    def admit(self, workload: _WorkloadRef) -> bool | P:
        job = workload.key
        now = self.cluster_now()
        if job not in self._managed:
            self._managed[job] = self.kueue.manages(workload.obj)
            if self._managed[job]:
                self._refs[job] = workload
                self._running[job], self._succeeded[job] = {}, set()
                self._take(self.kueue.submit(workload.obj, now))
        if not self._managed[job]:
            return True
        self._take(self.kueue.advance(now))
        if self.kueue.admitted_counts(job) is not None:
            return True
        return self._pending(self.pending_reason(job))

    def pending_reason(self, job: str) -> str:
        wl = self.kueue.workload(job)
        if not wl.active:
            evicted = wl.conditions[EVICTED]
            return f"{evicted.reason}: {evicted.message}"
        if wl.requeue_at is not None:
            evicted = wl.conditions[EVICTED]
            return f"requeued at {wl.requeue_at:.0f} s cluster time after {evicted.reason}: {evicted.message}"
        reserved = wl.conditions.get(QUOTA_RESERVED)
        blocked = self.kueue.blocked_by()
        if blocked and (reserved is None or reserved.reason != REASON_WAITING):
            # Kueue's scheduler is parked in WaitForPodsReady: this workload is not even looked at.
            return (
                f"{REASON_PENDING}: not evaluated while blockAdmission waits for {', '.join(blocked)} to be PodsReady"
            )
        if reserved is None and (head := self.kueue.head_before(job)) is not None:
            return f"{REASON_PENDING}: queued behind {head}"
        return f"{reserved.reason}: {reserved.message}" if reserved is not None else REASON_PENDING

    def _report(self, workload: _WorkloadRef) -> None:
        job = workload.key
        counts = self.kueue.admitted_counts(job)
        if counts is None:
            return
        running = self._running[job]
        if workload.kind == "Job":
            ready = job_pods_ready(workload.obj, ready=len(running), succeeded=len(self._succeeded[job]))
        else:
            cluster = sum(n for name, n in counts.items() if name != "submitter")
            if job not in self._ray_ready and sum(1 for ps in running.values() if ps != "submitter") >= cluster:
                self._ray_ready[job] = self._clusters.get(job, "")
            ready = job in self._ray_ready
        self._take(self.kueue.pods_ready(job, ready, self.cluster_now()))

    def pod_ready(self, workload: _WorkloadRef, pod: _Pod) -> None:
        if not self._managed.get(workload.key):
            return
        self._running[workload.key][pod.name] = pod_set_of(workload.kind, pod.plan.labels)
        if "ray.io/cluster" in pod.plan.labels:
            self._clusters[workload.key] = pod.plan.labels["ray.io/cluster"]
        self._report(workload)

    def pod_ended(self, workload: _WorkloadRef, pod: _Pod) -> None:
        if not self._managed.get(workload.key):
            return
        self._running[workload.key].pop(pod.name, None)
        if pod.phase == "Succeeded":
            self._succeeded[workload.key].add(pod.name)
        if (
            workload.kind == "RayJob"
            and pod.deleted_by_controller
            and self._ray_ready.get(workload.key) == pod.plan.labels.get("ray.io/cluster")
        ):
            # KubeRay deleted the RayJob's cluster: at the end (then the workload finishes in this same tick and
            # nothing changes) or for a retry, whose Retrying case resets status.rayClusterStatus
            # (rayjob_controller.go): RayJob.PodsReady (rayClusterStatus.state == ready) is then false until the
            # next cluster is ready, and waitForPodsReady's recoveryTimeout runs meanwhile (evictions applies it).
            self._cluster_deleted[workload.key] = workload
        self._report(workload)

    def workload_finished(self, workload: _WorkloadRef, state: str) -> None:
        """A Job's or RayJob's final state finishes its Workload; a RayCluster never finishes for
        Kueue (RayCluster.Finished is always false): its quota stays held, as on a cluster."""
        if not self._managed.get(workload.key) or workload.kind == "RayCluster":
            return
        self._cluster_deleted.pop(workload.key, None)
        succeeded = state in ("Complete", "Succeeded")
        self._take(self.kueue.finished(workload.key, self.cluster_now(), succeeded=succeeded, message=state))

    def evictions(self) -> list[tuple[_WorkloadRef, str]]:
        for key, workload in list(self._cluster_deleted.items()):
            del self._cluster_deleted[key]
            self._ray_ready.pop(key, None)
            self._report(workload)
        self._take(self.kueue.advance(self.cluster_now()))
        out, self._evicted = self._evicted, []
        return out

    def pod_set_admission(self, workload: _WorkloadRef, pod_labels: Mapping[str, str]) -> PodSetAdmission | None:
        """The admitted flavors of the pod's PodSet: their nodeLabels join the pod's nodeSelector and
        their tolerations its tolerations (podset.Merge), for the Placement seam to apply."""
        if not self._managed.get(workload.key):
            return None
        wl = self.kueue.workload(workload.key)
        admission = wl.admission or (wl.replaces.admission if wl.replaces is not None else None)
        if admission is None:
            return None
        name = pod_set_of(workload.kind, pod_labels)
        return next((ps for ps in admission.pod_sets if ps.name == name), None)
