"""NetworkPolicy on the bridge network, as routing rules in each pod's own network namespace.

This machine's kernel has no packet classifier the rehearsal can load from userspace without nft or iptables
(neither is installed), but policy routing matches protocol and ports (`ip rule ... ipproto P dport A-B`, Linux
4.17): in the network namespace of every pod A, for every other pod B that does not admit all of A's traffic,

    pref 100  to B ipproto P dport <each range B admits from A>   lookup main
    pref 100  to B ipproto P sport <each range A admits from B>   lookup main   (replies to B's connections)
    pref 200  to B                                                 prohibit

so A's connection to a port B does not admit fails at once with EACCES ("Permission denied"), where the VPC CNI's
node agent drops the packets and the connection times out: the same verdict, sooner. The reply rules stand in
for connection tracking, which routing rules do not have. They leave out the kernel's ephemeral source ports
(EPHEMERAL, the default `net.ipv4.ip_local_port_range` of a new network namespace), which every connection A
opens without binding a port comes from: so a pod that admits all of B still cannot open connections to B,
but it could from a port it binds below or above that range (no workload does), and it cannot answer B on a
port it admitted inside that range (none of ours listens there for a pod outside its own gang). The node (the
hub, where the rehearsal's API server listens) has no rules, as traffic from a pod's node is always allowed.
Policies and labels do not change during a run and addresses are never reused, so the rules of a
pair are written once, when the later of the two pods starts, before its containers run.
"""

from __future__ import annotations

import os
import subprocess

from rehearse.network_policy import EVERY_PORT, LAST_PORT, Endpoint, Policies, PortRange

# ip rule's ipproto takes the IANA protocol numbers.
PROTOCOL_NUMBERS = {"TCP": 6, "UDP": 17, "SCTP": 132}
ALLOW_PREF = 100
DENY_PREF = 200
# Linux's default net.ipv4.ip_local_port_range (include/net/ip.h, inet_init_net), set anew in each network namespace.
EPHEMERAL = (32768, 60999)


class PolicyRouteError(RuntimeError):
    pass


def _ports(direction: str, r: PortRange) -> str:
    if r.first == 1 and r.last == LAST_PORT:
        return ""
    # The kernel takes no port range or port that ends at 65535 (net/core/fib_rules.c fib_rule_port_range_valid).
    last = min(r.last, LAST_PORT - 1)
    return f"{direction} {r.first if r.first == last else f'{r.first}-{last}'} "


def outside_ephemeral(r: PortRange) -> list[PortRange]:
    """The parts of a range below and above EPHEMERAL."""
    low, high = EPHEMERAL
    parts = [
        PortRange(r.protocol, r.first, min(r.last, low - 1)),
        PortRange(r.protocol, max(r.first, high + 1), r.last),
    ]
    return [p for p in parts if p.first <= p.last]


def rules_toward(policies: Policies, source: Endpoint, destination: Endpoint) -> list[str]:
    """The `ip -batch` lines for `source`'s network namespace about `destination` (none: every port admitted)."""
    admitted = policies.admitted(source, destination)
    if admitted == EVERY_PORT or destination.address is None:
        return []
    to = f"to {destination.address}/32"
    lines = [
        f"rule add pref {ALLOW_PREF} {to} ipproto {PROTOCOL_NUMBERS[r.protocol]} {_ports('dport', r)}lookup main"
        for r in admitted
        if r.first < LAST_PORT
    ]
    replies = [part for r in policies.admitted(destination, source) for part in outside_ephemeral(r)]
    lines += [
        f"rule add pref {ALLOW_PREF} {to} ipproto {PROTOCOL_NUMBERS[r.protocol]} {_ports('sport', r)}lookup main"
        for r in replies
    ]
    lines.append(f"rule add pref {DENY_PREF} {to} prohibit")
    return lines


def apply(namespace_pid: int, lines: list[str]) -> None:
    """Adds the rules in the network namespace of process `namespace_pid`."""
    if not lines:
        return
    result = subprocess.run(
        ["nsenter", f"--net=/proc/{namespace_pid}/ns/net", "ip", "-batch", "-"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        check=False,
    )
    # A pod whose processes have just ended (not yet reaped by the run's poll) has no network namespace left to guard.
    if result.returncode != 0 and os.path.exists(f"/proc/{namespace_pid}/ns/net"):
        raise PolicyRouteError(
            f"ip rule in the network namespace of {namespace_pid}: {result.stderr.strip()} (rules: {lines})"
        )
