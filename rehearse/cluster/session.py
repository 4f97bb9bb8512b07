"""A rehearsal on an environment's cluster: the run's Options with the cluster model behind its seams.

`cluster_options` builds, from infra/spec alone:
- the Placement (and NodeLoss) seam: the environment's nodes (nodes.py), kube-scheduler's filters
  (scheduler.py), the Storage stack's PersistentVolumes and claims (infra/spec/checkpoint_volumes.py, rendered with
  the environment's GPU zone as the Storage stack does) plus those in the files, and --kill-node;
- the Admission seam: Kueue v0.19.2 (kueue.py) over the queues the Platform stack applies
  (k8s/queueing.py) and the manager Configuration it renders (infra/spec/kueue.py), when the environment
  installs Kueue; an admitted PodSet's flavors join its pods' nodeSelector and tolerations;
- the Clock: cluster time, `--time-scale` times faster than wall time, which every controller reads
  (Job activeDeadlineSeconds and pod backoff, RayJob activeDeadlineSeconds, Kueue's waitForPodsReady and
  requeue backoff, node-loss timings) and in which the report's times are given. The pods' own processes
  run in wall time: at scale X a pod that sleeps 1 s takes X cluster seconds.

- the ApiServer seam: the Kubernetes API the pods reach (apiserver.py: what the fabric gate and its remediation
  controller call, authorized by the files' RBAC and admission policies), over the same nodes the scheduler places
  on, the run's pods and workloads, and the environment's ClusterQueues with the Kueue model behind them;

`annotate` adds the cluster to the report: the environment, the factor, the nodes, and per workload Kueue's
verdict (admitted or not, its reason, each requeue).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from infra.spec import ConfigError, Environment, get_environment
from infra.spec.checkpoint_volumes import checkpoint_manifests
from infra.spec.kueue import kueue_props, manager_config
from k8s.queueing import queue_objects
from rehearse.cluster.apiserver import ClusterApi
from rehearse.cluster.kueue import (
    Event,
    Kueue,
    KueueAdmission,
    KueueConfig,
    KueueError,
    PodSetAdmission,
    Queues,
    TimeScale,
)
from rehearse.cluster.nodes import ClusterNode, build_nodes
from rehearse.cluster.placement import ClusterPlacement, NodeKill, node_address
from rehearse.errors import RehearsalError
from rehearse.options import Options, after_path
from rehearse.seams import Clock, Pending

if TYPE_CHECKING:
    from rehearse.outcome import Rehearsal
    from rehearse.pods import PodPlan

# The loop looks at pods every 0.1 wall seconds whatever the scale.
WALL_TICK_S = 0.1
_NODE_AT = re.compile(r"^(?P<node>[a-z0-9]([-a-z0-9.]*[a-z0-9])?)@(?P<seconds>\d+(\.\d+)?)(,after=(?P<after>[^,]+))?$")
_GROUP_COUNT = re.compile(r"^(?P<group>[a-z0-9]([-a-z0-9]*[a-z0-9])?)=(?P<count>\d+)$")


def parse_node_kill(text: str) -> NodeKill:
    """--kill-node NODE@SECONDS (cluster time), or NODE@SECONDS,after=PATH (SECONDS after PATH, relative to the
    output directory, first exists: e.g. a checkpoint committed on a claim); NODE is a node's alias (g6-1) or name."""
    m = _NODE_AT.match(text)
    if not m:
        raise RehearsalError(
            f"--kill-node {text!r}: write it as NODE@SECONDS, e.g. g6-0@120 (cluster seconds), or "
            "NODE@SECONDS,after=PATH, e.g. g6-0@0,after=claims/training/checkpoints/nvrx-fsdp/step_000000002/COMMITTED"
        )
    after = after_path("--kill-node", text, m.group("after"))
    return NodeKill(node=m.group("node"), seconds=float(m.group("seconds")), after=after)


def parse_nodes(text: str) -> tuple[str, int]:
    """--nodes GROUP=N."""
    m = _GROUP_COUNT.match(text)
    if not m:
        raise RehearsalError(f"--nodes {text!r}: write it as GROUP=N, e.g. g6=2")
    return m.group("group"), int(m.group("count"))


class ScaledClock:
    """Cluster time: `factor` cluster seconds per wall second, from the moment the clock is made."""

    def __init__(self, factor: float) -> None:
        if not factor > 0:
            raise RehearsalError(f"--time-scale {factor:g}: must be above 0 (e.g. 60: a cluster minute per second)")
        self.factor = factor
        self._origin = time.monotonic()

    def now(self) -> float:
        return self._origin + (time.monotonic() - self._origin) * self.factor

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds / self.factor)


class RecordingKueueAdmission(KueueAdmission[Pending]):
    """KueueAdmission that keeps every Kueue event for the report."""

    def __init__(self, kueue: Kueue, *, clock: Clock) -> None:
        super().__init__(kueue, clock=clock, time_scale=TimeScale(1.0), pending=Pending)
        self.events: list[Event] = []

    def _take(self, events: list[Event]) -> None:
        self.events += events
        super()._take(events)


@dataclass
class ClusterSession:
    environment: Environment
    nodes: list[ClusterNode]
    placement: ClusterPlacement
    admission: RecordingKueueAdmission | None
    clock: Clock
    time_scale: float
    api: ClusterApi | None = None


def _storage_objects(env: Environment) -> list[dict[str, Any]]:
    storage = env.add_ons.checkpoint_storage
    if storage is None:
        return []
    # The Storage stack's claims (infra/stage.py StorageStack): the file system sits in the GPU zone's subnet.
    return checkpoint_manifests(
        env,
        storage,
        availability_zone=env.gpu_availability_zone,
        volume_handle="fs-rehearsal",
        dns_name="fs-rehearsal.fsx.invalid",
        mount_name="rehearsal",
    )


def _workload_key(plan: PodPlan, managed_ray_jobs: set[str]) -> tuple[str, str]:
    """(kind, key) of the workload a pod belongs to, as Kueue sees it: a RayJob's submitter Job is the RayJob's."""
    kind, _, name = plan.workload.partition("/")
    if kind == "Job" and f"RayJob/{plan.namespace}/{name}" in managed_ray_jobs:
        kind = "RayJob"
    return kind, f"{kind}/{plan.namespace}/{name}"


@dataclass(frozen=True)
class _Ref:
    kind: str
    key: str
    obj: dict[str, Any]


def cluster_options(
    options: Options,
    manifests: Sequence[Mapping[str, Any]],
    *,
    environment: str,
    gpu_nodes: Mapping[str, int] | None = None,
    quota_nodes: Mapping[str, int] | None = None,
    time_scale: float = 1.0,
    node_kills: Sequence[NodeKill] = (),
    clock: Clock | None = None,
) -> tuple[Options, ClusterSession]:
    """`options` with the environment's cluster behind the Placement, Admission and Clock seams (`clock`: a
    clock of cluster time to use instead of the ScaledClock, e.g. the fake runtime's). Each GPU group's Kueue
    quota covers its nodes, as `trainctl scale` leaves it, unless `quota_nodes` names another count (quota and
    nodes that differ: a node group reset by `cdk deploy`, capacity short)."""
    try:
        env = get_environment(environment)
        nodes = build_nodes(env, gpu_nodes)
    except ConfigError as exc:
        raise RehearsalError(str(exc)) from exc
    cluster_clock: Clock = clock if clock is not None else ScaledClock(time_scale)
    admission: RecordingKueueAdmission | None = None
    queues: list[dict[str, Any]] = []
    if env.add_ons.kueue:
        try:
            config = KueueConfig.from_configuration(manager_config(kueue_props(env.add_ons.kuberay_operator)))
            # The quota follows the nodes, as `trainctl scale` leaves it (k8s/queueing.py group_nodes).
            quota = {**(gpu_nodes or {}), **(quota_nodes or {})}
            queues = queue_objects(env, quota)
            kueue = Kueue(Queues.from_objects(queues), config)
            admission = RecordingKueueAdmission(kueue, clock=cluster_clock)
        except (KueueError, ConfigError) as exc:
            raise RehearsalError(f"--quota: {exc}" if isinstance(exc, ConfigError) else str(exc)) from exc
    elif quota_nodes:
        raise RehearsalError(f"--quota: environment {env.name} has no Kueue (add_ons.kueue is off)")
    ray_jobs = {
        f"RayJob/{(m.get('metadata') or {}).get('namespace', 'default')}/{m['metadata']['name']}"
        for m in manifests
        if m.get("kind") == "RayJob"
    }

    def flavors(plan: PodPlan) -> PodSetAdmission | None:
        if admission is None:
            return None
        kind, key = _workload_key(plan, ray_jobs)
        return admission.pod_set_admission(_Ref(kind=kind, key=key, obj={}), plan.labels)

    placement = ClusterPlacement.for_objects(
        nodes, [*_storage_objects(env), *manifests], kills=node_kills, flavors=flavors
    )
    api = ClusterApi(
        nodes,
        manifests,
        log=options.log or (lambda _: None),
        kueue=admission.kueue if admission is not None else None,
        queues=queues,
    )
    session = ClusterSession(
        environment=env,
        nodes=nodes,
        placement=placement,
        admission=admission,
        clock=cluster_clock,
        time_scale=time_scale,
        api=api,
    )
    changes: dict[str, Any] = {
        "api": api,
        "placement": placement,
        "clock": cluster_clock,
        "tick_s": WALL_TICK_S * time_scale if clock is None else options.tick_s,
        "node_addresses": {n.name: node_address(n) for n in nodes},
    }
    if admission is not None:
        changes["admission"] = admission
    return dataclasses.replace(options, **changes), session


def admission_report(session: ClusterSession, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    """Kueue's verdict on one workload: admitted or not, the reason, each requeue (cluster seconds)."""
    admission = session.admission
    key = f"{kind}/{namespace}/{name}"
    if admission is None or not admission._managed.get(key):
        return None
    events = [e for e in admission.events if e.job == key]
    workload = admission.kueue.workload(key)
    admitted = any(e.kind == "Admitted" for e in events)
    last = next((e for e in reversed(events) if e.kind != "PodsReady"), None)
    reason = "" if last is None else f"{last.kind} at {last.time:.0f} s: {last.reason}: {last.message}".rstrip(": ")
    return {
        "admitted": admitted,
        "active": workload.active,
        "reason": reason,
        "requeues": [
            {"at_s": round(e.time, 1), "kind": e.kind, "reason": e.reason, "message": e.message}
            for e in events
            if e.kind in ("Evicted", "Requeued", "Deactivated")
        ],
        "pods_ready": [{"at_s": round(e.time, 1), "reason": e.reason} for e in events if e.kind == "PodsReady"],
    }


def annotate(rehearsal: Rehearsal, session: ClusterSession) -> Rehearsal:
    """The report with the cluster: environment, time scale, nodes, Kueue per workload."""
    rehearsal.cluster = {
        "environment": session.environment.name,
        "time_scale": session.time_scale,
        "nodes": [
            {
                "name": n.name,
                "alias": n.alias,
                "group": n.group,
                "instance_type": n.instance_type,
                "zone": n.zone,
                "ready": n.ready,
                "taints": [dict(t) for t in n.taints],
                "allocatable": dict(n.allocatable),
                "addon_pods": list(n.addon_pods),
            }
            for n in session.nodes
        ],
    }
    if session.api is not None:
        rehearsal.cluster["api"] = session.api.report()
        rehearsal.notes += [*session.api.notes, *(f"api: {a}" for a in session.api.actions)]
    for w in rehearsal.workloads:
        report = admission_report(session, w.kind, w.namespace, w.name)
        if report is not None:
            w.admission = report
    return rehearsal


def run_on_environment(
    manifests: Sequence[dict[str, Any]],
    options: Options,
    *,
    environment: str,
    gpu_nodes: Mapping[str, int] | None = None,
    quota_nodes: Mapping[str, int] | None = None,
    time_scale: float = 1.0,
    node_kills: Sequence[NodeKill] = (),
) -> Rehearsal:
    """`rehearse.run` on the environment's cluster, the report annotated with it."""
    from rehearse.loop import run

    cluster_opts, session = cluster_options(
        options,
        manifests,
        environment=environment,
        gpu_nodes=gpu_nodes,
        quota_nodes=quota_nodes,
        time_scale=time_scale,
        node_kills=node_kills,
    )
    return annotate(run(manifests, cluster_opts), session)
