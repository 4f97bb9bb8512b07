"""The block groups the hold controller watches, from the JSON its chart writes (k8s/charts/capacity_hold.py):

{"groups": {"p5": {"queue": "gpu-p5", "end": "2026-12-10T11:30:00+00:00", "stop_margin_s": 2400,
                   "lead_s": 2160.0, "lead": "startup 1200 s + 600 steps x 1.6 s to the first checkpoint"}},
 "poll_s": 30}

`end` is the block's EndDate (infra/spec Capacity.end); `stop_margin_s` how long before it every job has stopped
(CAPACITY_BLOCK_STOP_MARGIN); `lead_s` how long a job admitted now needs to reach its first checkpoint
(k8s/capacity_deadline.py first_checkpoint_lead). The queue holds from end - stop_margin_s - lead_s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

POLL_S = 30.0
# Its Deployment and ServiceAccount, and the ConfigMap this file's JSON is mounted from (k8s/charts/capacity_hold.py).
CONTROLLER = "capacity-hold-controller"
CONFIG_MAP = f"{CONTROLLER}-config"


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class BlockGroup:
    name: str
    queue: str
    end: str
    stop_margin_s: float
    lead_s: float
    lead: str = ""
    """What the lead is made of, for the Event and the log."""

    def end_s(self) -> float:
        return datetime.fromisoformat(self.end).timestamp()

    def hold_at(self) -> float:
        """Seconds since the epoch from which a job admitted onto the block cannot reach its first checkpoint."""
        return self.end_s() - self.stop_margin_s - self.lead_s


@dataclass(frozen=True)
class HoldConfig:
    groups: Mapping[str, BlockGroup]
    poll_s: float = POLL_S

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> HoldConfig:
        groups_json = value.get("groups")
        if not isinstance(groups_json, dict) or not groups_json:
            raise ConfigError(f"groups: {groups_json!r} must name at least one Capacity Block group")
        groups: dict[str, BlockGroup] = {}
        for name, group in groups_json.items():
            where = f"groups.{name}"
            if not isinstance(group, dict):
                raise ConfigError(f"{where}: {group!r} is not an object")
            queue, end, lead = group.get("queue"), group.get("end"), group.get("lead", "")
            if not isinstance(queue, str) or not queue or not isinstance(end, str) or not isinstance(lead, str):
                raise ConfigError(f"{where}: queue and end must be strings, got {queue!r} and {end!r}")
            try:
                parsed = datetime.fromisoformat(end)
            except ValueError:
                raise ConfigError(f"{where}.end: {end!r} is not ISO 8601") from None
            if parsed.utcoffset() is None:
                raise ConfigError(f"{where}.end: {end!r} needs its UTC offset")
            try:
                margin, lead_s = float(group["stop_margin_s"]), float(group["lead_s"])
            except (KeyError, TypeError, ValueError):
                raise ConfigError(f"{where}: stop_margin_s and lead_s must be numbers") from None
            if margin < 0 or lead_s < 0:
                raise ConfigError(f"{where}: stop_margin_s {margin} and lead_s {lead_s} must be >= 0")
            groups[name] = BlockGroup(name, queue, end, margin, lead_s, lead)
        poll = float(value.get("poll_s", POLL_S))
        if poll <= 0:
            raise ConfigError(f"poll_s: {poll} must be > 0")
        return cls(groups, poll)

    @classmethod
    def load(cls, path: Path) -> HoldConfig:
        return cls.from_json(json.loads(path.read_text()))

    def to_json(self) -> dict[str, Any]:
        return {
            "groups": {
                g.name: {
                    "queue": g.queue,
                    "end": g.end,
                    "stop_margin_s": g.stop_margin_s,
                    "lead_s": g.lead_s,
                    "lead": g.lead,
                }
                for g in self.groups.values()
            },
            "poll_s": self.poll_s,
        }
