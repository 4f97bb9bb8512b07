"""Nodes the fabric gate took out (training/fabric_gate.py), for `trainctl status` and `trainctl scale`, and whether
a gated group keeps a spare beside its gang (`trainctl scale`, `trainctl capacity`).

A multi-node job whose gate fails taints the suspect node `platform/fabric-gate=<why>:NoSchedule` (its Events say
why: `kubectl describe node NODE`); new pods stay off it, running ones are not evicted. After the node is repaired
(or replaced: terminating the instance is often quicker), an operator releases it with the command printed here.
The gate itself can never remove its taint (k8s/charts/fabric_gate.py's admission policy).

The job is then re-placed, whole nodes only, onto untainted nodes: a gated group needs its gang plus a spare
(infra/spec/environments.py GATE_SPARE_NODES, GpuNodeGroupConfig.nodes_with_spare), and a tainted node is no spare.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from infra.spec import GpuNodeGroupConfig
from trainctl.kube import api_errors
from trainctl.output import table
from training.fabric_gate import TAINT_KEY
from training.fabric_verdict import release_command


@dataclass(frozen=True)
class GateTaint:
    node: str
    reason: str

    @property
    def release(self) -> str:
        return release_command(self.node)

    def to_json(self) -> dict[str, str]:
        return {"node": self.node, "reason": self.reason, "release": self.release}


def from_taints(node: str, taints: Iterable[str]) -> GateTaint | None:
    """The gate's taint among `key=value:effect` strings (trainctl scale's node view), if there."""
    for taint in taints:
        key, _, rest = taint.partition("=")
        if key == TAINT_KEY:
            return GateTaint(node, rest.rpartition(":")[0] or "failed")
    return None


def problems(node: str, taints: Iterable[str]) -> list[str]:
    """What `trainctl scale` says about a gate-tainted node (it cannot take a whole-node GPU pod)."""
    found = from_taints(node, taints)
    if found is None:
        return []
    return [f"taken out by the fabric gate ({found.reason}); after repair: {found.release}"]


def list_gate_tainted(api: Any, *, timeout: float) -> list[GateTaint]:
    """Every node of the cluster that carries the gate's taint."""
    from kubernetes import client

    with api_errors("list nodes"):
        items = client.CoreV1Api(api).list_node(_request_timeout=timeout).items
    found = []
    for item in items:
        taints = [f"{t.key}={t.value or ''}:{t.effect}" for t in (item.spec.taints or [])]
        tainted = from_taints(item.metadata.name, taints)
        if tainted is not None:
            found.append(tainted)
    return sorted(found, key=lambda t: t.node)


def render(tainted: Sequence[GateTaint]) -> list[str]:
    """Lines for people; none when no node is tainted."""
    if not tainted:
        return []
    rows = [[t.node, t.reason, t.release] for t in tainted]
    return [
        f"Nodes taken out by the fabric gate ({TAINT_KEY}; why: kubectl describe node NODE, its Events):",
        table(["NODE", "REASON", "RELEASE AFTER REPAIR"], rows),
    ]


def spare_warning(group: GpuNodeGroupConfig, nodes: int, *, fix: str, tainted: Sequence[GateTaint] = ()) -> str | None:
    """None when `nodes` nodes of the group, `tainted` among them, leave its gated gang a spare untainted node (or
    the group is not gated, or goes to 0); else one line naming the group, the gang, the nodes and the fix. `fix`:
    the command that asks for the gang and its spare (the caller's own, with `--nodes {group.nodes_with_spare}`)."""
    if nodes == 0 or not group.gated:
        return None
    untainted = max(0, nodes - len(tainted))
    if untainted >= group.nodes_with_spare:
        return None
    gang = group.workload_nodes
    counted = f"{nodes} node(s)"
    if tainted:
        names = ", ".join(t.node for t in tainted)
        counted += f", {len(tainted)} of them taken out by the fabric gate ({names}), leave {untainted} untainted and"
    fixes = [fix] if nodes < group.nodes_with_spare else []
    fixes += [
        f"release {t.node} after repair ({t.release}) or replace it (terminate its instance: the group launches "
        "another)"
        for t in tainted
    ]
    return (
        f"group {group.name}: {counted} give its gated gang of {gang} no spare: when the fabric gate takes a node "
        f"out, the gang is re-placed only onto untainted nodes: it needs {group.nodes_with_spare} untainted (the gang "
        f"and a spare). Fix: {'; '.join(fixes)}"
    )
