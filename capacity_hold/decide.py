"""Whether a block group's ClusterQueue should hold now, and whether the controller may change it: pure.

Kueue v0.19.2 ClusterQueue `spec.stopPolicy` (apis/kueue/v1beta2 clusterqueue_types.go; k8s/crds/kueue-v0.19.2):
"Hold - Admitted workloads will run to completion and Reserving workloads will cancel the reservation"; "None -
Workloads are admitted". So Hold refuses every new admission onto the block and leaves the running jobs to their
own deadline (training/deadline.py: checkpoint and stop at the stop point). HoldAndDrain would evict them, cutting
the final save short: the controller never sets it.

The controller changes only what it set: it writes Hold with its record (HOLD_ANNOTATION) and releases a Hold only
when that record is there. A stopPolicy someone else set (an operator's Hold or HoldAndDrain) is left as it is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from capacity_hold.config import CONTROLLER, BlockGroup

HOLD_ANNOTATION = "platform/capacity-hold"
HOLD_REASON = "CapacityBlockHold"
RELEASED_REASON = "CapacityBlockHoldReleased"
COMPONENT = CONTROLLER
HOLD = "Hold"
NONE = "None"


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class HoldRecord:
    """The controller's annotation on a ClusterQueue it holds: the block it held for, from when, and why."""

    end: str
    hold_at: str
    lead: str

    @classmethod
    def parse(cls, text: str | None) -> HoldRecord | None:
        if not text:
            return None
        try:
            value = json.loads(text)
            return cls(str(value["end"]), str(value["hold_at"]), str(value.get("lead", "")))
        except (ValueError, KeyError, TypeError):
            # Unreadable: still ours (only this controller may write the key, k8s/charts/capacity_hold.py policy).
            return cls("", "", "")

    def dump(self) -> str:
        return json.dumps({"end": self.end, "hold_at": self.hold_at, "lead": self.lead}, sort_keys=True)


@dataclass(frozen=True)
class QueueState:
    stop_policy: str
    record: HoldRecord | None
    resource_version: str
    uid: str

    @classmethod
    def of(cls, queue: Mapping[str, Any]) -> QueueState:
        meta = queue.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        return cls(
            str((queue.get("spec") or {}).get("stopPolicy") or NONE),
            HoldRecord.parse(annotations.get(HOLD_ANNOTATION)),
            str(meta.get("resourceVersion", "")),
            str(meta.get("uid", "")),
        )


@dataclass(frozen=True)
class Decision:
    """`policy`: the stopPolicy to write (None: write nothing); `record`: the annotation with it (None: remove it)."""

    policy: str | None
    record: HoldRecord | None
    why: str


def decide(group: BlockGroup, queue: QueueState, now: float) -> Decision:
    hold_at = group.hold_at()
    stop_at = group.end_s() - group.stop_margin_s
    if now >= hold_at:
        if queue.stop_policy != NONE:
            owner = "this controller" if queue.record is not None else "someone else"
            return Decision(None, None, f"already {queue.stop_policy} (set by {owner})")
        return Decision(
            HOLD,
            HoldRecord(group.end, iso(hold_at), group.lead),
            f"Capacity Block of group {group.name} ends {group.end}; its jobs stop at {iso(stop_at)}; a job admitted "
            f"from {iso(hold_at)} cannot reach its first checkpoint before then ({group.lead}): Kueue admits nothing "
            f"more onto ClusterQueue {group.queue} (stopPolicy Hold) until a later block's end is deployed",
        )
    if queue.stop_policy != NONE and queue.record is not None:
        return Decision(
            NONE,
            None,
            f"group {group.name}'s block now ends {group.end} (held for {queue.record.end or 'an unreadable record'}): "
            f"ClusterQueue {group.queue} admits again until {iso(hold_at)}",
        )
    if queue.stop_policy != NONE:
        return Decision(None, None, f"stopPolicy {queue.stop_policy} was set by someone else: left as it is")
    return Decision(None, None, f"admitting until {iso(hold_at)}")
