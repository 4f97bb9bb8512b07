"""The outcome model of a rehearsal: one `WorkloadOutcome` per workload with its `PodOutcome`s, the whole
`Rehearsal` (exit code, JSON) and its table rendering. Built from controllers by `outcome` at the run's end."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rehearse.controller import Controller
from rehearse.pods import Pod, accelerator_requests, sidecar_names


@dataclass
class PodOutcome:
    name: str
    uid: str
    labels: dict[str, str]
    hostname: str
    address: str
    images: list[str]
    phase: str
    exit_codes: dict[str, int | None]
    restarts: int
    conditions: list[dict[str, str]]
    accelerators: dict[str, str]
    wall_s: float
    directory: Path
    pod: Pod = field(repr=False)
    # Per container: terminated/waiting reason (Completed, Error, StartError, PodInitializing) and message.
    reasons: dict[str, str] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)
    sidecars: list[str] = field(default_factory=list)
    node: str | None = None
    pending_reason: str = ""
    # When the pod's containers started and when it ended, seconds of the run's clock since the run began
    # (cluster time on an environment); None: never started / still running.
    start_s: float | None = None
    end_s: float | None = None

    def log(self, container: str | None = None) -> str:
        return self.pod.log(container)


@dataclass
class WorkloadOutcome:
    kind: str
    name: str
    namespace: str
    state: str
    message: str
    wall_s: float
    pods: list[PodOutcome]
    notes: list[str]
    # The uid the apiserver would give the object (Jobs; empty where the rehearsal models none).
    uid: str = ""
    conditions: list[dict[str, str]] = field(default_factory=list)
    status: dict[str, str] = field(default_factory=dict)
    # On an environment with Kueue, for a workload it manages: admitted, reason, requeues (rehearse/cluster).
    admission: dict[str, Any] | None = None

    @property
    def succeeded(self) -> bool:
        return self.state in ("Complete", "Ready")

    def pod(self, prefix: str) -> PodOutcome:
        found = [p for p in self.pods if p.name.startswith(prefix) or p.hostname == prefix]
        if not found:
            raise KeyError(f"no pod {prefix!r} in {self.kind}/{self.name}: {[p.name for p in self.pods]}")
        return found[-1]


@dataclass
class Rehearsal:
    workloads: list[WorkloadOutcome]
    network: str
    notes: list[str]
    output_dir: Path
    wall_s: float
    # On an environment: its name, the time scale and the nodes (rehearse/cluster/session.py annotate).
    cluster: dict[str, Any] | None = None

    @property
    def exit_code(self) -> int:
        return 0 if all(w.succeeded for w in self.workloads) else 1

    def workload(self, name: str) -> WorkloadOutcome:
        for w in self.workloads:
            if w.name == name:
                return w
        raise KeyError(f"no workload {name!r}: {[w.name for w in self.workloads]}")

    def to_json(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "network": self.network,
            "notes": self.notes,
            "output_dir": str(self.output_dir),
            "wall_s": round(self.wall_s, 2),
            "exit_code": self.exit_code,
            "workloads": [
                {
                    "kind": w.kind,
                    "name": w.name,
                    "namespace": w.namespace,
                    "uid": w.uid,
                    "state": w.state,
                    "message": w.message,
                    "conditions": w.conditions,
                    "status": w.status,
                    "wall_s": round(w.wall_s, 2),
                    "notes": w.notes,
                    "admission": w.admission,
                    "pods": [
                        {
                            "name": p.name,
                            "uid": p.uid,
                            "labels": p.labels,
                            "hostname": p.hostname,
                            "address": p.address,
                            "images": p.images,
                            "phase": p.phase,
                            "exit_codes": p.exit_codes,
                            "restarts": p.restarts,
                            "conditions": p.conditions,
                            "accelerators_not_satisfied": p.accelerators,
                            "wall_s": round(p.wall_s, 2),
                            "logs": str(p.directory),
                            "reasons": p.reasons,
                            "messages": p.messages,
                            "sidecars": p.sidecars,
                            "node": p.node,
                            "pending_reason": p.pending_reason,
                            "start_s": _rounded(p.start_s),
                            "end_s": _rounded(p.end_s),
                        }
                        for p in w.pods
                    ],
                }
                for w in self.workloads
            ],
        }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def outcome(controller: Controller, now: float, began: float = 0.0) -> WorkloadOutcome:
    """The workload's state and its pods as the report shows them, at `now` (`began`: the run's start)."""
    state, message = controller.state()
    pods = [
        PodOutcome(
            name=p.name,
            uid=p.plan.uid,
            labels=dict(p.plan.labels),
            hostname=p.plan.pod_hostname,
            address=p.address,
            images=p.images,
            phase=p.phase,
            exit_codes=dict(p.exit_codes),
            restarts=p.restarts,
            conditions=list(p.conditions),
            accelerators=accelerator_requests(p.plan.spec),
            wall_s=(p.ended or now) - p.started,
            directory=p.directory,
            pod=p,
            reasons=dict(p.reasons),
            messages=dict(p.messages),
            sidecars=sorted(sidecar_names(p.plan.spec)),
            node=p.node,
            pending_reason=p.pending_reason,
            start_s=None if p.launched is None else p.launched - began,
            end_s=None if p.launched is None or p.ended is None else p.ended - began,
        )
        for p in controller.pods
    ]
    notes = list(controller.notes)
    return WorkloadOutcome(
        kind=controller.kind,
        name=controller.name,
        namespace=controller.namespace,
        state=state,
        message=message,
        # A workload never started (not admitted) has no time of its own.
        wall_s=(controller.finished or now) - controller.started if controller.pods else 0.0,
        pods=pods,
        notes=sorted(set(notes)),
        uid=str(getattr(controller, "uid", "")),
        conditions=[dict(c) for c in controller.conditions],
        status=controller.status_fields(),
    )


def format_table(rehearsal: Rehearsal) -> str:
    """One table per workload: pods, address, exit codes, restarts, final state, wall time."""
    out = [f"network: {rehearsal.network}; logs under {rehearsal.output_dir}/pods/<pod>/"]
    cluster = rehearsal.cluster
    aliases: dict[str, str] = {}
    if cluster is not None:
        out.append(
            f"cluster: environment {cluster['environment']}, time scale {cluster['time_scale']:g} "
            "(times are cluster seconds since the start)"
        )
        for n in cluster["nodes"]:
            aliases[n["name"]] = n["alias"]
            alloc = n["allocatable"]
            extra = "".join(f", {k} {v}" for k, v in alloc.items() if k not in ("cpu", "memory", "pods"))
            out.append(
                f"  node {n['alias']} {n['name']} {n['instance_type']} {n['zone']}{'' if n['ready'] else ' (lost)'}: "
                f"allocatable cpu {alloc['cpu']}m, memory {alloc['memory'] // 2**20}Mi, pods {alloc['pods']}{extra}"
            )
    out += [f"note: {n}" for n in rehearsal.notes]
    for w in rehearsal.workloads:
        out.append("")
        out.append(f"{w.kind}/{w.name} ({w.namespace}): {w.state} in {w.wall_s:.1f} s  {w.message}".rstrip())
        if w.status:
            out.append("  status: " + " ".join(f"{k}={v or '-'}" for k, v in w.status.items()))
        out += [f"  note: {n}" for n in w.notes]
        if w.admission is not None:
            verdict = "admitted" if w.admission["admitted"] else "not admitted"
            out.append(f"  kueue: {verdict}; {w.admission['reason']}".rstrip("; "))
            out += [
                f"  kueue: {r['kind']} at {r['at_s']:g} s: {r['reason']}: {r['message']}".rstrip(": ")
                for r in w.admission["requeues"]
            ]
        rows: list[tuple[str, ...]] = [
            ("POD", "ADDRESS", "EXIT CODES", "RESTARTS", "STATE", "WALL S", "IMAGE / NOT SATISFIED")
        ]
        if cluster is not None:
            rows = [("POD", "NODE", "ADDRESS", "EXIT CODES", "RESTARTS", "STATE", "START", "END", "IMAGE")]
        details: list[str] = []
        for p in w.pods:
            codes = ",".join(
                f"{k}{'(sidecar)' if k in p.sidecars else ''}={'-' if v is None else v}"
                for k, v in p.exit_codes.items()
            )
            extra = " ".join(f"{k}={v}" for k, v in p.accelerators.items())
            state = p.phase + ("/" + ",".join(c["type"] for c in p.conditions) if p.conditions else "")
            if cluster is not None:
                start = "-" if p.start_s is None else f"{p.start_s:.0f}"
                end = "-" if p.end_s is None else f"{p.end_s:.0f}"
                node = aliases.get(p.node or "", p.node or "-")
                rows.append((p.name, node, p.address or "-", codes, str(p.restarts), state, start, end, p.images[0]))
            else:
                if p.node:
                    extra += f" node={p.node}"
                rows.append(
                    (p.name, p.address, codes, str(p.restarts), state, f"{p.wall_s:.1f}", f"{p.images[0]} {extra}")
                )
            if p.pending_reason:
                details.append(f"  {p.name}: Pending: {p.pending_reason}")
            for container, reason in p.reasons.items():
                message = p.messages.get(container, "").strip()
                if reason in ("Completed", "PodInitializing") or (reason == "Error" and not message):
                    continue
                details.append(f"  {p.name}/{container}: {reason}{': ' + message if message else ''}")
            if "pod" in p.messages:
                details.append(f"  {p.name}: {p.messages['pod']}")
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        for r in rows:
            out.append("  " + "  ".join(c.ljust(widths[i]) for i, c in enumerate(r[:-1])) + "  " + r[-1].rstrip())
        out += details
    return "\n".join(out)
