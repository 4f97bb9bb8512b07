"""The run loop: every workload of the files at once, as `kubectl apply` of them would, to the end.

Each tick (`Options.tick_s` of the clock): workloads not yet admitted are offered to the `Admission` seam
and started when admitted; evictions it asks for suspend their workloads; `--kill`s that are due delete
their pods (DisruptionTarget); ended pods go to their controller; Pending pods are offered to the
`Placement` seam again; every controller ticks (replacements, deadlines, probes).

Every pod a controller creates is first judged by the files' ValidatingAdmissionPolicies that match Pod CREATE
(rehearse/pod_admission.py); a denied pod is not created, and its workload ends there with state FailedCreate and
the API server's answer (on a cluster its controller would retry the same denied create forever).

When the run ends: when every finite workload (Job, RayJob) is done and every long-lived one (a RayCluster, a
Deployment: no end of their own) is Ready or has failed; the long-lived ones are then stopped with the state they
reached (a RayCluster or Deployment that became Ready is reported Ready). `--timeout` ends it earlier, a
long-lived workload not yet Ready then reported NotReady.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rehearse.controller import Controller
from rehearse.deployment import DeploymentController
from rehearse.errors import RehearsalError
from rehearse.jobs import JobController
from rehearse.kuberay import RayClusterController, RayJobController, dashboard_dependency_error
from rehearse.network import open_network
from rehearse.network_policy import Policies
from rehearse.options import Kill, Options
from rehearse.outcome import Rehearsal, outcome
from rehearse.platform import check_platform
from rehearse.pod_admission import PodAdmission, PodDeniedError
from rehearse.pods import Pod, PodPlan, PodSetupError, Runtime
from rehearse.ranks import ranks_per_pod
from rehearse.seams import Clock, NodeLoss, Pending, Placement, WorkloadRef


class Backend(Protocol):
    """Where pods run: the process runtime (pods.Runtime) or the fake one (fake.FakeRuntime)."""

    pods: dict[str, Pod]
    # The Services whose names the pods resolve (pods.Runtime writes them into each pod's /etc/hosts).
    services: list[dict[str, Any]]

    @property
    def clock(self) -> Clock: ...

    def create(self, plan: PodPlan) -> Pod: ...

    def launch(self, pod: Pod, node: str | None = None) -> None: ...

    def poll(self) -> list[Pod]: ...

    def kill(self, pod: Pod, *, disruption: str | None = None) -> None: ...

    def lose(self, pod: Pod) -> None: ...

    def refresh(self, pod: Pod) -> None: ...

    def dashboard_get(self, head: Pod, path: str) -> dict[str, Any] | None: ...


@dataclass
class Scheduler:
    """The controllers' PodAPI: creates pods on the backend once the Placement seam places them."""

    backend: Backend
    placement: Placement
    log: Callable[[str], None] = lambda _: None
    # The files' admission policies for Pod CREATE (None: every pod is created).
    pod_admission: PodAdmission | None = None
    pending: list[Pod] = field(default_factory=list)
    launched: list[Pod] = field(default_factory=list)
    deleted: list[Pod] = field(default_factory=list)

    def now(self) -> float:
        return self.backend.clock.now()

    def add_service(self, service: dict[str, Any]) -> None:
        if service not in self.backend.services:
            self.backend.services.append(service)

    def start(self, plan: PodPlan) -> Pod:
        if self.pod_admission is not None:
            self.pod_admission.check(plan)  # PodDeniedError: nothing of the pod exists
        pod = self.backend.create(plan)
        if not self._place(pod):
            self.pending.append(pod)
        return pod

    def _place(self, pod: Pod) -> bool:
        answer = self.placement.place(pod.plan)
        if isinstance(answer, Pending):
            if answer.reason != pod.pending_reason:
                self.log(f"pod {pod.name} Pending: {answer.reason}")
            pod.pending_reason = answer.reason
            return False
        self.backend.launch(pod, answer)
        self.launched.append(pod)
        return True

    def retry_pending(self) -> None:
        for pod in list(self.pending):
            if not pod.running or self._place(pod):
                self.pending.remove(pod)

    def kill(self, pod: Pod, *, disruption: str | None = None) -> None:
        if not pod.running:
            return
        placed = pod.launched is not None
        self.backend.kill(pod, disruption=disruption)
        if pod in self.pending:
            self.pending.remove(pod)
        if placed:
            self.placement.release(pod)
        self.deleted.append(pod)

    def refresh(self, pod: Pod) -> None:
        if pod.launched is not None:
            self.backend.refresh(pod)

    def dashboard_get(self, head: Pod, path: str) -> dict[str, Any] | None:
        return self.backend.dashboard_get(head, path) if head.launched is not None else None


def _node_loss(
    loss: NodeLoss,
    output_dir: Path,
    backend: Backend,
    api: Scheduler,
    owner: dict[str, Controller],
    elapsed: float,
    notes: list[str],
    log: Callable[[str], None],
    judged: Callable[..., None],
) -> None:
    """Pods on lost nodes die at once and stay until evicted; evicted pods go to their controller."""
    loss.arm(lambda path: (output_dir / path).exists(), elapsed)
    lost = [backend.pods[name] for name in loss.node_lost_pods(elapsed) if name in backend.pods]
    for pod in lost:
        log(f"pod {pod.name}: node {pod.node} lost at {elapsed:.1f} s")
        notes.append(f"pod {pod.name}: node {pod.node} lost at {elapsed:.1f} s")
        backend.lose(pod)
    for name, reason in loss.node_evictions(elapsed):
        evicted = backend.pods.get(name)
        if evicted is None or not evicted.running:
            continue
        log(f"pod {evicted.name} evicted from lost node {evicted.node} at {elapsed:.1f} s ({reason})")
        api.kill(evicted, disruption=reason)
        if evicted.name in owner:
            c = owner[evicted.name]
            judged(c, c.on_pod_end, api, evicted)


def ref(c: Controller) -> WorkloadRef:
    return WorkloadRef(kind=c.kind, name=c.name, namespace=c.namespace, obj=c.obj)


def drive(
    controllers: list[Controller],
    backend: Backend,
    options: Options,
    *,
    output_dir: Path,
    network: str,
    notes: list[str],
    pod_admission: PodAdmission | None = None,
) -> Rehearsal:
    """Runs `controllers` on `backend` to the end of the run (see the module doc); the caller closes the backend."""
    clock = backend.clock
    log: Callable[[str], None] = options.log or (lambda _: None)
    api = Scheduler(backend, options.placement, log, pod_admission)
    if options.api is not None:
        options.api.attach(controllers, backend.pods)
    admission = options.admission
    started = clock.now()
    admitted: set[int] = set()
    reported: set[int] = set()
    waiting: dict[int, str] = {}
    pending_kills = sorted(options.kills, key=lambda k: k.seconds)
    kill_clock: dict[Kill, float] = {}
    owner: dict[str, Controller] = {}
    finite = [c for c in controllers if not c.long_lived]
    # Workloads a pod of which the admission policies denied: the API server's answer.
    denied: dict[int, str] = {}

    def finished(c: Controller) -> bool:
        return c.done or id(c) in denied

    def judged(c: Controller, step: Callable[..., None], *args: Any) -> None:
        """Runs a step of `c`'s controller; a pod create the policies deny ends the workload (FailedCreate)."""
        if id(c) in denied:
            return
        before = set(backend.pods)
        try:
            step(*args)
        except PodDeniedError as denial:
            denied[id(c)] = denial.message
            at = clock.now() - started
            log(f"{c.kind}/{c.name}: FailedCreate: {denial.message}")
            c.notes.append(
                f"FailedCreate at {at:.1f} s: {denial.message}. On a cluster its controller retries the create "
                "(Warning FailedCreate events) and the policy denies it again: the workload never runs; the "
                "rehearsal ends it here"
            )
            # Pods the step created before the denied one, which the controller had not recorded yet.
            for name in set(backend.pods) - before:
                pod = backend.pods[name]
                if pod.running and pod not in c.pods:
                    pod.deleted_by_controller = True
                    api.kill(pod)
            c.stop(api, "a pod create was denied")

    def owners() -> None:
        for c in controllers:
            for p in c.pods:
                owner[p.name] = c

    def pod_gone(pod: Pod) -> None:
        c = owner.get(pod.name)
        if c is not None:
            admission.pod_ended(ref(c), pod)

    def run_ended() -> bool:
        # A long-lived workload still coming up (a RayCluster whose head the kubelet restarts in place) is waited
        # for: stopping it when the finite ones end would report NotReady what KubeRay brings to Ready.
        return all(finished(c) for c in finite) and all(
            finished(c) or bool(getattr(c, "ready", False)) for c in controllers if c.long_lived
        )

    while True:
        elapsed = clock.now() - started
        if elapsed > options.timeout_s:
            notes.append(f"timed out after {options.timeout_s:g} s; running pods were killed")
            for c in controllers:
                if c.long_lived and not finished(c) and id(c) in admitted:
                    c.stop(api, f"the run timed out after {options.timeout_s:g} s")
            break
        for c in controllers:
            if id(c) in admitted or finished(c):
                continue
            answer = admission.admit(ref(c))
            if answer is True:
                admitted.add(id(c))
                waiting.pop(id(c), None)
                try:
                    judged(c, c.start, api)
                except PodSetupError as exc:
                    raise RehearsalError(str(exc)) from exc
            else:
                waiting[id(c)] = answer.reason if isinstance(answer, Pending) else "not admitted"
        for workload, reason in admission.evictions():
            for c in controllers:
                if ref(c) == workload and id(c) in admitted and not finished(c):
                    log(f"{c.kind}/{c.name} evicted: {reason}")
                    c.notes.append(f"evicted at {elapsed:.1f} s: {reason}; suspended and requeued")
                    owners()
                    c.suspend(api, reason)
                    admitted.discard(id(c))
        owners()
        for kill in pending_kills:
            if kill not in kill_clock and (kill.after is None or (output_dir / kill.after).exists()):
                kill_clock[kill] = elapsed
        for kill in [k for k in pending_kills if k in kill_clock and elapsed - kill_clock[k] >= k.seconds]:
            pending_kills.remove(kill)
            target = next(
                (
                    p
                    for p in backend.pods.values()
                    if p.running
                    and p.launched is not None
                    and (p.name.startswith(kill.pod) or p.plan.pod_hostname == kill.pod)
                ),
                None,
            )
            if target is None:
                notes.append(f"--kill {kill.pod}@{kill.seconds:g}: no running pod matched")
                continue
            log(f"killing pod {target.name} at {elapsed:.1f} s (DisruptionTarget)")
            notes.append(f"killed pod {target.name} at {elapsed:.1f} s")
            api.kill(target, disruption="DeletionByPodGC")
            killed = owner[target.name]
            judged(killed, killed.on_pod_end, api, target)
        if isinstance(options.placement, NodeLoss):
            _node_loss(options.placement, output_dir, backend, api, owner, clock.now() - started, notes, log, judged)
        for pod in backend.poll():
            log(f"pod {pod.name} ended: {pod.phase} {pod.exit_codes}")
            options.placement.release(pod)
            pod_gone(pod)
            ended = owner[pod.name]
            judged(ended, ended.on_pod_end, api, pod)
        api.retry_pending()
        for c in controllers:
            if id(c) in admitted:
                judged(c, c.tick, api)
        owners()
        for pod in api.launched:
            if pod.name in owner:
                admission.pod_ready(ref(owner[pod.name]), pod)
        api.launched.clear()
        for pod in api.deleted:
            pod_gone(pod)
        api.deleted.clear()
        for c in controllers:
            if finished(c) and id(c) not in reported:
                reported.add(id(c))
                # A denied workload's quota is released: on a cluster Kueue's waitForPodsReady would evict it.
                admission.workload_finished(ref(c), "FailedCreate" if id(c) in denied else c.state()[0])
        problem = options.api.unemulated() if options.api is not None else None
        if problem is not None:
            raise RehearsalError(problem)
        if run_ended():
            for c in controllers:
                if not finished(c):
                    c.stop(api, "the run ended" if finite else "Ready: nothing else in the run")
            break
        clock.sleep(options.tick_s)
    now = clock.now()
    outcomes = [outcome(c, now, started) for c in controllers]
    for c, o in zip(controllers, outcomes, strict=True):
        if id(c) in denied:
            o.state, o.message = "FailedCreate", denied[id(c)]
        elif o.state in ("Running", "Pending", "Initializing"):
            if id(c) in waiting:
                o.message = f"not admitted: {waiting[id(c)]}"
            o.state = "Timeout"
    return Rehearsal(workloads=outcomes, network=network, notes=notes, output_dir=output_dir, wall_s=now - started)


WORKLOAD_KINDS = ("Job", "RayJob", "RayCluster", "Deployment")
HONOURED_KINDS = ("Service", "ConfigMap", "PersistentVolumeClaim", "NetworkPolicy")


@dataclass
class Prepared:
    """The run's workloads as controllers, and the objects the pods see (ConfigMaps, Services)."""

    controllers: list[Controller]
    configmaps: dict[tuple[str, str], dict[str, str]]
    services: list[dict[str, Any]]
    notes: list[str]
    policies: Policies = field(default_factory=Policies)
    # The files' ValidatingAdmissionPolicies that judge the pods the controllers create.
    pod_admission: PodAdmission | None = None


def _namespaced(obj: dict[str, Any]) -> dict[str, Any]:
    obj = dict(obj)
    obj["metadata"] = {"namespace": "default", **(obj.get("metadata") or {})}
    return obj


def controller_for(obj: dict[str, Any], options: Options, objects: list[dict[str, Any]]) -> Controller:
    kind = obj["kind"]
    try:
        if kind == "Job":
            return JobController(obj, backoff_base_s=options.backoff_base_s)
        if kind == "RayJob":
            return RayJobController(obj, backoff_base_s=options.backoff_base_s, run_objects=objects)
        if kind == "Deployment":
            return DeploymentController(obj)
        return RayClusterController(obj)
    except RehearsalError:
        raise
    except (KeyError, ValueError, TypeError) as exc:
        raise RehearsalError(f"{kind}/{obj['metadata'].get('name')}: cannot rehearse: {exc!r}") from exc


def prepare(manifests: Sequence[dict[str, Any]], options: Options) -> Prepared:
    objects = [_namespaced(o) for o in manifests]
    rewrites = []
    if options.ranks_per_pod is not None:
        objects = copy.deepcopy(objects)
        rewrites = [note for o in objects for note in ranks_per_pod(o, options.ranks_per_pod)]
    pod_admission = PodAdmission(objects)
    judging = {("ValidatingAdmissionPolicy", p.name) for p in pod_admission.judging}
    judging |= {("ValidatingAdmissionPolicyBinding", p.binding) for p in pod_admission.judging}
    notes = rewrites + [
        f"skipped {o['kind']}/{o['metadata'].get('name')}: not run by the rehearsal"
        for o in objects
        if o["kind"] not in (*WORKLOAD_KINDS, *HONOURED_KINDS, "Namespace")
        and (o["kind"], o["metadata"].get("name")) not in judging
    ]
    notes += pod_admission.notes()
    workloads = [o for o in objects if o["kind"] in WORKLOAD_KINDS]
    if not workloads:
        raise RehearsalError("nothing to rehearse: no Job, RayJob, RayCluster or Deployment in the files")
    configmaps = {
        (o["metadata"]["namespace"], o["metadata"]["name"]): {k: str(v) for k, v in (o.get("data") or {}).items()}
        for o in objects
        if o["kind"] == "ConfigMap"
    }
    services = [o for o in objects if o["kind"] == "Service"]
    controllers = [controller_for(o, options, workloads) for o in workloads]
    clusters = {(c.namespace, c.name): c for c in controllers if isinstance(c, RayClusterController)}
    for c in controllers:
        if isinstance(c, RayJobController) and c.spec.get("clusterSelector"):
            c.selected = clusters[(c.namespace, c.cluster.name)]
    for c in controllers:
        services += list(getattr(c, "services", []))
    return Prepared(
        controllers=controllers,
        configmaps=configmaps,
        services=services,
        notes=notes,
        policies=Policies.of(objects),
        pod_admission=pod_admission,
    )


def run(manifests: Sequence[dict[str, Any]], options: Options | None = None) -> Rehearsal:
    """Runs every workload of `manifests` at once, as `kubectl apply` of them would, to the end."""
    options = options or Options()
    check_platform()
    prepared = prepare(manifests, options)
    ray_workloads = [f"{c.kind}/{c.name}" for c in prepared.controllers if c.kind in ("RayJob", "RayCluster")]
    if ray_workloads:
        missing = dashboard_dependency_error()
        if missing:
            raise RehearsalError(f"cannot rehearse {', '.join(ray_workloads)}: {missing}")
    output_dir = (options.output_dir or Path(tempfile.mkdtemp(prefix="rehearsal-"))).resolve()
    output_dir.mkdir(parents=True, exist_ok=True)
    network, fallback = open_network(loopback=options.network == "loopback")
    if prepared.policies and not network.isolated:
        network.close()
        raise RehearsalError(
            "NetworkPolicy is enforced only on the bridge network, where each pod has its own network namespace; "
            f"this run's network is {network.kind} ({fallback}); fix: run as root where network namespaces can be "
            "made, or leave the NetworkPolicies out"
        )
    notes = list(prepared.notes)
    if fallback:
        notes.append(fallback)
    if prepared.policies:
        notes.append(
            f"NetworkPolicy: {len(prepared.policies.policies)} enforced (ingress), as routing rules in each pod's "
            "network namespace: a refused connection fails at once with EACCES where the cluster's would time out"
        )
    runtime = Runtime(
        output_dir=output_dir,
        network=network,
        configmaps=prepared.configmaps,
        services=prepared.services,
        host_paths=options.host_paths,
        log=options.log or (lambda _: None),
        clock=options.clock,
        node_addresses=options.node_addresses,
        api=options.api,
        image_python=options.image_python,
        # Containers restart in wall time: a cluster clock running `factor` times faster shortens the back-off.
        container_backoff_s=options.backoff_base_s / float(getattr(options.clock, "factor", 1.0)),
        policies=prepared.policies,
    )
    try:
        if options.api is not None:
            options.api.start(network)
        return drive(
            prepared.controllers,
            runtime,
            options,
            output_dir=output_dir,
            network=network.kind,
            notes=notes,
            pod_admission=prepared.pod_admission,
        )
    finally:
        runtime.close()
        if options.api is not None:
            options.api.close()
        network.close()
