"""Shared by the fabric-probe tests: the fixture files and the keys both report producers write."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
REPO = Path(__file__).resolve().parents[2]

# The top-level JSON keys of the report, whether it comes from the probe or from nccl-tests output.
REPORT_KEYS = {
    "schema",
    "source",
    "collective",
    "backend",
    "world_size",
    "params",
    "sizes",
    "results",
    "peak_busbw_gbps",
    "large_message_bytes",
    "large_message_busbw_gbps",
    "avg_busbw_gbps",
    "wrong_total",
    "floor",
    "exit_code",
}
RESULT_KEYS = {"size_bytes", "count", "type", "redop", "root", "out_of_place", "in_place", "busbw_gbps", "wrong"}
MEASUREMENT_KEYS = {"time_us", "algbw_gbps", "busbw_gbps", "wrong"}


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")
