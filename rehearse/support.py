"""What the rehearsal honours: one table of every Job, Pod, RayJob, RayCluster and Deployment field it runs, with the
source it mirrors, and the walker that refuses (exit 2) any field outside the table.

A field is one of
- `honoured`: the rehearsal runs it as the cited controller does (optionally only for some `values`);
- `inert`: accepted, and it cannot change the verdict of a rehearsal on one machine (the reason says why:
  scheduling, images, security settings that the cluster enforces and the rehearsal does not);
- `pending`: a field of the Kubernetes 1.36 Job API or KubeRay v1.7.0 that the rehearsal is being taught
  (issue 27, the controller half); refused until its controller lands and moves the entry to `honoured`.
Anything else present in an object is refused with its kind and field path: nothing is ignored silently.

Paths are dotted from the object's root; `[]` stands for every element of a list. An entry covers its
whole subtree (a map of user keys, e.g. labels, is one entry). The pod spec is one group, mounted at
each place a kind holds a pod template (`POD_SPEC_AT`).

Sources: Kubernetes v1.36 pkg/controller/job/job_controller.go, pod_failure_policy.go,
indexed_job_utils.go (batch/v1 Job); pkg/kubelet (containers, restart policy, env, volumes);
KubeRay v1.7.0 ray-operator/controllers/ray/common/pod.go, common/job.go, rayjob_controller.go,
raycluster_controller.go, utils/util.go.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HONOURED = "honoured"
INERT = "inert"
PENDING = "pending"

JOB_CONTROLLER = "Kubernetes 1.36 pkg/controller/job/job_controller.go"
POD_FAILURE_POLICY = "Kubernetes 1.36 pkg/controller/job/pod_failure_policy.go"
INDEXED = "Kubernetes 1.36 pkg/controller/job/indexed_job_utils.go"
KUBELET = "Kubernetes 1.36 kubelet (pkg/kubelet/kuberuntime), run by rehearse/podinit.py"
KUBELET_ENV = "Kubernetes 1.36 pkg/kubelet/kubelet_pods.go makeEnvironmentVariables, run by rehearse/pods.py"
KUBELET_VOLUMES = "Kubernetes 1.36 pkg/volume (emptyDir, configMap, PVC), run by rehearse/pods.py"
DNS = "Kubernetes 1.36 docs concepts/services-networking/dns-pod-service, rehearse/pods.py /etc/hosts"
KUBERAY_POD = "KubeRay v1.7.0 ray-operator/controllers/ray/common/pod.go"
KUBERAY_CLUSTER = "KubeRay v1.7.0 ray-operator/controllers/ray/raycluster_controller.go"
KUBERAY_JOB = "KubeRay v1.7.0 ray-operator/controllers/ray/rayjob_controller.go, common/job.go"
DEPLOYMENT_CONTROLLER = (
    "Kubernetes 1.36 pkg/controller/deployment/sync.go and pkg/controller/replicaset/replica_set.go, run by "
    "rehearse/deployment.py"
)
ISSUE_27 = "issue 27 (controller half): refused until rehearse/jobs.py or kuberay.py implements it"

SCHEDULING = (
    "scheduling: without --env every pod runs on this machine; with --env kube-scheduler's filters place it on the "
    "environment's nodes (rehearse/cluster/scheduler.py), refusing what they cannot model"
)
IMAGE = "images are not pulled: this machine's Python environment runs; the image is printed per pod"
SECURITY = "security settings are enforced by the cluster, not by the rehearsal (pods run as this user)"
RESOURCES = (
    "requests and limits are not enforced on the processes; with --env the scheduler fits requests to the nodes' "
    "allocatable; GPU/EFA requests are reported beside the pod"
)
QUEUES = "accepted: without --env Kueue admits every workload at once; with --env the environment's queues"
METADATA = "object metadata: no controller here reads it"
AUTOSCALER = "the Ray autoscaler is not run: each group keeps its `replicas` workers, as KubeRay creates them"


@dataclass(frozen=True)
class Support:
    status: str
    source: str
    # Only these values are honoured (others are refused); None: any value.
    values: tuple[Any, ...] | None = None


def honoured(source: str, values: tuple[Any, ...] | None = None) -> Support:
    return Support(HONOURED, source, values)


def inert(reason: str) -> Support:
    return Support(INERT, reason)


def pending(what: str) -> Support:
    return Support(PENDING, f"{what}; {ISSUE_27}")


# Kinds the rehearsal runs as pods, and the kinds that are only data or infrastructure for them
# (accepted; what the rehearsal does with each is said).
WORKLOAD_KINDS = ("Job", "RayJob", "RayCluster", "Deployment")
PENDING_KINDS: dict[str, str] = {
    "Pod": "bare Pods are being taught to the rehearsal (issue 27, controller half)",
}
API = "with --env the rehearsal's API server (rehearse/cluster/apiserver.py)"
INFRA_KINDS: dict[str, str] = {
    "Namespace": "accepted (namespaces are names here)",
    "ConfigMap": "honoured: data as files (configMap volumes) and env (configMapKeyRef, envFrom)",
    "Service": "honoured: pod and Service DNS names in each pod's /etc/hosts (no ClusterIP, no kube-proxy)",
    "PersistentVolumeClaim": "honoured: one directory per claim, shared by every pod that mounts it",
    "PersistentVolume": "accepted (claims are directories here; with --env its node affinity binds the pods)",
    "StorageClass": "accepted (claims are directories here)",
    "Secret": "accepted as data; secret env and volumes are refused per field",
    "ServiceAccount": f"accepted; {API}: a pod's token (automountServiceAccountToken) authenticates as it",
    "Role": f"accepted; {API}: authorizes the pods' requests",
    "RoleBinding": f"accepted; {API}: authorizes the pods' requests",
    "ClusterRole": f"accepted; {API}: authorizes the pods' requests (aggregationRule refused)",
    "ClusterRoleBinding": f"accepted; {API}: authorizes the pods' requests",
    "ValidatingAdmissionPolicy": "honoured (resourceRules, namespaceSelector, matchConditions, validations): judges "
    "every pod the controllers create, a denied pod not created and its workload ended FailedCreate "
    f"(rehearse/pod_admission.py); {API}: admits node updates",
    "ValidatingAdmissionPolicyBinding": "honoured: validationActions Deny, matchResources.namespaceSelector",
    "PriorityClass": "accepted (no preemption: every pod runs)",
    "PodDisruptionBudget": "accepted (no voluntary evictions here)",
    "NetworkPolicy": (
        "honoured (Ingress) on the bridge network: routing rules in each pod's network namespace refuse what the "
        "policies do not admit (rehearse/policy_routes.py); refused on the loopback network and with Egress"
    ),
    "LocalQueue": QUEUES,
    "ClusterQueue": QUEUES,
    "ResourceFlavor": QUEUES,
    "WorkloadPriorityClass": QUEUES,
}

LONG_LIVED = {
    "RayCluster": " (long-lived: kept until the finite workloads end)",
    "Deployment": " (long-lived: kept until the finite workloads end; not managed by Kueue)",
}

METADATA_FIELDS: dict[str, Support] = {
    "apiVersion": honoured("validated against the Kubernetes 1.36 schema and the vendored CRDs"),
    "kind": honoured("validated against the Kubernetes 1.36 schema and the vendored CRDs"),
    "metadata.name": honoured("Kubernetes 1.36 API server: the object's name (pods and Services derive from it)"),
    "metadata.generateName": honoured(
        "Kubernetes 1.36 staging/src/k8s.io/apiserver/pkg/storage/names/generate.go: prefix + 5 random chars"
    ),
    "metadata.namespace": honoured("Kubernetes 1.36 API server: default namespace `default`"),
    "metadata.uid": honoured(f"{JOB_CONTROLLER}: the Job uid in the controller-uid labels"),
    "metadata.labels": inert(f"{METADATA} (Kueue's queue-name label: admitted at once, no quota)"),
    "metadata.annotations": inert(METADATA),
}

# The pod spec, wherever a kind holds a pod template (paths relative to the pod spec).
POD_SPEC: dict[str, Support] = {
    "containers[].name": honoured(KUBELET),
    "containers[].image": inert(IMAGE),
    "containers[].imagePullPolicy": inert(IMAGE),
    "containers[].command": honoured(KUBELET),
    "containers[].args": honoured(KUBELET),
    "containers[].workingDir": honoured(KUBELET),
    "containers[].env[].name": honoured(KUBELET_ENV),
    "containers[].env[].value": honoured(KUBELET_ENV),
    "containers[].env[].valueFrom.fieldRef": honoured(f"{KUBELET_ENV} (metadata, status.podIP, spec fields)"),
    "containers[].env[].valueFrom.configMapKeyRef": honoured(KUBELET_ENV),
    "containers[].envFrom[].configMapRef": honoured(KUBELET_ENV),
    "containers[].envFrom[].prefix": honoured(KUBELET_ENV),
    "containers[].volumeMounts[].name": honoured(KUBELET_VOLUMES),
    "containers[].volumeMounts[].mountPath": honoured(KUBELET_VOLUMES),
    "containers[].volumeMounts[].readOnly": honoured(KUBELET_VOLUMES),
    "containers[].volumeMounts[].subPath": honoured(KUBELET_VOLUMES),
    "containers[].resources": inert(RESOURCES),
    "containers[].ports": inert(
        "declarative only: a cluster does not restrict ports to those declared either; with --env hostPort is "
        "checked by the scheduler (NodePorts)"
    ),
    "containers[].securityContext": inert(SECURITY),
    "containers[].readinessProbe": inert("readiness only gates Service endpoints; every running pod is published"),
    "containers[].lifecycle.preStop": inert("not run: a pod ends when its containers exit or it is killed"),
    "containers[].terminationMessagePath": honoured(f"{KUBELET}: a per-container file, read up to 4096 bytes"),
    "containers[].terminationMessagePolicy": honoured(f"{KUBELET}: FallbackToLogsOnError, 80 lines/2048 bytes"),
    "containers[].stdin": inert("no attached terminal: stdin is /dev/null as in a pod without `kubectl attach`"),
    "containers[].tty": inert("no attached terminal"),
    "initContainers[].name": honoured(f"{KUBELET}: run in order, each to completion, before the containers"),
    "initContainers[].image": inert(IMAGE),
    "initContainers[].imagePullPolicy": inert(IMAGE),
    "initContainers[].command": honoured(KUBELET),
    "initContainers[].args": honoured(KUBELET),
    "initContainers[].workingDir": honoured(KUBELET),
    "initContainers[].env[].name": honoured(KUBELET_ENV),
    "initContainers[].env[].value": honoured(KUBELET_ENV),
    "initContainers[].env[].valueFrom.fieldRef": honoured(KUBELET_ENV),
    "initContainers[].env[].valueFrom.configMapKeyRef": honoured(KUBELET_ENV),
    "initContainers[].envFrom[].configMapRef": honoured(KUBELET_ENV),
    "initContainers[].envFrom[].prefix": honoured(KUBELET_ENV),
    "initContainers[].volumeMounts[].name": honoured(KUBELET_VOLUMES),
    "initContainers[].volumeMounts[].mountPath": honoured(KUBELET_VOLUMES),
    "initContainers[].volumeMounts[].readOnly": honoured(KUBELET_VOLUMES),
    "initContainers[].volumeMounts[].subPath": honoured(KUBELET_VOLUMES),
    "initContainers[].resources": inert(RESOURCES),
    "initContainers[].securityContext": inert(SECURITY),
    "initContainers[].restartPolicy": honoured(f"{KUBELET}: Always = native sidecar (docs sidecar-containers)"),
    "initContainers[].terminationMessagePath": honoured(f"{KUBELET}: a per-container file"),
    "initContainers[].terminationMessagePolicy": honoured(f"{KUBELET}: FallbackToLogsOnError"),
    "restartPolicy": honoured(
        f"{KUBELET}: Always restarts a container on any exit, OnFailure on a non-zero one, Never not (in place, "
        "counted, the kubelet's back-off); init containers rerun unless Never"
    ),
    "hostname": honoured(DNS),
    "subdomain": honoured(DNS),
    "volumes[].name": honoured(KUBELET_VOLUMES),
    "volumes[].emptyDir": honoured(f"{KUBELET_VOLUMES}: a private directory; medium Memory a sized tmpfs"),
    "volumes[].persistentVolumeClaim.claimName": honoured(f"{KUBELET_VOLUMES}: one shared directory per claim"),
    "volumes[].persistentVolumeClaim.readOnly": honoured(KUBELET_VOLUMES),
    "volumes[].configMap.name": honoured(KUBELET_VOLUMES),
    "volumes[].configMap.items": honoured(KUBELET_VOLUMES),
    "volumes[].configMap.optional": honoured(KUBELET_VOLUMES),
    "volumes[].configMap.defaultMode": inert("file modes: every pod runs as this machine's user"),
    "volumes[].projected.sources[].configMap.name": honoured(
        f"{KUBELET_VOLUMES}: every source's keys in one directory"
    ),
    "volumes[].projected.sources[].configMap.items": honoured(KUBELET_VOLUMES),
    "volumes[].projected.sources[].configMap.optional": honoured(KUBELET_VOLUMES),
    "volumes[].projected.defaultMode": inert("file modes: every pod runs as this machine's user"),
    "serviceAccountName": honoured(
        f"{KUBELET_ENV} (fieldRef spec.serviceAccountName); with --env its token authenticates to the rehearsal's "
        "API server (rehearse/cluster/apiserver.py)"
    ),
    "serviceAccount": inert("deprecated alias of serviceAccountName; no API server here"),
    "automountServiceAccountToken": honoured(
        "with --env: whether the pod gets a token for the rehearsal's API server (rehearse/cluster/apiserver.py "
        "pod_env: the pod's, else its ServiceAccount's, else true); without --env there is no API server"
    ),
    "nodeSelector": inert(SCHEDULING),
    "nodeName": inert(SCHEDULING),
    "affinity": inert(SCHEDULING),
    "tolerations": inert(SCHEDULING),
    "topologySpreadConstraints": inert(SCHEDULING),
    "priorityClassName": inert(SCHEDULING),
    "priority": inert(SCHEDULING),
    "schedulerName": inert(SCHEDULING),
    "runtimeClassName": inert(IMAGE),
    "imagePullSecrets": inert(IMAGE),
    "securityContext": inert(SECURITY),
    "enableServiceLinks": inert("Service environment variables are not injected; DNS names are"),
    "terminationGracePeriodSeconds": inert("a killed pod is killed at once, as a node loss would"),
}

POD_TEMPLATE_METADATA: dict[str, Support] = {
    "metadata.labels": honoured(f"{JOB_CONTROLLER}: pod labels (Service selectors, fieldRef)"),
    "metadata.annotations": honoured(f"{JOB_CONTROLLER}: pod annotations (fieldRef)"),
    "metadata.name": inert("the controller names the pods"),
    "metadata.namespace": inert("pods run in the owner's namespace"),
}

JOB: dict[str, Support] = {
    "spec.parallelism": honoured(JOB_CONTROLLER),
    "spec.completions": honoured(JOB_CONTROLLER),
    "spec.completionMode": honoured(INDEXED, ("NonIndexed", "Indexed")),
    "spec.backoffLimit": honoured(f"{JOB_CONTROLLER}: counted failures (and OnFailure restarts)"),
    "spec.activeDeadlineSeconds": honoured(f"{JOB_CONTROLLER}: reason DeadlineExceeded"),
    "spec.podFailurePolicy.rules[].action": honoured(POD_FAILURE_POLICY, ("FailJob", "Ignore", "Count", "FailIndex")),
    "spec.podFailurePolicy.rules[].onExitCodes": honoured(POD_FAILURE_POLICY),
    "spec.podFailurePolicy.rules[].onPodConditions": honoured(POD_FAILURE_POLICY),
    "spec.suspend": honoured(f"{JOB_CONTROLLER}: a Job that is not suspended", (False,)),
    "spec.ttlSecondsAfterFinished": inert("deletes the finished Job later; the verdict is read when it finishes"),
    # The controller half of issue 27 moves these to `honoured` as it implements them.
    "spec.successPolicy": honoured(
        "Kubernetes 1.36 pkg/controller/job/success_policy.go: SuccessCriteriaMet, Complete"
    ),
    "spec.backoffLimitPerIndex": honoured(f"{JOB_CONTROLLER}: per-index failures, reason FailedIndexes"),
    "spec.maxFailedIndexes": honoured(f"{JOB_CONTROLLER}: reason MaxFailedIndexesExceeded"),
    "spec.podReplacementPolicy": honoured(f"{JOB_CONTROLLER}: deleted pods end at once here, so both coincide"),
}

RAY_GROUP: dict[str, Support] = {
    "rayStartParams": honoured(f"{KUBERAY_POD} generateRayStartCommand, setMissingRayStartParams"),
}
RAY_CLUSTER_SPEC: dict[str, Support] = {
    "rayVersion": inert(IMAGE),
    "enableInTreeAutoscaling": inert(AUTOSCALER),
    "autoscalerOptions": inert(AUTOSCALER),
    "headGroupSpec.serviceType": inert("the head Service is a DNS name here; gates refuse exposed types"),
    "headServiceAnnotations": inert(METADATA),
    "workerGroupSpecs[].groupName": honoured(f"{KUBERAY_POD} and utils/util.go PodName"),
    "workerGroupSpecs[].replicas": honoured(f"{KUBERAY_CLUSTER}: an ended pod is replaced (reconcilePods)"),
    "workerGroupSpecs[].minReplicas": inert("bounds for the autoscaler, which is off (replicas are created)"),
    "workerGroupSpecs[].maxReplicas": inert("bounds for the autoscaler, which is off (replicas are created)"),
    "workerGroupSpecs[].suspend": honoured(f"{KUBERAY_CLUSTER}: a suspended group has no pods"),
}

RAY_JOB: dict[str, Support] = {
    "spec.entrypoint": honoured(f"{KUBERAY_JOB} BuildJobSubmitCommand"),
    "spec.entrypointNumCpus": honoured(f"{KUBERAY_JOB} BuildJobSubmitCommand: --entrypoint-num-cpus when above 0"),
    "spec.runtimeEnvYAML": honoured(f"{KUBERAY_JOB}: --runtime-env-json (pip pins checked against this machine)"),
    "spec.metadata": honoured(f"{KUBERAY_JOB}: --metadata-json"),
    "spec.shutdownAfterJobFinishes": honoured(KUBERAY_JOB),
    "spec.ttlSecondsAfterFinished": inert("delays the cluster's deletion after the job; the verdict is read first"),
    "spec.activeDeadlineSeconds": honoured(f"{KUBERAY_JOB}: Failed, DeadlineExceeded"),
    "spec.backoffLimit": honoured(
        f"{KUBERAY_JOB}: a failed RayJob retried on a new cluster (checkBackoffLimitAndUpdateStatusIfNeeded)"
    ),
    "spec.suspend": honoured(f"{KUBERAY_JOB}: a RayJob that is not suspended", (False,)),
    "spec.submitterConfig.backoffLimit": honoured(f"{KUBERAY_JOB} (default 2)"),
    "spec.submissionMode": honoured(f"{KUBERAY_JOB}: a submitter Job (K8sJobMode)", ("K8sJobMode",)),
    # The controller half of issue 27 moves these to `honoured` (or widens the values) as it implements them.
    "spec.clusterSelector": honoured(f"{KUBERAY_JOB}: the RayCluster of this run named by ray.io/cluster"),
    "spec.deletionStrategy": honoured(f"{KUBERAY_JOB} handleDeletionRules/handleLegacyDeletionPolicy: reported"),
}
# HTTPMode, InteractiveMode and SidecarMode (submissionMode) are pending: absent from its honoured values.

# A Deployment as a long-lived service beside the run's workloads (its pods until the run ends). No rollout happens
# in a rehearsal (the template never changes), so the rollout knobs beyond what one replica needs, availability
# timing and autoscaling-related fields are refused (not in the table).
DEPLOYMENT: dict[str, Support] = {
    "spec.replicas": honoured(f"{DEPLOYMENT_CONTROLLER}: that many pods, an ended one replaced (manageReplicas)"),
    "spec.selector.matchLabels": honoured(
        f"{DEPLOYMENT_CONTROLLER}: must match the template's labels (pkg/apis/apps/validation)"
    ),
    "spec.strategy.type": honoured(
        f"{DEPLOYMENT_CONTROLLER}: no rollout happens in a rehearsal; Recreate (one writer at a time) is what a "
        "single replica needs",
        ("Recreate",),
    ),
    "spec.revisionHistoryLimit": inert("old ReplicaSets are kept for rollbacks; no rollout happens in a rehearsal"),
    "spec.paused": honoured(f"{DEPLOYMENT_CONTROLLER}: a Deployment that is not paused", (False,)),
}

# Where each kind holds its pod templates (pod spec paths) and its Ray cluster spec.
POD_SPEC_AT: dict[str, tuple[str, ...]] = {
    "Job": ("spec.template.spec",),
    "RayCluster": ("spec.headGroupSpec.template.spec", "spec.workerGroupSpecs[].template.spec"),
    "RayJob": (
        "spec.rayClusterSpec.headGroupSpec.template.spec",
        "spec.rayClusterSpec.workerGroupSpecs[].template.spec",
        "spec.submitterPodTemplate.spec",
    ),
    "Pod": ("spec",),
    "Deployment": ("spec.template.spec",),
}
RAY_CLUSTER_SPEC_AT = {"RayCluster": "spec", "RayJob": "spec.rayClusterSpec"}
RAY_GROUPS = ("headGroupSpec", "workerGroupSpecs[]")


def _mount(prefix: str, fields: Mapping[str, Support]) -> dict[str, Support]:
    return {f"{prefix}.{path}": support for path, support in fields.items()}


def fields_of(kind: str) -> dict[str, Support]:
    """The whole table of one kind, with the pod spec and Ray groups mounted where the kind holds them."""
    table = dict(METADATA_FIELDS)
    table.update({"Job": JOB, "RayJob": RAY_JOB, "Deployment": DEPLOYMENT}.get(kind, {}))
    if kind in RAY_CLUSTER_SPEC_AT:
        at = RAY_CLUSTER_SPEC_AT[kind]
        table.update(_mount(at, RAY_CLUSTER_SPEC))
        for group in RAY_GROUPS:
            table.update(_mount(f"{at}.{group}", RAY_GROUP))
    for spec_at in POD_SPEC_AT.get(kind, ()):
        if kind != "Pod":
            table.update(_mount(spec_at.removesuffix(".spec"), POD_TEMPLATE_METADATA))
        table.update(_mount(spec_at, POD_SPEC))
    return table


@dataclass(frozen=True)
class Unsupported:
    """A field the rehearsal would not honour: exit 2 names the object, the path and why."""

    kind: str
    name: str
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}: field {self.path}: {self.reason}"


def _structural(table: Mapping[str, Support], path: str) -> bool:
    return any(key.startswith(f"{path}.") or key.startswith(f"{path}[]") for key in table)


def _walk(table: Mapping[str, Support], node: Any, path: str, real: str, out: list[tuple[str, str]]) -> None:
    if isinstance(node, list):
        for index, item in enumerate(node):
            _walk(table, item, f"{path}[]", f"{real}[{index}]", out)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        child = f"{path}.{key}" if path else str(key)
        child_real = f"{real}.{key}" if real else str(key)
        entry = table.get(child)
        if entry is not None:
            if entry.status == PENDING:
                out.append((child_real, f"not emulated yet ({entry.source})"))
            elif entry.values is not None and value not in entry.values:
                allowed = ", ".join(repr(v) for v in entry.values)
                out.append(
                    (child_real, f"value {value!r} is not emulated (the rehearsal honours {allowed}; {entry.source})")
                )
            elif _structural(table, child):
                _walk(table, value, child, child_real, out)
            continue
        if _structural(table, child):
            _walk(table, value, child, child_real, out)
            continue
        out.append((child_real, "not emulated by the rehearsal (not in its support table, docs/rehearsal-support.md)"))


def unsupported_fields(obj: Mapping[str, Any]) -> list[Unsupported]:
    """Every field of a workload object outside the support table (or pending, or with a value it does not
    honour); empty for a fully supported object."""
    kind = str(obj.get("kind", ""))
    name = str((obj.get("metadata") or {}).get("name") or (obj.get("metadata") or {}).get("generateName") or "?")
    found: list[tuple[str, str]] = []
    _walk(fields_of(kind), dict(obj), "", "", found)
    return [Unsupported(kind, name, path, reason) for path, reason in found]


def table_rows() -> Iterator[tuple[str, str, str, str]]:
    """(group, field, status, source or reason) for every entry, in the order of the table."""
    groups: tuple[tuple[str, Mapping[str, Support]], ...] = (
        ("every object", METADATA_FIELDS),
        ("Job", JOB),
        ("Deployment", DEPLOYMENT),
        ("pod template metadata", POD_TEMPLATE_METADATA),
        ("pod spec", POD_SPEC),
        ("RayJob", RAY_JOB),
        ("Ray cluster spec", RAY_CLUSTER_SPEC),
        ("Ray group (head and workers)", RAY_GROUP),
    )
    for group, fields in groups:
        for path, support in fields.items():
            values = f" (values: {', '.join(str(v) for v in support.values)})" if support.values else ""
            yield group, path, support.status + values, support.source


SUPPORT_DOC = "docs/rehearsal-support.md"
TABLE_BEGIN = "<!-- support-table: begin (rehearse/support.py) -->"
TABLE_END = "<!-- support-table: end -->"


def _grouped(rows: Iterator[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    """(first, seconds) in the order of first appearance: rows that share their first cells become one row."""
    grouped: dict[str, list[str]] = {}
    for key, item in rows:
        grouped.setdefault(key, []).append(item)
    return list(grouped.items())


def _twins(names: list[str]) -> list[str]:
    """`containers[].x` and `initContainers[].x` in one row shown once, as `(init)containers[].x`."""
    out = []
    for name in names:
        if name.startswith("initContainers[]") and "containers[]" + name.removeprefix("initContainers[]") in names:
            continue
        if name.startswith("containers[]") and "initContainers[]" + name.removeprefix("containers[]") in names:
            name = "(init)" + name
        out.append(name)
    return out


def markdown_table() -> str:
    """The support table as docs/rehearsal-support.md shows it (a test keeps the two equal): fields of one group
    with the same status and source share a row, and kinds with the same answer too."""
    lines = ["| group | fields | status | source or reason |", "|---|---|---|---|"]
    fields = _grouped((f"| {g} |\0| {s} | {r} |", f) for g, f, s, r in table_rows())
    lines += [key.replace("\0", f" {', '.join(f'`{n}`' for n in _twins(names))} ") for key, names in fields]
    kinds: list[tuple[str, str]] = [(f"runs as pods{LONG_LIVED.get(k, '')}", k) for k in WORKLOAD_KINDS]
    kinds += [(f"refused: {why}", k) for k, why in PENDING_KINDS.items()]
    kinds += [(why, k) for k, why in INFRA_KINDS.items()]
    lines += ["", "| kinds | rehearsal |", "|---|---|"]
    lines += [f"| {', '.join(names)} | {answer} |" for answer, names in _grouped(iter(kinds))]
    lines += ["| any other kind | refused, exit 2 naming it (`--skip-unsupported`: SKIPPED, exit 3) |"]
    return "\n".join(lines)


def write_table(path: Path) -> None:
    """Replace the table between the markers of the guide at path with the code's."""
    text = path.read_text()
    if TABLE_BEGIN not in text or TABLE_END not in text:
        raise SystemExit(f"{path} lacks the support-table markers {TABLE_BEGIN!r} and {TABLE_END!r}")
    before, rest = text.split(TABLE_BEGIN, 1)
    after = rest.split(TABLE_END, 1)[1]
    path.write_text(f"{before}{TABLE_BEGIN}\n{markdown_table()}\n{TABLE_END}{after}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The rehearsal's support table, as its guide shows it.")
    parser.add_argument(
        "--write", type=Path, metavar="GUIDE", help=f"rewrite it between GUIDE's markers ({SUPPORT_DOC})"
    )
    args = parser.parse_args(argv)
    if args.write is None:
        print(markdown_table())
    else:
        write_table(args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
