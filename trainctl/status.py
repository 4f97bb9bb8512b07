"""The Ray jobs of a cluster and their state, as a StatusReport: the jobs of the RayCluster (read in its head
pod), the RayJob objects, the fabric-gate taints and each GPU group's Kueue quota beside its usable nodes
(trainctl/commands/status.py is the command).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainctl import gate_taints, queue_status
from trainctl.eks_auth import Target
from trainctl.exit_codes import ExitCode
from trainctl.kube import KubeError, Pod, api_errors, find_head_pod
from trainctl.output import table
from trainctl.progress import Progress
from trainctl.ray_jobs import RayJob, iso_time, list_jobs

ENTRYPOINT_WIDTH = 60


@dataclass(frozen=True)
class RayJobObject:
    """A KubeRay RayJob custom object, as far as its state goes."""

    name: str
    job_status: str | None
    deployment_status: str | None
    ray_cluster: str | None
    job_id: str | None
    start_time: str | None
    end_time: str | None
    message: str | None

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> RayJobObject:
        metadata = obj.get("metadata") or {}
        status = obj.get("status") or {}
        return cls(
            name=str(metadata.get("name", "?")),
            job_status=status.get("jobStatus"),
            deployment_status=status.get("jobDeploymentStatus"),
            ray_cluster=status.get("rayClusterName"),
            job_id=status.get("jobId"),
            start_time=status.get("startTime"),
            end_time=status.get("endTime"),
            message=status.get("message"),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "jobStatus": self.job_status,
            "jobDeploymentStatus": self.deployment_status,
            "rayClusterName": self.ray_cluster,
            "jobId": self.job_id,
            "startTime": self.start_time,
            "endTime": self.end_time,
            "message": self.message,
        }


@dataclass
class StatusReport:
    namespace: str
    ray_cluster: str
    where: str
    head: Pod | None = None
    jobs: list[RayJob] | None = None
    rayjobs: list[RayJobObject] | None = None
    gate_tainted: list[gate_taints.GateTaint] | None = None
    """Nodes the fabric gate took out; None when the nodes could not be listed (a warning, not an error)."""
    gpu_queues: list[queue_status.GroupQueue] | None = None
    """Each GPU group's Kueue quota beside its usable nodes; None without Kueue or when not readable (a warning)."""
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.ERROR if self.errors else ExitCode.OK

    def to_json(self) -> dict[str, Any]:
        return {
            "command": "status",
            "where": self.where,
            "namespace": self.namespace,
            "ray_cluster": self.ray_cluster or None,
            "head_pod": None if self.head is None else self.head.name,
            "exit_code": int(self.exit_code),
            "ray_jobs": None if self.jobs is None else [job.to_json() for job in self.jobs],
            "rayjobs": None if self.rayjobs is None else [job.to_json() for job in self.rayjobs],
            "gate_tainted_nodes": None if self.gate_tainted is None else [t.to_json() for t in self.gate_tainted],
            "gpu_queues": None if self.gpu_queues is None else [q.to_json() for q in self.gpu_queues],
            "errors": list(self.errors),
        }

    def render(self) -> tuple[str, str]:
        out: list[str] = []
        if self.jobs is not None and self.head is not None:
            out.append(f"Ray jobs on {self.head} (RayCluster {self.head.ray_cluster or '-'}):")
            if self.jobs:
                rows = [
                    [
                        job.name,
                        job.status,
                        iso_time(job.start_time) or "-",
                        iso_time(job.end_time) or "-",
                        _clip(job.entrypoint),
                    ]
                    for job in self.jobs
                ]
                out.append(table(["SUBMISSION ID", "STATUS", "START", "END", "ENTRYPOINT"], rows))
            else:
                out.append("  (none)")
        if self.rayjobs is not None:
            if out:
                out.append("")
            out.append(f"RayJobs in namespace {self.namespace}:")
            if self.rayjobs:
                rows = [
                    [
                        job.name,
                        job.job_status or "-",
                        job.deployment_status or "-",
                        job.ray_cluster or "-",
                        job.start_time or "-",
                        job.end_time or "-",
                    ]
                    for job in self.rayjobs
                ]
                out.append(table(["NAME", "JOB STATUS", "DEPLOYMENT", "RAY CLUSTER", "START", "END"], rows))
            else:
                out.append("  (none)")
        if self.gate_tainted:
            out += ["", *gate_taints.render(self.gate_tainted)]
        if self.gpu_queues:
            out += ["", *queue_status.render(self.gpu_queues)]
        differences = [q.difference for q in self.gpu_queues or [] if q.difference]
        err = "".join(f"warning: {message}\n" for message in [*self.warnings, *differences])
        err += "".join(f"error: {message}\n" for message in self.errors)
        return ("\n".join(out) + "\n") if out else "", err


def _clip(text: str) -> str:
    return text if len(text) <= ENTRYPOINT_WIDTH else text[: ENTRYPOINT_WIDTH - 3] + "..."


def list_rayjobs(api: Any, namespace: str, *, timeout: float) -> list[RayJobObject]:
    from kubernetes import client

    with api_errors(f"list rayjobs.ray.io in namespace {namespace}"):
        listed = client.CustomObjectsApi(api).list_namespaced_custom_object(
            "ray.io", "v1", namespace, "rayjobs", _request_timeout=timeout
        )
    items = (listed.get("items") or []) if isinstance(listed, dict) else []
    return sorted((RayJobObject.from_object(item) for item in items if isinstance(item, dict)), key=lambda j: j.name)


def collect(target: Target, progress: Progress | None = None) -> StatusReport:
    report = StatusReport(target.namespace, target.ray_cluster, target.where)
    try:
        report.head = find_head_pod(target.api, target.namespace, target.ray_cluster, timeout=target.request_timeout)
        if progress is not None:
            progress.say(f"reading the Ray jobs in {report.head} ({target.where}) ...")
        report.jobs = list_jobs(target.api, report.head)
    except KubeError as exc:
        report.errors.append(str(exc))
    try:
        report.rayjobs = list_rayjobs(target.api, target.namespace, timeout=target.request_timeout)
    except KubeError as exc:
        report.errors.append(str(exc))
    try:
        report.gate_tainted = gate_taints.list_gate_tainted(target.api, timeout=target.request_timeout)
    except KubeError as exc:
        report.warnings.append(f"fabric-gate taints not shown: {exc}")
    try:
        report.gpu_queues = queue_status.list_group_queues(target.api, timeout=target.request_timeout)
    except KubeError as exc:
        report.warnings.append(f"GPU queue quotas not shown: {exc}")
    return report
