"""Process reaping inside a pod (finding 1 of issue 27): healthy sub-second pods are never reported Failed.

The docs' Indexed Job example (kubernetes.io tasks/job/indexed-parallel-processing-static: an init container
writes the item of its index to an emptyDir with a bash one-liner, the main container reads it) completes on a
cluster; with `backoffLimit: 0` a single spurious pod failure would fail it. Own fixture, same shape: 12
completions, 4 at a time, an init container that exits within a millisecond (before `Popen` even returns), each
pod well under a second.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.rehearse.test_harness import job, rehearse

pytestmark = [pytest.mark.rehearsal, pytest.mark.usefixtures("namespaces")]

# Each container also starts a short-lived grandchild that it leaves behind: an orphan the pod's PID 1
# inherits and must reap without confusing it with its own containers.
SCRIPT = """
    import os, subprocess, sys
    subprocess.Popen([sys.executable, "-c", "pass"])
    print(open("/input/data.txt").read())
"""


def fast_init_job() -> dict[str, Any]:
    obj = job("many", SCRIPT, completions=12, parallelism=4, indexed=True, backoff_limit=0)
    pod = obj["spec"]["template"]["spec"]
    pod["volumes"] = [{"name": "input", "emptyDir": {}}]
    pod["initContainers"] = [
        {
            "name": "input",
            "image": "example.invalid/bash:1",
            "command": ["/bin/sh", "-c", "echo item-$JOB_COMPLETION_INDEX > /input/data.txt"],
            "volumeMounts": [{"name": "input", "mountPath": "/input"}],
        }
    ]
    pod["containers"][0]["volumeMounts"] = [{"name": "input", "mountPath": "/input"}]
    return obj


def test_an_indexed_job_of_many_sub_second_pods_with_backoff_limit_0_completes_every_time(tmp_path: Path) -> None:
    verdicts = []
    for attempt in range(5):
        result = rehearse(
            tmp_path / str(attempt),
            fast_init_job(),
            timeout_s=120.0,
        )
        w = result.workload("many")
        verdicts.append((w.state, w.message, [p.exit_codes for p in w.pods if p.phase != "Succeeded"]))
    assert all(state == "Complete" for state, _, _ in verdicts), verdicts
