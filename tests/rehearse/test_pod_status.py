"""A pod's status as the runtime reads it from podinit's status.json, which podinit rewrites in place."""

from __future__ import annotations

import json
from pathlib import Path

from rehearse.pods import Pod, PodPlan


def test_a_torn_read_of_the_status_file_keeps_the_last_whole_status(tmp_path: Path) -> None:
    plan = PodPlan(name="p", namespace="t", spec={"containers": [{"name": "main"}]}, workload="Job/p")
    pod = Pod(plan=plan, directory=tmp_path, started=0.0, images=[])
    status = {"init": {}, "containers": {"main": {"restarts": 3, "exit_code": 5, "reason": "Error"}}}
    (tmp_path / "status.json").write_text(json.dumps(status))
    pod.refresh()
    assert (pod.restarts, pod.exit_codes["main"]) == (3, 5)
    for torn in ("", json.dumps(status)[:20]):  # between podinit's truncate and write, and during the write
        (tmp_path / "status.json").write_text(torn)
        pod.refresh()
        assert (pod.restarts, pod.exit_codes["main"], pod.reasons["main"]) == (3, 5, "Error"), torn
