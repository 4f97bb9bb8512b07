"""`--dist loadgroup` keeps a group on one worker (tests/xdist_groups.py), on a throwaway suite run under xdist."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from tests.conftest import ROOT

CONFTEST = """
import pytest
from tests import xdist_groups

@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    xdist_groups.configure_node(node)

@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    return xdist_groups.make_scheduler(config, log)

def pytest_collection_modifyitems(config, items):
    xdist_groups.record(config, {i.nodeid: "shared" if "shared" in i.nodeid else "" for i in items})
"""


def test_the_tests_of_one_group_run_on_one_worker_and_the_rest_by_module(tmp_path: Path) -> None:
    # Before tests/xdist_groups.py, the CDK synth's group ran on both workers of `make test-fast` (gw0 and gw1 each
    # ran tests/gates/test_templates_gate.py, so each synthesized): pytest 9.2 drops xdist's "@group" node id suffix.
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for module in ("a", "b"):
        tests = "".join(f"def test_shared_{i}():\n    pass\n\n\ndef test_other_{i}():\n    pass\n\n\n" for i in (1, 2))
        (tmp_path / f"test_{module}.py").write_text(tests)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider"]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    workers: dict[str, set[str]] = defaultdict(set)
    for worker, nodeid in re.findall(r"\[(gw\d)\] \[\s*\d+%\] PASSED (\S+)", done.stdout):
        scope = "shared" if "shared" in nodeid else nodeid.split("::")[0]
        workers[scope].add(worker)
    assert set(workers) == {"shared", "test_a.py", "test_b.py"}, done.stdout
    assert all(len(w) == 1 for w in workers.values()), dict(workers)
    # Node ids are untouched (syrupy names snapshots from them).
    assert "@" not in done.stdout.split("PASSED", 1)[1].splitlines()[0]
