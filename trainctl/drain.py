"""Draining an environment's workload namespaces (`trainctl drain`, trainctl/commands/drain.py): the RayJobs,
RayClusters and Jobs deleted, then a survey of what would still hold a finalizer, until nothing is left.

In every namespace given, in this order: RayJobs (KubeRay deletes their RayClusters), RayClusters, batch Jobs
(propagationPolicy Background, so their pods go). Then it waits until none of them is left, no Kueue Workload is
left (Kueue removes its finalizer kueue.x-k8s.io/resource-in-use once the job is gone; Kueue v0.19.2), and no pod
mounts a claim (the claim's kubernetes.io/pvc-protection finalizer holds it while a pod uses it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainctl.exit_codes import ExitCode
from trainctl.kube import KubeError, api_errors
from trainctl.output import table


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    delete: bool
    """Deleted by drain (the others are waited for: their controllers delete them)."""


RAYJOBS = Kind("ray.io", "v1", "rayjobs", "RayJob", delete=True)
RAYCLUSTERS = Kind("ray.io", "v1", "rayclusters", "RayCluster", delete=True)
JOBS = Kind("batch", "v1", "jobs", "Job", delete=True)
WORKLOADS = Kind("kueue.x-k8s.io", "v1beta2", "workloads", "Workload", delete=False)
KINDS = (RAYJOBS, RAYCLUSTERS, JOBS, WORKLOADS)
CLAIM_PROTECTION = "kubernetes.io/pvc-protection"


@dataclass(frozen=True)
class Left:
    """Something still there that a stack delete would wait for."""

    namespace: str
    kind: str
    name: str
    why: str

    def to_json(self) -> dict[str, str]:
        return {"namespace": self.namespace, "kind": self.kind, "name": self.name, "why": self.why}


@dataclass
class DrainReport:
    where: str
    namespaces: tuple[str, ...]
    deleted: list[str] = field(default_factory=list)
    left: list[Left] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    released_claims: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> ExitCode:
        if self.errors:
            return ExitCode.ERROR
        return ExitCode.CHECK_FAILED if self.left else ExitCode.OK

    def to_json(self) -> dict[str, Any]:
        return {
            "command": "drain",
            "where": self.where,
            "namespaces": list(self.namespaces),
            "deleted": self.deleted,
            "released_claims": self.released_claims,
            "left": [item.to_json() for item in self.left],
            "errors": self.errors,
            "safe_to_destroy": self.exit_code == ExitCode.OK,
            "exit_code": int(self.exit_code),
        }

    def render(self) -> tuple[str, str]:
        out = [f"drain of {self.where}, namespaces {', '.join(self.namespaces)}"]
        out += [f"  deleted {name}" for name in self.deleted] or ["  nothing to delete"]
        out += [f"  released claim {name}" for name in self.released_claims]
        if self.left:
            out.append("still there (a stack delete would wait for these):")
            out.append(
                table(["NAMESPACE", "KIND", "NAME", "WHY"], [[i.namespace, i.kind, i.name, i.why] for i in self.left])
            )
        if self.exit_code == ExitCode.OK:
            out.append("safe to destroy: no workload, Kueue Workload or claim in use is left")
        return "\n".join(out) + "\n", "".join(f"error: {e}\n" for e in self.errors)


def _finalizers(obj: dict[str, Any]) -> str:
    found = (obj.get("metadata") or {}).get("finalizers") or []
    return f"finalizers {', '.join(found)}" if found else "no finalizer"


def _list(api: Any, kind: Kind, namespace: str, timeout: float) -> list[dict[str, Any]]:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        listed = client.CustomObjectsApi(api).list_namespaced_custom_object(
            kind.group, kind.version, namespace, kind.plural, _request_timeout=timeout
        )
    except ApiException as exc:
        if exc.status == 404:  # the CRD is not installed (KubeRay or Kueue off): nothing of the kind exists
            return []
        raise
    items: list[dict[str, Any]] = listed.get("items") or []
    return items


def _delete(api: Any, kind: Kind, namespace: str, name: str, timeout: float) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        client.CustomObjectsApi(api).delete_namespaced_custom_object(
            kind.group,
            kind.version,
            namespace,
            kind.plural,
            name,
            body=client.V1DeleteOptions(propagation_policy="Background"),
            _request_timeout=timeout,
        )
    except ApiException as exc:
        if exc.status != 404:  # already gone
            raise


def _claims_in_use(api: Any, namespace: str, timeout: float) -> list[Left]:
    from kubernetes import client

    pods = client.CoreV1Api(api).list_namespaced_pod(namespace, _request_timeout=timeout).items
    left = []
    for pod in pods:
        claims = sorted(
            v.persistent_volume_claim.claim_name for v in (pod.spec.volumes or []) if v.persistent_volume_claim
        )
        if claims:
            state = "terminating" if pod.metadata.deletion_timestamp else (pod.status.phase if pod.status else "?")
            left.append(Left(namespace, "Pod", pod.metadata.name, f"mounts claim {', '.join(claims)} ({state})"))
    return left


def _claims(api: Any, namespace: str, timeout: float) -> list[Any]:
    from kubernetes import client

    items: list[Any] = (
        client.CoreV1Api(api).list_namespaced_persistent_volume_claim(namespace, _request_timeout=timeout).items
    )
    return items


def survey(api: Any, namespaces: tuple[str, ...], *, release_claims: bool, timeout: float) -> list[Left]:
    left: list[Left] = []
    for namespace in namespaces:
        for kind in KINDS:
            for obj in _list(api, kind, namespace, timeout):
                left.append(Left(namespace, kind.kind, obj["metadata"]["name"], _finalizers(obj)))
        left += _claims_in_use(api, namespace, timeout)
        if release_claims:
            for claim in _claims(api, namespace, timeout):
                finalizers = ", ".join(claim.metadata.finalizers or []) or "no finalizer"
                left.append(Left(namespace, "PersistentVolumeClaim", claim.metadata.name, f"finalizers {finalizers}"))
    return left


def drain(
    api: Any,
    namespaces: tuple[str, ...],
    *,
    where: str,
    release_claims: bool,
    timeout_s: float,
    poll_s: float,
    request_timeout: float,
    say: Callable[[str], None],
) -> DrainReport:
    report = DrainReport(where=where, namespaces=namespaces)
    try:
        for namespace in namespaces:
            for kind in (k for k in KINDS if k.delete):
                with api_errors(f"list {kind.plural}.{kind.group} in namespace {namespace}"):
                    # What is already being deleted (a RayJob's own RayCluster, once the RayJob is) is left to its
                    # controller.
                    names = [
                        o["metadata"]["name"]
                        for o in _list(api, kind, namespace, request_timeout)
                        if not o["metadata"].get("deletionTimestamp")
                    ]
                for name in names:
                    with api_errors(f"delete {kind.kind} {namespace}/{name}"):
                        _delete(api, kind, namespace, name, request_timeout)
                    report.deleted.append(f"{kind.kind} {namespace}/{name}")
                    say(f"deleted {kind.kind} {namespace}/{name}")
        deadline = time.monotonic() + timeout_s
        claims_deleted = False
        while True:
            with api_errors("survey the workload namespaces"):
                left = survey(api, namespaces, release_claims=False, timeout=request_timeout)
            if not left and release_claims and not claims_deleted:
                from kubernetes import client

                for namespace in namespaces:
                    with api_errors(f"list claims in namespace {namespace}"):
                        claims = _claims(api, namespace, request_timeout)
                    for claim in claims:
                        with api_errors(f"delete claim {namespace}/{claim.metadata.name}"):
                            client.CoreV1Api(api).delete_namespaced_persistent_volume_claim(
                                claim.metadata.name, namespace, _request_timeout=request_timeout
                            )
                        report.released_claims.append(f"{namespace}/{claim.metadata.name}")
                        say(f"deleted claim {namespace}/{claim.metadata.name}")
                claims_deleted = True
            if release_claims and claims_deleted:
                with api_errors("survey the claims"):
                    left = survey(api, namespaces, release_claims=True, timeout=request_timeout)
            if not left or time.monotonic() >= deadline:
                report.left = left
                return report
            say(f"waiting for {len(left)}: " + ", ".join(f"{i.kind} {i.namespace}/{i.name}" for i in left[:5]))
            time.sleep(poll_s)
    except KubeError as exc:
        report.errors.append(str(exc))
        return report
