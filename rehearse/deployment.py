"""A Deployment (apps/v1) as the Kubernetes 1.36 Deployment and ReplicaSet controllers run it, for what a rehearsal
needs: a long-lived service (the fabric gate's remediation controller) beside the finite workloads.

- pkg/controller/deployment/sync.go getNewReplicaSet: one ReplicaSet named `<deployment>-<pod-template-hash>`, the
  hash (controller.ComputeHash: FNV-32a of the pod template, rand.SafeEncodeString) added to the template's labels
  as `pod-template-hash`, owned by the Deployment (metav1.NewControllerRef: controller and blockOwnerDeletion true).
- pkg/controller/replicaset/replica_set.go manageReplicas: `spec.replicas` pods from the template, generateName
  `<replicaset>-` (pkg/controller/controller_utils.go getPodsPrefix), owned by the ReplicaSet; a pod that ends or is
  deleted is replaced (the kubelet restarts a container in place before that: restartPolicy Always, the only value
  a Deployment's template may have, pkg/apis/apps/validation ValidatePodTemplateSpecForReplicaSet).
- Available (pkg/controller/deployment/sync.go, util/deployment_util.go DeploymentComplete): every replica's pod
  running (readiness probes are inert in a rehearsal, minReadySeconds is refused by the support table).

A Deployment has no end of its own: the run loop (loop.py) stops it when the finite workloads end, as a RayCluster.
The template never changes during a rehearsal, so no rollout happens: strategy Recreate is what one replica needs and
RollingUpdate's parameters are refused (rehearse/support.py). Not managed by Kueue (no queue-name label: refused,
the rehearsal's Kueue model runs batch/job and ray.io frameworks only)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from rehearse.controller import PodAPI
from rehearse.errors import RehearsalError
from rehearse.pods import Pod, PodPlan, object_uid, random_suffix

TEMPLATE_HASH_LABEL = "pod-template-hash"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# How many pods the ReplicaSet may replace before the rehearsal stops it (a crash-looping pod is restarted in place
# and does not count; a pod that ends, is evicted or lost does).
MAX_REPLACED_PODS = 10
_SAFE = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery/pkg/util/rand SafeEncodeString's alphabet


def template_hash(template: dict[str, Any]) -> str:
    """A stable pod-template-hash: FNV-32a over the template, in SafeEncodeString's alphabet. The value differs from
    the Go controller's (which hashes the Go struct, not JSON); its form and stability per template are the same."""
    value = 0x811C9DC5
    for byte in json.dumps(template, sort_keys=True).encode():
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    text = str(value)
    return "".join(_SAFE[int(ch) % len(_SAFE)] for ch in text)


@dataclass
class DeploymentController:
    obj: dict[str, Any]
    kind: str = "Deployment"
    pods: list[Pod] = field(default_factory=list)
    started: float = 0.0
    finished: float | None = None
    status: str = "Pending"
    message: str = ""
    ready: bool = False
    long_lived: bool = True
    notes: list[str] = field(default_factory=list)
    conditions: list[dict[str, str]] = field(default_factory=list)
    replaced: int = 0

    def __post_init__(self) -> None:
        meta, spec = self.obj["metadata"], self.obj["spec"]
        self.name: str = meta["name"]
        self.namespace: str = meta.get("namespace", "default")
        self.uid: str = str(meta.get("uid") or object_uid("Deployment", self.namespace, self.name))
        if QUEUE_LABEL in (meta.get("labels") or {}):
            raise RehearsalError(
                f"Deployment/{self.name}: label {QUEUE_LABEL}: a Deployment managed by Kueue (its pod-group "
                "integration) is not emulated by the rehearsal; remove the label"
            )
        self.replicas: int = int(spec.get("replicas", 1))
        self.template: dict[str, Any] = spec["template"]
        selector = (spec.get("selector") or {}).get("matchLabels") or {}
        labels = (self.template.get("metadata") or {}).get("labels") or {}
        if any(labels.get(k) != v for k, v in selector.items()):
            # pkg/apis/apps/validation ValidateDeploymentSpec: the selector must match the template's labels.
            raise RehearsalError(
                f"Deployment/{self.name}: spec.template.metadata.labels: Invalid value: `selector` does not match "
                "template `labels`"
            )
        self.hash = template_hash(self.template)
        self.replica_set = f"{self.name}-{self.hash}"
        self.replica_set_uid = object_uid("ReplicaSet", self.namespace, self.replica_set)

    @property
    def done(self) -> bool:
        return self.finished is not None and not any(p.running for p in self.pods)

    def _plan(self) -> PodPlan:
        meta = self.template.get("metadata") or {}
        owner = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": self.replica_set,
            "uid": self.replica_set_uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
        # The API server defaults restartPolicy to Always (pkg/apis/core/v1/defaults.go SetDefaults_PodSpec), the
        # only value a Deployment's template may have.
        spec = {**self.template["spec"], "restartPolicy": self.template["spec"].get("restartPolicy", "Always")}
        return PodPlan(
            name=f"{self.replica_set}-{random_suffix()}",
            namespace=self.namespace,
            spec=spec,
            workload=f"Deployment/{self.name}",
            labels={**(meta.get("labels") or {}), TEMPLATE_HASH_LABEL: self.hash},
            annotations=dict(meta.get("annotations") or {}),
            owner_references=[owner],
        )

    def start(self, api: PodAPI) -> None:
        self.started = api.now()
        self.finished = None
        self.pods += [api.start(self._plan()) for _ in range(self.replicas)]

    def on_pod_end(self, api: PodAPI, pod: Pod) -> None:
        """manageReplicas: fewer active pods than replicas, so the ReplicaSet creates one."""
        if self.finished is not None or pod.deleted_by_controller:
            return
        what = f"pod {pod.name} ended ({pod.phase}, exit codes {pod.exit_codes})"
        if self.replaced >= MAX_REPLACED_PODS:
            self._end(api, "Failed", f"{what} after {self.replaced} replacements; the rehearsal stops here")
            return
        self.replaced += 1
        replacement = api.start(self._plan())
        self.pods.append(replacement)
        self.notes.append(f"{what}: ReplicaSet {self.replica_set} created {replacement.name}")

    def _end(self, api: PodAPI, status: str, message: str) -> None:
        self.status, self.message, self.finished = status, message, api.now()
        for pod in self.pods:
            if pod.running:
                pod.deleted_by_controller = True
                api.kill(pod)

    def tick(self, api: PodAPI) -> None:
        running = [p for p in self.pods if p.running and p.launched is not None]
        for pod in running:
            api.refresh(pod)
        if not self.ready and self.finished is None and len(running) >= self.replicas:
            self.ready = True
            self.status = "Ready"
            self.message = f"Available: {len(running)}/{self.replicas} replicas at {api.now() - self.started:.1f} s"

    def suspend(self, api: PodAPI, reason: str) -> None:  # not managed by Kueue: never evicted
        raise RehearsalError(f"Deployment/{self.name}: suspended ({reason}), which the rehearsal does not emulate")

    def status_fields(self) -> dict[str, str]:
        running = [p for p in self.pods if p.running and p.launched is not None]
        return {"replicas": str(self.replicas), "availableReplicas": str(len(running))}

    def stop(self, api: PodAPI, reason: str) -> None:
        restarts = sum(p.restarts for p in self.pods)
        extra = f"; its containers restarted {restarts} time(s)" if restarts else ""
        if self.ready:
            self._end(api, "Ready", f"{self.message}; kept running until {reason}, then stopped{extra}")
        else:
            self._end(api, "NotReady", f"not every replica ran when {reason}{extra}")

    def state(self) -> tuple[str, str]:
        return self.status, self.message
