"""What the API server says about a verdict's claim: the pod, its gang's admission, the node, the node's group."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from fabric_controller.config import ControllerConfig
from fabric_controller.decide import GROUP_LABEL, Facts, Gang, Record
from training.fabric_verdict import TAKEN_ANNOTATION, ReportedVerdict
from training.kube_api import KubeApi, KubeError

KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
# Kueue labels each Workload with its job's uid (Kueue v0.19.2 pkg/controller/constants JobUIDLabel): the Workload's
# own name is Kueue's (owner name plus a hash) and is not to be rebuilt.
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
PATHS = {
    ("batch/v1", "Job"): "/apis/batch/v1/namespaces/{ns}/jobs/{name}",
    ("ray.io/v1", "RayCluster"): "/apis/ray.io/v1/namespaces/{ns}/rayclusters/{name}",
    ("ray.io/v1", "RayJob"): "/apis/ray.io/v1/namespaces/{ns}/rayjobs/{name}",
}


def controller_owner(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    owners = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((o for o in owners if o.get("controller")), None)


class NotGrantedError(Exception):
    """The controller's Role of the namespace does not grant the owner's kind (k8s/charts/fabric_gate.py OWNER_READS
    grants each namespace only the kinds a gated workload has there): no gated workload of that kind lives there."""


def _get(api: KubeApi, namespace: str, owner: Mapping[str, Any]) -> dict[str, Any] | None:
    path = PATHS.get((str(owner.get("apiVersion")), str(owner.get("kind"))))
    if path is None:
        return None
    try:
        found = api.get_or_none(path.format(ns=namespace, name=owner.get("name")))
    except KubeError as exc:
        if exc.code == 403:
            raise NotGrantedError from exc
        raise
    # An owner reference names a uid: an object of that name but another uid is a later one.
    return found if found is not None and found["metadata"].get("uid") == owner.get("uid") else None


def admitted(workloads: list[dict[str, Any]]) -> tuple[bool, str]:
    """Whether Kueue admitted the job (Workload condition Admitted True: apis/kueue/v1beta2 workload_types.go)."""
    if not workloads:
        return False, "Kueue has no Workload for it"
    for workload in workloads:
        conditions = (workload.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Admitted" and c.get("status") == "True" for c in conditions):
            return True, ""
    return False, f"its Workload {workloads[0]['metadata'].get('name')} is not Admitted"


def _not_here(namespace: str, owner: Mapping[str, Any]) -> Gang:
    kind, name = str(owner.get("kind")), str(owner.get("name"))
    return Gang(namespace, kind, name, "", "", False, f"no gated {kind} lives in namespace {namespace}")


def find_gang(api: KubeApi, pod: Mapping[str, Any]) -> Gang | None:
    """The workload Kueue admitted for `pod`: its Job; or its RayCluster's owning RayJob, else the RayCluster."""
    namespace = str(pod["metadata"].get("namespace"))
    owner = controller_owner(pod)
    if owner is None:
        return None
    try:
        job = _get(api, namespace, owner)
    except NotGrantedError:
        return _not_here(namespace, owner)
    if job is None:
        return Gang(namespace, str(owner.get("kind")), str(owner.get("name")), "", "", False, "its owner is gone")
    if job["kind"] == "RayCluster":
        parent = controller_owner(job)
        if parent is not None:
            try:
                ray_job = _get(api, namespace, parent)
            except NotGrantedError:
                return _not_here(namespace, parent)
            if ray_job is None:
                return Gang(namespace, "RayJob", str(parent.get("name")), "", "", False, "its RayJob is gone")
            job = ray_job
    uid = str(job["metadata"]["uid"])
    workloads = api.list_items(f"{KUEUE}/namespaces/{namespace}/workloads", label_selector=f"{JOB_UID_LABEL}={uid}")
    ok, why = admitted(workloads)
    return Gang(namespace, str(job["kind"]), str(job["metadata"]["name"]), uid, str(job["apiVersion"]), ok, why)


def read_record(queue: Mapping[str, Any] | None) -> Record:
    annotations = ((queue or {}).get("metadata") or {}).get("annotations") or {}
    return Record.parse(annotations.get(TAKEN_ANNOTATION))


def cluster_queue(api: KubeApi, name: str) -> dict[str, Any] | None:
    return api.get_or_none(f"{KUEUE}/clusterqueues/{name}")


def gather(api: KubeApi, claim: ReportedVerdict, config: ControllerConfig, now: float | None = None) -> Facts:
    pod = api.get_or_none(f"/api/v1/namespaces/{claim.namespace}/pods/{claim.pod}")
    node = api.get_or_none(f"/api/v1/nodes/{claim.node}")
    gang = find_gang(api, pod) if pod is not None else None
    group_name = str(((node or {}).get("metadata") or {}).get("labels", {}).get(GROUP_LABEL, ""))
    group = config.groups.get(group_name)
    group_nodes = api.list_items("/api/v1/nodes", label_selector=f"{GROUP_LABEL}={group_name}") if group else []
    record = read_record(cluster_queue(api, group.queue)) if group else Record()
    return Facts(pod, node, gang, group_nodes, record, time.time() if now is None else now)
