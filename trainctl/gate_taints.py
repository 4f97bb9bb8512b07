"""Nodes the fabric gate took out (training/fabric_gate.py), for `trainctl status` and `trainctl scale`.

A multi-node job whose gate fails taints the suspect node `platform/fabric-gate=<why>:NoSchedule` (its Events say
why: `kubectl describe node NODE`); new pods stay off it, running ones are not evicted. After the node is repaired
(or replaced: terminating the instance is often quicker), an operator releases it with the command printed here.
The gate itself can never remove its taint (k8s/charts/fabric_gate.py's admission policy).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from trainctl.kube import api_errors
from trainctl.output import table
from training.fabric_gate import TAINT_EFFECT, TAINT_KEY


@dataclass(frozen=True)
class GateTaint:
    node: str
    reason: str

    @property
    def release(self) -> str:
        return release_command(self.node)

    def to_json(self) -> dict[str, str]:
        return {"node": self.node, "reason": self.reason, "release": self.release}


def release_command(node: str) -> str:
    return f"kubectl taint node {node} {TAINT_KEY}:{TAINT_EFFECT}-"


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
