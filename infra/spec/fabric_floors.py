"""Multi-node all-reduce bus-bandwidth floors: below its floor, a GPU node group's fabric is reported failing.

The number is nccl-tests' all-reduce "busbw" (GB/s, 1 GB = 1e9 bytes), checked at the largest message size
of a sweep that reaches at least `min_message_bytes` (smaller messages are latency-bound). The fabric probe
(`training/fabric_probe.py`) and the nccl-tests parser (`training/nccl_tests.py`) apply it.

Which floors are measured and which derived (each record says so in `basis` and `source`):
- p5.48xlarge: measured (the published EKS run, 2 GiB); p5e.48xlarge: the p5 measurement applied to the same network;
- p4d.24xlarge and g6.12xlarge: derived (no public nccl-tests figure of their own on EKS).

Two kinds of floor, each marked:
- measured: a published nccl-tests result less a stated margin;
- derived: no public figure exists, so the floor is the per-node network bandwidth from
  infra/spec/instances.py (network_bandwidth_gbps / 8, in GB/s) times an assumed efficiency. Replace it
  with a measured floor once a real run of the check exists.

Why per-node bandwidth is the yardstick: in an all-reduce that spans nodes, each node has to send (and
receive) at least 2(N-1)/N * S bytes of an S-byte buffer over its network, so for n ranks on N nodes
    busbw <= B * N/(N-1) * (n-1)/n,   B = per-node network bandwidth,
which is 1.875 B for 2 nodes of 8 GPUs and falls towards B as the node count grows (a ring all-reduce,
NCCL's choice for large messages at scale, is bounded by B itself). Measured floors are calibrated on
2-node runs, the configuration their source measured; a derived floor below B holds for any node count.

TCP: no published nccl-tests figure for these types over TCP sockets was found, so no TCP expectation is
recorded here. On g6.12xlarge the EFA device and the ENA (TCP) interface share the one 40 Gbps card, so the
floor there cannot tell EFA from a TCP fallback; the fabric analyzer's transport check does that.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from infra.spec.errors import ConfigError
from infra.spec.instances import INSTANCE_TYPES

MEASURED = "measured"
DERIVED = "derived"

GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True, kw_only=True)
class FabricFloor:
    instance_type: str
    # The floor itself, GB/s of all-reduce bus bandwidth.
    busbw_gbps: float
    # The floor applies to messages at least this large.
    min_message_bytes: int
    # MEASURED (published result less a margin) or DERIVED (network bandwidth times an efficiency).
    basis: str
    # The figure the floor comes from: the published busbw, or the per-node network bandwidth (GB/s).
    reference_gbps: float
    # floor = reference * factor: 1 - margin for MEASURED, the assumed efficiency for DERIVED.
    factor: float
    source: str


def _measured(
    name: str, *, published_busbw_gbps: float, margin: float, min_message_bytes: int, source: str
) -> FabricFloor:
    return FabricFloor(
        instance_type=name,
        busbw_gbps=round(published_busbw_gbps * (1 - margin), 1),
        min_message_bytes=min_message_bytes,
        basis=MEASURED,
        reference_gbps=published_busbw_gbps,
        factor=1 - margin,
        source=source,
    )


def _derived(name: str, *, efficiency: float, min_message_bytes: int, source: str) -> FabricFloor:
    # network_bandwidth_gbps is in Gbit/s; busbw is in GB/s.
    line_rate_gbps = INSTANCE_TYPES[name].network_bandwidth_gbps / 8
    return FabricFloor(
        instance_type=name,
        busbw_gbps=round(line_rate_gbps * efficiency, 1),
        min_message_bytes=min_message_bytes,
        basis=DERIVED,
        reference_gbps=line_rate_gbps,
        factor=efficiency,
        source=source,
    )


# Source: aws-samples/awsome-distributed-training, micro-benchmarks/nccl-tests/README.md. Two published runs of
# all_reduce_perf on 2 x p5.48xlarge (16 H100), out-of-place busbw:
# - "Amazon EKS" (an MPIJob; EFA installer 1.28.0, aws-ofi-nccl 1.7.3, NCCL 2.18.5): 279.00 GB/s at 512 MiB,
#   313.29 at 1 GiB, 437.79 at 2 GiB (where that run ends);
# - Slurm: 393.34 at 512 MiB, 436.95 at 1 GiB, 443.72 at 2 GiB, 487.09 at 16 GiB.
# This platform runs on EKS, so the floor is calibrated on the EKS run, at the size where it reached the plateau
# both runs share: 2 GiB (437.79 EKS, 443.72 Slurm, within 1.4%). At 1 GiB the EKS run was still climbing (313.29,
# 28% under Slurm's 436.95), so a floor applied at 1 GiB would either fail that healthy EKS pair (the old
# 349.6 GB/s floor did) or be so low that losing a quarter of the EFA interfaces would pass. Hence min 2 GiB,
# the size the fabric check and the in-job gate sweep to.
# Margin 20%: covers run-to-run and placement variation and NCCL / aws-ofi-nccl version differences, while a real
# fault still fails: losing a quarter of the 32 EFA interfaces costs about 25% of a network-bound all-reduce,
# and a fallback to TCP sockets far more. Floor 437.79 * 0.8 = 350.2 GB/s.
# The published runs had 2 nodes; with many nodes the all-reduce bound falls from 1.875 to about 1 times the
# 400 GB/s per node (see the module docstring), so check p5 fabrics in node pairs, as measured.
_P5_SOURCE = (
    "awsome-distributed-training micro-benchmarks/nccl-tests README, Amazon EKS MPIJob on 2 x p5.48xlarge: "
    "all_reduce_perf busbw 437.79 GB/s at 2 GiB (313.29 at 1 GiB, still climbing; the Slurm run: 443.72 at 2 GiB), "
    "less a 20% margin"
)
_P5_EKS_BUSBW_AT_2GIB = 437.79
_P5_MARGIN = 0.20

_FLOORS = (
    _measured(
        "p5.48xlarge",
        published_busbw_gbps=_P5_EKS_BUSBW_AT_2GIB,
        margin=_P5_MARGIN,
        min_message_bytes=2 * GIB,
        source=_P5_SOURCE,
    ),
    # p5e.48xlarge: no published figure of its own; instances.py gives it the p5 network (32 cards,
    # 3200 Gbps EFA, GPUDirect RDMA), which is what bounds a multi-node all-reduce, so the p5 floor applies.
    _measured(
        "p5e.48xlarge",
        published_busbw_gbps=_P5_EKS_BUSBW_AT_2GIB,
        margin=_P5_MARGIN,
        min_message_bytes=2 * GIB,
        source=_P5_SOURCE + "; applied to p5e, which has the same network",
    ),
    # p4d.24xlarge, DERIVED: 400 Gbps EFA = 50 GB/s per node, GPUDirect RDMA over 4 EFA interfaces;
    # assumed efficiency 70% -> 35 GB/s, valid at any node count since it is under 1 x B.
    # Cross-check, not the source: the same README's 2 x p4de.24xlarge run (p4de has p4d's 4 x 100 Gbps
    # EFA network) shows busbw 69.89 GB/s at 256 MiB, 76.79 at 1 GiB, 78.33 at 2 GiB, i.e. algbw 40.96 GB/s
    # at 1 GiB = 82% of the per-node 50 GB/s. The curve is within 11% of its maximum from 256 MiB on,
    # hence the floor applies from 256 MiB.
    _derived(
        "p4d.24xlarge",
        efficiency=0.70,
        min_message_bytes=256 * MIB,
        source="derived, not measured: 400 Gbps EFA = 50 GB/s per node x 70% assumed efficiency",
    ),
    # g6.12xlarge, DERIVED: one 40 Gbps card = at most 5 GB/s per node, no GPUDirect RDMA (NCCL stages
    # through host memory over PCIe) and the card is shared with the ENA traffic: assumed efficiency
    # 50% -> 2.5 GB/s. No public nccl-tests figure for g6 exists.
    # From 256 MiB: at <= 5 GB/s a 256 MiB all-reduce takes >= 50 ms per op, so the tens-to-hundreds of
    # microseconds of per-op latency (the p5/p4de curves above start at 65-165 us) are under 1% of it:
    # bandwidth-bound, while a sweep to 1 GiB on a slow fabric stays short.
    _derived(
        "g6.12xlarge",
        efficiency=0.50,
        min_message_bytes=256 * MIB,
        source="derived, not measured: 40 Gbps EFA = 5 GB/s per node x 50% assumed efficiency (no GPUDirect RDMA)",
    ),
)

FABRIC_FLOORS: MappingProxyType[str, FabricFloor] = MappingProxyType({f.instance_type: f for f in _FLOORS})


def fabric_floor(instance_type: str) -> FabricFloor:
    """The floor record for an instance type; a type without one is a ConfigError naming those with one."""
    try:
        return FABRIC_FLOORS[instance_type]
    except KeyError:
        raise ConfigError(
            "instance_type",
            instance_type,
            FABRIC_FLOORS,
            "no all-reduce bus-bandwidth floor is known for it; add one to infra/spec/fabric_floors.py "
            "with its source (a published nccl-tests result, or a derivation from its EFA bandwidth)",
        ) from None


def floor_gbps(instance_type: str) -> float:
    """The multi-node all-reduce bus-bandwidth floor (GB/s) of an instance type."""
    return fabric_floor(instance_type).busbw_gbps


def floor_message_bytes(instance_type: str) -> int:
    """The message size from which the floor applies."""
    return fabric_floor(instance_type).min_message_bytes
