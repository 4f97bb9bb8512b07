"""`--kill` and `--ranks-per-pod` as the rehearsal reads them (no pod runs: fast tier)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from rehearse import Kill, Options, RehearsalError
from rehearse.manifests import yaml_documents
from rehearse.ranks import ranks_per_pod


def test_kill_parses_a_time_into_the_run_or_a_delay_after_a_path_under_the_output_directory() -> None:
    assert Kill.parse("nvrx-fsdp-1@15") == Kill(pod="nvrx-fsdp-1", seconds=15.0)
    committed = "claims/training/checkpoints/nvrx-fsdp/step_000000002/COMMITTED"
    assert Kill.parse(f"nvrx-fsdp-0@0,after={committed}") == Kill(pod="nvrx-fsdp-0", seconds=0.0, after=Path(committed))
    for bad, problem in [
        ("nvrx-fsdp-1@5,after=/etc/passwd", "relative to the output directory"),
        ("nvrx-fsdp-1@5,after=a/../../x", "relative to the output directory"),
        ("nvrx-fsdp-1@5,after=", "POD@SECONDS"),
        ("nvrx-fsdp-1@5,before=x", "POD@SECONDS"),
        ("nvrx-fsdp-1", "POD@SECONDS"),
    ]:
        with pytest.raises(RehearsalError, match=problem):
            Kill.parse(bad)


def _objects(dist: Path, env: str, workload: str) -> list[dict[str, Any]]:
    return [o for o in yaml_documents((dist / env / f"{workload}.k8s.yaml").read_text()) if o]


def _script(obj: dict[str, Any]) -> str:
    (container,) = obj["spec"]["template"]["spec"]["containers"]
    return "\n".join(str(a) for a in [*container.get("command", []), *container.get("args", [])])


def _nprocs(job: dict[str, Any]) -> list[int]:
    return [int(n) for n in re.findall(r"--nproc-per-node=(\d+)", _script(job))]


def test_ranks_per_pod_caps_ft_launcher_and_torchrun_processes_per_pod_and_keeps_the_gpu_requests(dist: Path) -> None:
    objects = _objects(dist, "prod", "nvrx-fsdp") + _objects(dist, "prod", "fabric-ab")
    jobs = [o for o in objects if o["kind"] == "Job"]
    requests = [o["spec"]["template"]["spec"]["containers"][0]["resources"] for o in jobs]
    assert all(_nprocs(j) and min(_nprocs(j)) > 2 for j in jobs)  # one rank per GPU: 8 on p5, 4 on g6
    notes = [n for o in objects for n in ranks_per_pod(o, 2)]
    assert all(set(_nprocs(j)) == {2} for j in jobs)
    # What the scheduler sees is the chart's: the pods still ask for every GPU of their node.
    assert [o["spec"]["template"]["spec"]["containers"][0]["resources"] for o in jobs] == requests
    assert any("Job/nvrx-fsdp" in n and "--nproc-per-node 8 -> 2" in n for n in notes), notes
    # A count already at or under N is left as it is, and said nowhere.
    assert [n for o in objects for n in ranks_per_pod(o, 2)] == []


def test_ranks_per_pod_caps_the_gpus_ray_advertises_and_the_ray_train_workers_to_match(dist: Path) -> None:
    (ray_job,) = [o for o in _objects(dist, "prod", "ray-finetune") if o["kind"] == "RayJob"]
    cluster = ray_job["spec"]["rayClusterSpec"]
    (group,) = cluster["workerGroupSpecs"]
    head = copy.deepcopy(cluster["headGroupSpec"])
    assert "--num-workers 16 " in ray_job["spec"]["entrypoint"]  # 2 p5 workers x 8 GPUs
    assert group["rayStartParams"]["num-gpus"] == "8"
    notes = ranks_per_pod(ray_job, 1)
    assert group["rayStartParams"]["num-gpus"] == "1"
    assert "--num-workers 2 " in ray_job["spec"]["entrypoint"]  # one per worker pod
    assert len(notes) == 2, notes
    # The head (num-gpus 0) is left alone.
    assert cluster["headGroupSpec"] == head


@pytest.mark.parametrize("bad", [0, -1])
def test_ranks_per_pod_below_one_is_refused(bad: int) -> None:
    with pytest.raises(RehearsalError, match="ranks_per_pod"):
        Options(ranks_per_pod=bad)
