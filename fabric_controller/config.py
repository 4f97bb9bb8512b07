"""What the controller may do, from the JSON its chart writes (k8s/charts/fabric_gate.py controller_config).

{"namespaces": ["ray", "training"],
 "groups": {"g6": {"queue": "gpu-g6", "flavor": "gpu-g6",
                   "per_node": {"cpu": "44", "memory": "170Gi", "nvidia.com/gpu": "4", ...}}},
 "max_per_group_per_hour": 2, "poll_s": 2}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The rate bound's default: more nodes of one group failing the gate within an hour is a fabric-wide or
# configuration problem that tainting more nodes would only hide (an operator decides; the gate's alarm fires).
MAX_PER_GROUP_PER_HOUR = 2
POLL_S = 2.0


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class GroupConfig:
    name: str
    queue: str
    flavor: str
    per_node: Mapping[str, str]
    """The quota one whole node of the group adds to its ClusterQueue's flavor (k8s/queueing.py gpu_quota)."""


@dataclass(frozen=True)
class ControllerConfig:
    namespaces: tuple[str, ...]
    groups: Mapping[str, GroupConfig]
    max_per_group_per_hour: int = MAX_PER_GROUP_PER_HOUR
    poll_s: float = POLL_S

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> ControllerConfig:
        def need(key: str, kind: type, where: Mapping[str, Any], path: str) -> Any:
            if not isinstance(where.get(key), kind):
                raise ConfigError(f"{path}{key}: {where.get(key)!r} is not a {kind.__name__}")
            return where[key]

        namespaces = need("namespaces", list, value, "")
        groups: dict[str, GroupConfig] = {}
        for name, group in need("groups", dict, value, "").items():
            path = f"groups.{name}."
            per_node = need("per_node", dict, group, path)
            groups[name] = GroupConfig(
                name, need("queue", str, group, path), need("flavor", str, group, path), dict(per_node)
            )
        if not namespaces or not groups:
            raise ConfigError("namespaces and groups must each name at least one")
        limit = int(value.get("max_per_group_per_hour", MAX_PER_GROUP_PER_HOUR))
        poll = float(value.get("poll_s", POLL_S))
        if limit < 1 or poll <= 0:
            raise ConfigError(f"max_per_group_per_hour {limit} must be >= 1 and poll_s {poll} > 0")
        return cls(tuple(str(n) for n in namespaces), groups, limit, poll)

    @classmethod
    def load(cls, path: Path) -> ControllerConfig:
        return cls.from_json(json.loads(path.read_text()))

    def to_json(self) -> dict[str, Any]:
        groups = self.groups.values()
        return {
            "namespaces": list(self.namespaces),
            "groups": {g.name: {"queue": g.queue, "flavor": g.flavor, "per_node": dict(g.per_node)} for g in groups},
            "max_per_group_per_hour": self.max_per_group_per_hour,
            "poll_s": self.poll_s,
        }
