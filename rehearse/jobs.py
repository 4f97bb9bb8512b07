"""The batch/v1 Job controller, as the rehearsal runs it.

Semantics mirrored from Kubernetes (docs: concepts/workloads/controllers/job; controller code:
kubernetes/kubernetes pkg/controller/job/job_controller.go, pod_failure_policy.go, indexed_job_utils.go):
- the apiserver gives the Job a uid and its pod template the labels `batch.kubernetes.io/controller-uid`
  and `batch.kubernetes.io/job-name` plus the legacy `controller-uid` and `job-name` (generateSelector in
  pkg/registry/batch/job/strategy.go; docs reference/labels-annotations-taints), so every pod carries them
  and a `fieldRef` to `metadata.labels['batch.kubernetes.io/controller-uid']` resolves to the Job's uid;
- parallelism and completions; completionMode Indexed: one successful pod per index, pod name
  `<job>-<index>-<random 5>`, hostname `<job>-<index>` unless the template sets `hostname`,
  `subdomain` honoured, the index in the annotation and label `batch.kubernetes.io/job-completion-index`
  and in env JOB_COMPLETION_INDEX; NonIndexed pods are `<job>-<random 5>`;
- a failed pod goes through podFailurePolicy first: rules in order, the first that matches decides
  (onExitCodes: containers that terminated with a non-zero code, optionally only `containerName`,
  operator In/NotIn; onPodConditions: a pod condition of that type and status, e.g. the
  DisruptionTarget condition `--kill` gives). FailJob fails the Job (reason PodFailurePolicy), Ignore
  replaces the pod without counting, Count (or no match) counts towards backoffLimit;
- more counted failures than backoffLimit: Failed, reason BackoffLimitExceeded; restartPolicy
  OnFailure counts container restarts too (restarts + failed pods > backoffLimit);
- activeDeadlineSeconds: Failed, reason DeadlineExceeded; a failed Job terminates its running pods;
- counted failures delay the replacement pod (Kubernetes: 10 s doubling, capped at 6 min; the
  rehearsal's base is an option so tests can shorten it);
- the final condition: Complete (reason CompletionsReached) or Failed with its reason.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from rehearse.pods import Pod, PodPlan, Runtime, random_suffix

INDEX_KEY = "batch.kubernetes.io/job-completion-index"
UID_KEY = "batch.kubernetes.io/controller-uid"
NAME_KEY = "batch.kubernetes.io/job-name"
LEGACY_UID_KEY = "controller-uid"
LEGACY_NAME_KEY = "job-name"
BACKOFF_CAP_S = 360.0


@dataclass
class Condition:
    type: str
    reason: str
    message: str


@dataclass
class JobController:
    obj: dict[str, Any]
    backoff_base_s: float = 10.0
    kind: str = "Job"
    pods: list[Pod] = field(default_factory=list)
    condition: Condition | None = None
    started: float = 0.0
    finished: float | None = None
    failed: int = 0
    succeeded_indexes: set[int] = field(default_factory=set)
    succeeded: int = 0
    _not_before: float = 0.0

    def __post_init__(self) -> None:
        meta, spec = self.obj["metadata"], self.obj["spec"]
        self.name: str = meta["name"]
        self.namespace: str = meta.get("namespace", "default")
        # What the apiserver assigns on create (a manifest has none; a server-side dump keeps its own).
        self.uid: str = str(meta.get("uid") or uuid.uuid4())
        self.indexed = spec.get("completionMode", "NonIndexed") == "Indexed"
        self.parallelism: int = int(spec.get("parallelism", 1))
        completions = spec.get("completions")
        self.completions: int | None = int(completions) if completions is not None else None
        if self.indexed and self.completions is None:
            raise ValueError(f"Job {self.name}: completionMode Indexed needs completions")
        self.backoff_limit: int = int(spec.get("backoffLimit", 6))
        self.rules: list[dict[str, Any]] = (spec.get("podFailurePolicy") or {}).get("rules", [])
        self.deadline: int | None = spec.get("activeDeadlineSeconds")
        self.template: dict[str, Any] = spec["template"]
        self.restart_policy = self.template["spec"].get("restartPolicy", "Never")

    @property
    def done(self) -> bool:
        return self.condition is not None and not any(p.running for p in self.pods)

    @property
    def active(self) -> list[Pod]:
        return [p for p in self.pods if p.running]

    def start(self, runtime: Runtime) -> None:
        self.started = time.monotonic()
        self._fill(runtime)

    def _plan(self, index: int | None) -> PodPlan:
        labels = {
            **self.template.get("metadata", {}).get("labels", {}),
            UID_KEY: self.uid,
            NAME_KEY: self.name,
            LEGACY_UID_KEY: self.uid,
            LEGACY_NAME_KEY: self.name,
        }
        annotations = dict(self.template.get("metadata", {}).get("annotations", {}))
        extra_env: dict[str, str] = {}
        if index is not None:
            name = f"{self.name}-{index}-{random_suffix()}"
            hostname = f"{self.name}-{index}"
            labels[INDEX_KEY] = str(index)
            annotations[INDEX_KEY] = str(index)
            extra_env["JOB_COMPLETION_INDEX"] = str(index)
        else:
            name = f"{self.name}-{random_suffix()}"
            hostname = None
        return PodPlan(
            name=name,
            namespace=self.namespace,
            spec=self.template["spec"],
            workload=f"Job/{self.name}",
            hostname=hostname,
            labels=labels,
            annotations=annotations,
            extra_env=extra_env,
        )

    def _wanted(self) -> list[int | None]:
        active = self.active
        room = self.parallelism - len(active)
        if room <= 0:
            return []
        if self.indexed:
            assert self.completions is not None
            busy = {int(p.plan.annotations[INDEX_KEY]) for p in active}
            free = [i for i in range(self.completions) if i not in self.succeeded_indexes and i not in busy]
            return list(free[:room])
        if self.completions is None:
            # Work-queue Job: once a pod succeeded no new pods are made.
            return [None] * room if self.succeeded == 0 else []
        return [None] * max(0, min(room, self.completions - self.succeeded - len(active)))

    def _fill(self, runtime: Runtime) -> None:
        if self.condition is not None or time.monotonic() < self._not_before:
            return
        for index in self._wanted():
            self.pods.append(runtime.start(self._plan(index)))

    def _match(self, pod: Pod) -> tuple[str, str] | None:
        """(action, message) of the first podFailurePolicy rule the failed pod matches."""
        statuses = [
            (c["name"], pod.exit_codes.get(c["name"]))
            for c in [*pod.plan.spec.get("initContainers", []), *pod.plan.spec["containers"]]
        ]
        for rule in self.rules:
            on_codes = rule.get("onExitCodes")
            if on_codes:
                values = set(on_codes["values"])
                for name, code in statuses:
                    if code in (None, 0) or (on_codes.get("containerName") not in (None, name)):
                        continue
                    if (code in values) == (on_codes["operator"] == "In"):
                        index = pod.plan.annotations.get(INDEX_KEY, "")
                        return rule["action"], (
                            f"Container {name} for pod {pod.plan.namespace}/{pod.name} failed with exit code "
                            f"{code} matching {rule['action']} rule at index {index}"
                        )
            for pattern in rule.get("onPodConditions", []):
                for condition in pod.conditions:
                    if condition["type"] == pattern["type"] and condition["status"] == pattern.get("status", "True"):
                        return rule["action"], f"Pod {pod.plan.namespace}/{pod.name} has condition {pattern['type']}"
        return None

    def on_pod_end(self, runtime: Runtime, pod: Pod) -> None:
        """Records the ended pod; replacements are made by the next `tick`, once every pod that ended
        in the same poll has been recorded."""
        if self.condition is not None or pod.deleted_by_controller:
            return
        if pod.phase == "Succeeded":
            self.succeeded += 1
            if self.indexed:
                self.succeeded_indexes.add(int(pod.plan.annotations[INDEX_KEY]))
            self._check_complete(runtime)
            return
        match = self._match(pod)
        action = match[0] if match else "Count"
        if action == "FailJob":
            assert match is not None
            self._fail(runtime, "PodFailurePolicy", match[1])
            return
        if action == "Ignore":
            return
        self.failed += 1
        self._check_backoff(runtime)
        if self.condition is None:
            delay = min(self.backoff_base_s * 2 ** (self.failed - 1), BACKOFF_CAP_S)
            self._not_before = time.monotonic() + delay

    def _check_backoff(self, runtime: Runtime) -> None:
        restarts = sum(p.restarts for p in self.pods) if self.restart_policy == "OnFailure" else 0
        if self.failed + restarts > self.backoff_limit:
            self._fail(runtime, "BackoffLimitExceeded", "Job has reached the specified backoff limit")

    def _check_complete(self, runtime: Runtime) -> None:
        if self.indexed:
            complete = len(self.succeeded_indexes) == self.completions
        elif self.completions is None:
            complete = self.succeeded > 0 and not self.active
        else:
            complete = self.succeeded >= self.completions
        if complete:
            self.condition = Condition("Complete", "CompletionsReached", "Reached expected number of succeeded pods")
            self.finished = time.monotonic()
            for pod in self.active:
                pod.deleted_by_controller = True
                runtime.kill(pod)

    def _fail(self, runtime: Runtime, reason: str, message: str) -> None:
        self.condition = Condition("Failed", reason, message)
        self.finished = time.monotonic()
        for pod in self.active:
            pod.deleted_by_controller = True
            runtime.kill(pod)

    def tick(self, runtime: Runtime) -> None:
        if self.condition is not None:
            return
        if self.deadline is not None and time.monotonic() - self.started > self.deadline:
            self._fail(runtime, "DeadlineExceeded", "Job was active longer than specified deadline")
            return
        if self.restart_policy == "OnFailure":
            for pod in self.active:
                pod.refresh()
            self._check_backoff(runtime)
        self._fill(runtime)

    def state(self) -> tuple[str, str]:
        if self.condition is None:
            return "Running", ""
        return self.condition.type, f"{self.condition.reason}: {self.condition.message}"
