"""Which pod may open a connection to which, under the run's NetworkPolicies (networking.k8s.io/v1): the
decision alone; `rehearse/policy_routes.py` turns it into each pod's routing rules.

Semantics, as the API documents them (Kubernetes 1.36 staging/src/k8s.io/api/networking/v1/types.go and
docs concepts/services-networking/network-policies):
- a pod is isolated for ingress when a policy of its namespace selects it (`podSelector`) with Ingress in its
  `policyTypes` (Ingress is implied when `policyTypes` is absent); an isolated pod admits the union of the
  selecting policies' ingress rules, a pod no policy selects admits everything;
- a rule admits a source when any of its `from` peers matches (no `from`: every source) on any of its `ports`
  (no `ports`: every port of every protocol); a peer is a `podSelector` in the policy's namespace, a
  `namespaceSelector` (every pod of those namespaces), both (those pods of those namespaces), or an `ipBlock`
  (`cidr` less `except`); a port is a number, a number up to `endPort`, a container port's name on the
  destination pod, or absent (every port of its protocol, TCP by default);
- a pod cannot block itself, traffic from its node is always allowed, and replies to an admitted connection flow
  back (the docs' exceptions; `policy_routes.py` keeps the replies);
- namespaces carry `kubernetes.io/metadata.name` (set by the API server since 1.22), which namespace selectors use.

Egress policies are refused (`unsupported`): the rehearsal does not decide what a pod may send.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rehearse.cluster.matching import label_selector_matches, labels_of_namespace, namespace_labels

PROTOCOLS = ("TCP", "UDP", "SCTP")
LAST_PORT = 65535


@dataclass(frozen=True)
class Endpoint:
    """A pod as the policies see it: its namespace, labels, address and named container ports."""

    name: str
    namespace: str
    labels: Mapping[str, str]
    address: str | None = None
    # (name, port, protocol) of its containers' ports that have a name
    named_ports: tuple[tuple[str, int, str], ...] = ()


@dataclass(frozen=True, order=True)
class PortRange:
    protocol: str
    first: int
    last: int


EVERY_PORT = tuple(sorted(PortRange(p, 1, LAST_PORT) for p in PROTOCOLS))


def endpoint_of(
    name: str, namespace: str, labels: Mapping[str, str], spec: Mapping[str, Any], address: str | None
) -> Endpoint:
    """The Endpoint of a pod spec: its containers' named ports (init containers' too: the API allows them)."""
    named = []
    for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        for port in container.get("ports") or ():
            if port.get("name"):
                named.append((str(port["name"]), int(port["containerPort"]), str(port.get("protocol", "TCP"))))
    return Endpoint(name, namespace, dict(labels), address, tuple(named))


def _policy_types(spec: Mapping[str, Any]) -> list[str]:
    if spec.get("policyTypes"):
        return list(spec["policyTypes"])
    return ["Ingress", *(["Egress"] if spec.get("egress") else [])]


def unsupported(policy: Mapping[str, Any]) -> list[str]:
    """Why the rehearsal cannot enforce this policy as the CNI would (empty: it can)."""
    spec = policy.get("spec") or {}
    if "Egress" in _policy_types(spec) or spec.get("egress"):
        return [
            "spec.policyTypes Egress / spec.egress: egress policies are not enforced by the rehearsal (it decides "
            "what a pod admits, not what it may send)"
        ]
    return []


@dataclass
class Policies:
    """The run's NetworkPolicies and Namespaces (their labels, for namespace selectors)."""

    policies: Sequence[Mapping[str, Any]] = ()
    namespace_labels: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def of(cls, objects: Iterable[Mapping[str, Any]]) -> Policies:
        objects = list(objects)
        return cls([o for o in objects if o["kind"] == "NetworkPolicy"], namespace_labels(objects))

    def __bool__(self) -> bool:
        return bool(self.policies)

    def _selecting(self, pod: Endpoint) -> list[Mapping[str, Any]]:
        return [
            p["spec"]
            for p in self.policies
            if p["metadata"].get("namespace", "default") == pod.namespace
            and "Ingress" in _policy_types(p["spec"])
            and label_selector_matches(p["spec"].get("podSelector"), pod.labels)
        ]

    def isolated(self, pod: Endpoint) -> bool:
        return bool(self._selecting(pod))

    def _peer_matches(self, peer: Mapping[str, Any], namespace: str, source: Endpoint) -> bool:
        if "ipBlock" in peer:
            if source.address is None:
                return False
            address = ipaddress.ip_address(source.address)
            block = peer["ipBlock"]
            if address not in ipaddress.ip_network(block["cidr"], strict=False):
                return False
            return not any(address in ipaddress.ip_network(e, strict=False) for e in block.get("except") or ())
        if "namespaceSelector" in peer:
            if not label_selector_matches(
                peer["namespaceSelector"], labels_of_namespace(self.namespace_labels, source.namespace)
            ):
                return False
        elif source.namespace != namespace:
            return False
        return "podSelector" not in peer or label_selector_matches(peer["podSelector"], source.labels)

    def _ports(self, rule_ports: Sequence[Mapping[str, Any]] | None, destination: Endpoint) -> tuple[PortRange, ...]:
        if not rule_ports:
            return EVERY_PORT
        ranges: list[PortRange] = []
        for entry in rule_ports:
            protocol = str(entry.get("protocol", "TCP"))
            port = entry.get("port")
            if port is None:
                ranges.append(PortRange(protocol, 1, LAST_PORT))
            elif isinstance(port, int):
                ranges.append(PortRange(protocol, port, int(entry.get("endPort", port))))
            elif str(port).isdigit():
                ranges.append(PortRange(protocol, int(port), int(entry.get("endPort", port))))
            else:
                # A named port admits the destination's container port of that name and protocol, if it has one.
                ranges += [
                    PortRange(protocol, n, n) for name, n, p in destination.named_ports if (name, p) == (port, protocol)
                ]
        return tuple(ranges)

    def admitted(self, source: Endpoint, destination: Endpoint) -> tuple[PortRange, ...]:
        """The ports on which `destination` admits a connection from `source` (EVERY_PORT when not isolated or
        when a rule admits every port; empty when nothing admits it)."""
        if source.name == destination.name and source.namespace == destination.namespace:
            return EVERY_PORT
        selecting = self._selecting(destination)
        if not selecting:
            return EVERY_PORT
        ranges: set[PortRange] = set()
        for spec in selecting:
            for rule in spec.get("ingress") or ():
                peers = rule.get("from") or ()
                if peers and not any(self._peer_matches(p, destination.namespace, source) for p in peers):
                    continue
                ranges.update(self._ports(rule.get("ports"), destination))
        return normalized(ranges)

    def reaches(self, source: Endpoint, destination: Endpoint, port: int, protocol: str = "TCP") -> bool:
        return any(r.protocol == protocol and r.first <= port <= r.last for r in self.admitted(source, destination))


def normalized(ranges: Iterable[PortRange]) -> tuple[PortRange, ...]:
    """Overlapping or adjacent ranges of a protocol merged; EVERY_PORT when they cover every port of each."""
    merged: list[PortRange] = []
    for r in sorted(ranges):
        if merged and merged[-1].protocol == r.protocol and r.first <= merged[-1].last + 1:
            merged[-1] = PortRange(r.protocol, merged[-1].first, max(merged[-1].last, r.last))
        else:
            merged.append(r)
    return tuple(merged)
