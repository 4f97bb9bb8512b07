"""What running an instance type costs and how idle its fabric may look: one record per GPU type.

- `efa_idle_floor_fraction`: below this fraction of one EFA interface's link rate, averaged over a
  minute, an interface counts as idle for the "fabric idle while GPUs are busy" alarm
  (infra/spec/alarms.py). The link rate per interface is the instance's network bandwidth divided by
  its EFA interfaces (infra/spec/instances.py: p5 3,200 Gbps / 32 = 100 Gbps; g6.12xlarge 40 Gbps / 1).
  1 % is far below what data-parallel collectives move (an FSDP step of a 1.5B model all-gathers and
  reduce-scatters several GB) and far above the near-zero counters of a job that fell back to TCP.
- `on_demand_usd_per_hour`: Linux On-Demand price in us-east-1 from the Amazon EC2 On-Demand pricing
  page as of `price_as_of` (P5 prices after AWS's June 2025 reduction of P4/P5 On-Demand prices).
  These were not re-read from this workstation (no network): check them against the pricing page
  (or `aws pricing get-products --service-code AmazonEC2`) before quoting a cost; None where no figure
  was at hand, and the goodput ledger then reports GPU-hours without a cost.
- `NODE_MTBF`: unexpected interruptions per node-hour at scale, for the Young-Daly checkpoint interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType

from infra.spec.errors import ConfigError
from infra.spec.instances import INSTANCE_TYPES

PRICE_SOURCE = "Amazon EC2 On-Demand pricing, Linux, us-east-1 (aws.amazon.com/ec2/pricing/on-demand)"


@dataclass(frozen=True, kw_only=True)
class OperatingFacts:
    instance_type: str
    efa_idle_floor_fraction: float
    on_demand_usd_per_hour: float | None
    price_as_of: str

    def __post_init__(self) -> None:
        spec = INSTANCE_TYPES.get(self.instance_type)
        if spec is None:
            raise ConfigError("operating.instance_type", self.instance_type, INSTANCE_TYPES)
        if not 0 < self.efa_idle_floor_fraction < 0.5:
            raise ConfigError(
                f"operating[{self.instance_type}].efa_idle_floor_fraction",
                self.efa_idle_floor_fraction,
                "a fraction of the link rate between 0 and 0.5 (e.g. 0.01)",
            )
        if self.on_demand_usd_per_hour is not None and not self.on_demand_usd_per_hour > 0:
            raise ConfigError(
                f"operating[{self.instance_type}].on_demand_usd_per_hour", self.on_demand_usd_per_hour, "> 0 or None"
            )

    @property
    def efa_link_bytes_per_s(self) -> float:
        """Link rate of one EFA interface in bytes per second."""
        spec = INSTANCE_TYPES[self.instance_type]
        assert spec.efa is not None
        return spec.network_bandwidth_gbps * 1e9 / 8 / spec.efa.max_interfaces

    @property
    def efa_idle_floor_bytes_per_s(self) -> float:
        return self.efa_idle_floor_fraction * self.efa_link_bytes_per_s


_FACTS = (
    OperatingFacts(
        instance_type="g6.12xlarge", efa_idle_floor_fraction=0.01, on_demand_usd_per_hour=4.6016, price_as_of="2025-06"
    ),
    OperatingFacts(
        instance_type="p4d.24xlarge", efa_idle_floor_fraction=0.01, on_demand_usd_per_hour=None, price_as_of="2025-06"
    ),
    OperatingFacts(
        instance_type="p5.48xlarge", efa_idle_floor_fraction=0.01, on_demand_usd_per_hour=55.04, price_as_of="2025-06"
    ),
    OperatingFacts(
        instance_type="p5e.48xlarge", efa_idle_floor_fraction=0.01, on_demand_usd_per_hour=None, price_as_of="2025-06"
    ),
)

OPERATING: MappingProxyType[str, OperatingFacts] = MappingProxyType({f.instance_type: f for f in _FACTS})


def operating_facts(instance_type: str, *, field: str = "instance_type") -> OperatingFacts:
    try:
        return OPERATING[instance_type]
    except KeyError:
        raise ConfigError(
            field, instance_type, OPERATING, "add its operating facts to infra/spec/operating.py (with the source)"
        ) from None


@dataclass(frozen=True, kw_only=True)
class FailureRate:
    """Mean node-hours between unexpected job interruptions."""

    mtbf_node_hours: float
    source: str

    def job_mtbf_s(self, nodes: int) -> float:
        """A job of `nodes` nodes is interrupted when any node is: its MTBF shrinks with the node count."""
        if nodes < 1:
            raise ConfigError("nodes", nodes, ">= 1")
        return self.mtbf_node_hours * 3600.0 / nodes

    def checkpoint_interval_s(self, *, checkpoint_stall_s: float, nodes: int) -> float:
        """Young (1974) / Daly (2006) first-order optimum: sqrt(2 x checkpoint cost x job MTBF). The cost is what a
        save takes from training (the async saver's stall, not the whole write)."""
        if checkpoint_stall_s <= 0:
            raise ConfigError("checkpoint_stall_s", checkpoint_stall_s, "> 0 (a measured stall per save)")
        return math.sqrt(2 * checkpoint_stall_s * self.job_mtbf_s(nodes))


# "The Llama 3 Herd of Models" (Meta, arXiv:2407.21783, section 3.3.4): 419 unexpected interruptions
# in a 54-day pre-training snapshot on 16,384 H100 GPUs (2,048 nodes of 8):
# 54 * 24 h * 2048 nodes / 419 = 6,335 node-hours per interruption.
NODE_MTBF = FailureRate(
    mtbf_node_hours=54 * 24 * 2048 / 419,
    source="Llama 3 (arXiv:2407.21783) section 3.3.4: 419 unexpected interruptions, 54 days, 2,048 H100 nodes",
)
