"""`pytest -p tests.cpu_time --cpu-time-report=FILE`: CPU seconds per test, for `make bench` on a shared machine.

Wall time on a loaded machine says how busy it was; CPU time says what a test costs. Each test's setup, call and
teardown are charged with the CPU of the pytest process and of the child processes it waited for
(`getrusage(RUSAGE_CHILDREN)`: `subprocess.run`, ft_launcher and its ranks, the rehearsal pods; not daemons that
outlive the test, such as a local Ray cluster's). Each xdist worker appends its own lines to FILE (JSON lines:
nodeid, outcome, cpu_s, wall_s, worker); scripts/bench.py sums them.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Generator
from pathlib import Path

import pytest

_OUTCOMES: dict[str, str] = {}


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-time-report", metavar="FILE", help="append CPU seconds per test to FILE (JSON lines)")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # The worst of setup, call and teardown: a test that passed and failed at teardown counts as failed.
    if report.outcome != "passed" or report.nodeid not in _OUTCOMES:
        _OUTCOMES[report.nodeid] = f"{report.outcome} ({report.when})" if report.outcome != "passed" else "passed"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    report = item.config.getoption("--cpu-time-report")
    cpu, wall = _cpu(), time.perf_counter()
    result = yield
    if report:
        line = {
            "nodeid": item.nodeid,
            "outcome": _OUTCOMES.pop(item.nodeid, "not run"),
            "cpu_s": round(_cpu() - cpu, 3),
            "wall_s": round(time.perf_counter() - wall, 3),
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        }
        with Path(report).open("a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")
    return result
