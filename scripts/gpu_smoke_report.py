"""The GPU smoke's one table and its JSON, from the files its runs wrote (scripts/gpu_smoke.sh calls this).

    python scripts/gpu_smoke_report.py WORK_DIR --json PATH --runs RUNS_TSV --torch TORCH_JSON
        --tokens-per-step N --total-s S

RUNS_TSV holds one `name<TAB>result<TAB>seconds` line per run (result PASS, FAIL (exit N) or SKIPPED: why). Only the
standard library: it runs under the GPU machine's Python.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# The runs gpu_smoke.sh makes, in its order, and the file each leaves in WORK_DIR.
RUNS = {
    "nvrx-inprocess": "inprocess/metrics.json",
    "ft-sigkill": "sigkill/metrics.json",
    "nvrx-sync": "sync/metrics.json",
    "fabric": "fabric.json",
    "ray": "ray.json",
}


def load(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def median_step_s(metrics: dict[str, Any]) -> float | None:
    steps = [float(s["seconds"]) for s in metrics.get("step_times", [])]
    return statistics.median(steps) if steps else None


def recovery(metrics: dict[str, Any], mechanism: str) -> float | None:
    """Seconds from the fault to the resumed step, if `mechanism` (inprocess, ft_launcher) is what recovered it."""
    for entry in metrics.get("recoveries", []):
        if entry.get("recovered_by") == mechanism and isinstance(entry.get("recovery_s"), int | float):
            return float(entry["recovery_s"])
    return None


def per_s(count: int, seconds: float | None) -> float | None:
    return count / seconds if seconds else None


def report(
    work: Path, runs: dict[str, tuple[str, int]], torch_info: dict[str, Any], tokens_per_step: int, total_s: int
) -> dict[str, Any]:
    files = {name: load(work / path) for name, path in RUNS.items()}
    inprocess, sigkill, sync = files["nvrx-inprocess"], files["ft-sigkill"], files["nvrx-sync"]
    fabric, ray = files["fabric"], files["ray"]
    step_async, step_sync = median_step_s(inprocess), median_step_s(sync)
    ray_metrics = ray.get("metrics", {}) if isinstance(ray.get("metrics"), dict) else {}
    ray_rate = ray_metrics.get("mean_steps_per_s")
    ray_step = 1.0 / ray_rate if isinstance(ray_rate, int | float) and ray_rate > 0 else None
    return {
        "torch": torch_info,
        "total_s": total_s,
        "runs": {name: {"result": result, "seconds": seconds} for name, (result, seconds) in runs.items()},
        "recovery_s": {"inprocess": recovery(inprocess, "inprocess"), "ft_launcher": recovery(sigkill, "ft_launcher")},
        "save_stall_s": {
            "async": inprocess.get("save_stall_s", {}).get("median"),
            "async_savers": sorted({s["saver"] for s in inprocess.get("saves", [])}),
            "sync": sync.get("save_stall_s", {}).get("median"),
        },
        "step_time_s": {"nvrx_async": step_async, "nvrx_sync": step_sync, "ray": ray_step},
        "tokens_per_s": {
            "nvrx_async": per_s(tokens_per_step, step_async),
            "nvrx_sync": per_s(tokens_per_step, step_sync),
            "ray": ray_metrics.get("mean_tokens_per_s"),
        },
        "fabric": {k: fabric.get(k) for k in ("world_size", "backend", "peak_busbw_gbps", "wrong_total")},
    }


def _num(value: Any, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, int | float) else "-"


def table(result: dict[str, Any]) -> str:
    torch_info, runs = result["torch"], result["runs"]
    stall, step, tokens = result["save_stall_s"], result["step_time_s"], result["tokens_per_s"]
    recoveries = result["recovery_s"]
    cells = {
        "nvrx-inprocess": (
            f"{_num(recoveries['inprocess'], '.2f')} in-process",
            f"{_num(stall['async'], '.4f')} async",
            _num(step["nvrx_async"], ".4f"),
            _num(tokens["nvrx_async"], ".0f"),
        ),
        "ft-sigkill": (f"{_num(recoveries['ft_launcher'], '.2f')} ft_launcher", "", "", ""),
        "nvrx-sync": (
            "",
            f"{_num(stall['sync'], '.4f')} sync",
            _num(step["nvrx_sync"], ".4f"),
            _num(tokens["nvrx_sync"], ".0f"),
        ),
        "fabric": (f"busbw {_num(result['fabric']['peak_busbw_gbps'], '.1f')} GB/s", "", "", ""),
        "ray": ("", "", _num(step["ray"], ".4f"), _num(tokens["ray"], ".0f")),
    }
    head = (
        f"GPU smoke: torch {torch_info.get('version', '?')} (CUDA {torch_info.get('cuda', '?')}) from "
        f"{torch_info.get('python', '?')}, {torch_info.get('gpus', '?')} x {torch_info.get('device', '?')}, "
        f"{result['total_s']} s in all"
    )
    lines = [
        head,
        f"{'run':<15} {'result':<22} {'s':>4}  {'recovery s':<20} {'save stall s':<14} {'step s':>8} {'tokens/s':>9}",
    ]
    for name, (recovered, stalled, step_s, rate) in cells.items():
        outcome = runs.get(name, {"result": "not run", "seconds": 0})
        lines.append(
            f"{name:<15} {outcome['result']:<22} {outcome['seconds']:>4}  {recovered:<20} {stalled:<14} "
            f"{step_s:>8} {rate:>9}"
        )
    return "\n".join(lines)


def read_runs(path: Path) -> dict[str, tuple[str, int]]:
    runs = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            name, outcome, seconds = line.split("\t")
            runs[name] = (outcome, int(seconds))
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/gpu_smoke_report.py", description=__doc__)
    parser.add_argument("work", type=Path)
    parser.add_argument("--json", type=Path, required=True, help="where the table goes as JSON")
    parser.add_argument("--runs", type=Path, required=True, help="name<TAB>result<TAB>seconds, one run a line")
    parser.add_argument("--torch", type=Path, required=True, help="JSON: the torch the runs saw")
    parser.add_argument("--tokens-per-step", type=int, required=True, help="tokens per NVRx step over all ranks")
    parser.add_argument("--total-s", type=int, required=True)
    args = parser.parse_args(argv)
    result = report(args.work, read_runs(args.runs), load(args.torch), args.tokens_per_step, args.total_s)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(table(result))
    print(f"(as JSON: {args.json})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
