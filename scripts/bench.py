"""Synth and test-suite timings: medians of several runs, with ratios (make bench).

Shared machines are noisy, so every figure is the median of --runs runs, and the
ratios (environment vs environment, synth vs tests) are what to compare across machines.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "CDK_DISABLE_VERSION_CHECK": "true", "CDK_DISABLE_CLI_TELEMETRY": "true"}


REHEARSALS = (
    ("rehearse: harness", "tests/rehearse/test_harness.py"),
    (
        "rehearse: nvrx prod g6",
        "tests/rehearse/test_workloads.py::test_prod_nvrx_job_on_the_shared_claim_completes_on_two_pods",
    ),
    ("rehearse: nvrx dev", "tests/rehearse/test_workloads.py::test_dev_nvrx_job_completes_on_two_pods"),
    (
        "rehearse: nvrx rank kill",
        "tests/rehearse/test_nvrx_faults.py::"
        "test_a_sigkilled_rank_is_restarted_by_ft_launcher_from_the_last_committed_checkpoint",
    ),
    (
        "rehearse: nvrx pod 1 lost",
        "tests/rehearse/test_nvrx_faults.py::"
        "test_a_lost_pod_1_is_replaced_without_counting_and_the_job_resumes_from_the_claim",
    ),
    (
        "rehearse: nvrx pod 0 lost",
        "tests/rehearse/test_nvrx_faults.py::"
        "test_a_lost_pod_0_costs_one_counted_failure_of_pod_1_and_the_job_resumes_from_the_claim",
    ),
    (
        "rehearse: fabric check",
        "tests/rehearse/test_fabric_job.py::test_fabric_check_on_cpu_fails_saying_nccl_is_not_on_efa",
    ),
    # Skipped (so no figure) where this Python has a minimal Ray: `ray job submit` needs ray[default].
    ("rehearse: ray fine-tune", "tests/rehearse/test_rayjob.py"),
)


# The test tiers (docs/testing.md), each a whole make target as a developer or CI runs it.
TIERS = (
    ("make test-fast", "test-fast"),
    ("make test-rehearsal", "test-rehearsal"),
    ("make test", "test"),
)
TOP_TESTS = 15


@dataclass(frozen=True)
class TierRun:
    """One run of a tier: wall seconds, CPU seconds of make and every process it waited for, CPU per test."""

    wall_s: float
    cpu_s: float
    tests: dict[str, float]


@dataclass(frozen=True)
class Case:
    name: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


def run_once(case: Case, outdir: Path) -> float:
    argv = tuple(a.replace("{out}", str(outdir)) for a in case.argv)
    start = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, env={**ENV, **dict(case.env)}, check=True, capture_output=True)
    return time.perf_counter() - start


def measure(case: Case, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            times.append(run_once(case, Path(tmp)))
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5, help="runs per synth case (median reported)")
    parser.add_argument("--test-runs", type=int, default=3, help="runs of the whole test suite")
    parser.add_argument("--rehearsal-runs", type=int, default=1, help="runs of each workload rehearsal")
    parser.add_argument("--only-rehearsals", action="store_true", help="time the rehearsal rows alone")
    parser.add_argument("--tier-runs", type=int, default=1, help="runs of each test tier (make test-fast, ...)")
    parser.add_argument("--only-tiers", action="store_true", help="time the test-tier rows alone")
    parser.add_argument(
        "--tier", action="append", default=[], metavar="TARGET", help="only these tiers (e.g. test-fast); repeatable"
    )
    parser.add_argument(
        "--make-flag",
        action="append",
        default=[],
        metavar="FLAG",
        help="passed to make for the tier rows, e.g. --make-flag=-o.venv/.installed where a shared toolchain "
        "must not be reinstalled",
    )
    parser.add_argument(
        "--rehearsal", action="append", default=[], metavar="TEXT", help="only rehearsal rows whose name has TEXT"
    )
    args = parser.parse_args()
    results: dict[str, list[float]] = {}
    if args.only_tiers:
        results |= tiers(args.tier, args.tier_runs, args.make_flag)
        return report(results, ratios=False)
    if not args.only_rehearsals:
        results |= synth_and_suite(args.runs, args.test_runs)
        results |= tiers(args.tier, args.tier_runs, args.make_flag)

    # Rehearsal wall time per workload (trainctl rehearse, tiny model on CPU): one pytest run each.
    for name, selector in REHEARSALS:
        if args.rehearsal and not any(text in name for text in args.rehearsal):
            continue
        results[name] = measure(
            Case(name, (sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", selector)), args.rehearsal_runs
        )

    return report(results, ratios=not args.only_rehearsals)


def report(results: dict[str, list[float]], *, ratios: bool) -> int:
    base = statistics.median(results.get("cdk synth -c env=dev", [1.0]))
    ratio = "vs dev synth" if ratios else ""
    print(f"{'what':<34} {'runs':>4} {'median s':>9} {'min s':>7} {'max s':>7} {ratio:>12}")
    for name, times in results.items():
        median = statistics.median(times)
        spread = f"{min(times):>7.2f} {max(times):>7.2f}"
        versus = f"{median / base:>11.2f}x" if ratios else ""
        print(f"{name:<34} {len(times):>4} {median:>9.2f} {spread} {versus}")
    return 0


def tier_once(target: str, make_flags: list[str]) -> TierRun:
    """`make TARGET` with each pytest run charging CPU seconds to its tests (tests/cpu_time.py)."""
    with tempfile.TemporaryDirectory() as tmp:
        per_test = Path(tmp) / "cpu.jsonl"
        pytest_args = f"-p tests.cpu_time --cpu-time-report={per_test} --basetemp={tmp}/pt -p no:cacheprovider"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(
            ("make", *make_flags, target, f"PYTEST_ARGS={pytest_args}"),
            cwd=ROOT,
            env=ENV,
            check=True,
            capture_output=True,
        )
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        tests: dict[str, float] = {}
        for line in per_test.read_text().splitlines() if per_test.exists() else ():
            record = json.loads(line)
            tests[record["nodeid"]] = tests.get(record["nodeid"], 0.0) + record["cpu_s"]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return TierRun(wall, cpu, tests)


def tiers(only: list[str], runs: int, make_flags: list[str]) -> dict[str, list[float]]:
    """Wall and CPU time of each test tier, as `make TARGET` (lint and types included; make test also runs make
    check), and the tests that cost the most CPU. CPU / cores is what the tier would take on an idle machine where
    its work spreads over every core; on a shared machine the wall time mostly says how busy the machine was."""
    results: dict[str, list[float]] = {}
    cores = os.cpu_count() or 1
    for name, target in TIERS:
        if only and target not in only:
            continue
        done = [tier_once(target, make_flags) for _ in range(runs)]
        results[f"{name} (wall)"] = [run.wall_s for run in done]
        results[f"{name} (CPU)"] = [run.cpu_s for run in done]
        results[f"{name} (CPU / {cores} cores)"] = [run.cpu_s / cores for run in done]
        last = done[-1].tests
        print(f"{name}: {len(last)} tests, {sum(last.values()):.0f} CPU s in tests; the most CPU (last run):")
        for nodeid, cpu in sorted(last.items(), key=lambda kv: -kv[1])[:TOP_TESTS]:
            print(f"  {cpu:8.1f} s  {nodeid}")
    return results


def synth_and_suite(runs: int, test_runs: int) -> dict[str, list[float]]:
    app = f"{sys.executable} app.py"
    # The workload charts need pinned images; time them with the check lock `make check` uses.
    check_lock = Path(tempfile.mkdtemp()) / "images.lock.json"
    subprocess.run([sys.executable, "-m", "k8s.check_lock", str(check_lock)], cwd=ROOT, check=True)
    cases = [
        Case("cdk synth -c env=dev", ("cdk", "synth", "--quiet", "-c", "env=dev", "-o", "{out}", "--app", app)),
        Case("cdk synth -c env=prod", ("cdk", "synth", "--quiet", "-c", "env=prod", "-o", "{out}", "--app", app)),
        Case("cdk synth (all)", ("cdk", "synth", "--quiet", "-o", "{out}", "--app", app)),
        Case(
            "k8s synth (all)",
            (sys.executable, "-m", "k8s.main", "--output", "{out}"),
            env=(("IMAGE_LOCK", str(check_lock)),),
        ),
    ]
    results = {case.name: measure(case, runs) for case in cases}
    results["pytest (whole suite)"] = measure(
        Case("pytest", (sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider")), test_runs
    )
    return results


if __name__ == "__main__":
    raise SystemExit(main())
