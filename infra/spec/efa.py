"""EFA interface layouts, derived from the instance facts alone.

AWS's guidance (EC2 user guide, "Maximize network bandwidth" and "EFA-only interfaces"):
- Types with EFA-only support and several network cards (p5, p5e): network card 0 /
  device 0 is the primary ENA interface; card 0 / device 1 and every further card's
  device 0 are `efa-only`. EFA-only interfaces take no IP address, so a p5 node costs
  one address for its fabric instead of 32 (needs vpc-cni >= 1.18.5).
- Other EFA types: the primary interface (card 0 / device 0) is itself an `efa` interface
  (ENA + EFA); each further card gets one more `efa` interface at device index 1 (EC2 user
  guide, "Maximize network bandwidth on Amazon EC2 instances with multiple network cards":
  "For each additional network interface, use the next unused network card index, device
  index 1"; p4d: 4 in all).
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.spec.errors import ConfigError
from infra.spec.instances import InstanceType

PRIMARY = "interface"
EFA = "efa"
EFA_ONLY = "efa-only"


@dataclass(frozen=True, kw_only=True)
class InterfaceSlot:
    network_card_index: int
    device_index: int
    interface_type: str

    @property
    def is_efa(self) -> bool:
        return self.interface_type in (EFA, EFA_ONLY)

    @property
    def takes_an_address(self) -> bool:
        return self.interface_type != EFA_ONLY


def efa_layout(spec: InstanceType, efa_interfaces: int) -> tuple[InterfaceSlot, ...]:
    """The launch-template interfaces for `efa_interfaces` EFA devices on `spec`."""
    if spec.efa is None:
        raise ConfigError("instance_type", spec.name, "a type with EFA", "pick a type whose facts list EFA")
    if not 1 <= efa_interfaces <= spec.efa.max_interfaces:
        raise ConfigError("efa_interfaces", efa_interfaces, f"1 to {spec.efa.max_interfaces} for {spec.name}")
    if spec.efa.efa_only_supported and spec.network_cards > 1:
        slots = [
            InterfaceSlot(network_card_index=0, device_index=0, interface_type=PRIMARY),
            InterfaceSlot(network_card_index=0, device_index=1, interface_type=EFA_ONLY),
        ]
        slots += [
            InterfaceSlot(network_card_index=card, device_index=0, interface_type=EFA_ONLY)
            for card in range(1, efa_interfaces)
        ]
    else:
        if efa_interfaces > spec.network_cards:
            raise ConfigError(
                "efa_interfaces", efa_interfaces, f"at most one per network card ({spec.network_cards}) on {spec.name}"
            )
        slots = [
            InterfaceSlot(network_card_index=card, device_index=0 if card == 0 else 1, interface_type=EFA)
            for card in range(efa_interfaces)
        ]
    return tuple(slots)
