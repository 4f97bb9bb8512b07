"""The NVRx job's measured save throughput (its journal's commit events: bytes, write_s; training/journal.py
commit_fields) against its environment's file-system write baseline (infra/spec/checkpoint_throughput.py), which
synth sized the job's checkpoint interval from (k8s/checkpoint_writes.py)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from infra.spec.checkpoint_throughput import describe, write_mb_s
from infra.spec.environments import get_environment
from training.journal import Event


@dataclass(frozen=True, kw_only=True)
class SaveThroughput:
    saves: int
    median_mb_s: float
    min_mb_s: float
    median_write_s: float
    environment: str | None
    spec_mb_s: float | None
    spec: str | None

    @property
    def percent_of_spec(self) -> float | None:
        return 100.0 * self.median_mb_s / self.spec_mb_s if self.spec_mb_s else None

    def as_json(self) -> dict[str, Any]:
        return {
            "saves": self.saves,
            "median_mb_s": self.median_mb_s,
            "min_mb_s": self.min_mb_s,
            "median_write_s": self.median_write_s,
            "environment": self.environment,
            "spec_mb_s": self.spec_mb_s,
            "spec": self.spec,
            "percent_of_spec": self.percent_of_spec,
        }


def measured_saves(events: list[dict[str, Any]], environment: str | None) -> SaveThroughput | None:
    """From the commit events that carry a size and a duration; None when none does (an older journal). The
    environment's figure when `environment` names one with a checkpoint file system."""
    sized = [e for e in events if e["event"] == Event.COMMIT and e.get("bytes") and e.get("write_s")]
    if not sized:
        return None
    rates = [e["bytes"] / 1e6 / e["write_s"] for e in sized]
    storage = get_environment(environment).add_ons.checkpoint_storage if environment else None
    return SaveThroughput(
        saves=len(sized),
        median_mb_s=statistics.median(rates),
        min_mb_s=min(rates),
        median_write_s=statistics.median(e["write_s"] for e in sized),
        environment=environment,
        spec_mb_s=write_mb_s(storage) if storage is not None else None,
        spec=describe(storage) if storage is not None else None,
    )


def render_saves(saves: SaveThroughput) -> str:
    line = (
        f"  save throughput: median {saves.median_mb_s:,.1f} MB/s, lowest {saves.min_mb_s:,.1f} MB/s over "
        f"{saves.saves} committed save(s) (median {saves.median_write_s:,.1f} s from start to commit)"
    )
    if saves.environment is None:
        return line + "; pass --env for the file system's figure"
    if saves.spec_mb_s is None:
        return line + f"; {saves.environment} has no checkpoint file system"
    return line + (
        f"; {saves.environment}'s file system: {saves.spec_mb_s:,.1f} MB/s ({saves.spec}), "
        f"{saves.percent_of_spec:.0f}% of it"
    )
