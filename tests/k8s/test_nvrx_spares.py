"""Hot spares of the NVRx job (NvrxFsdpJob.spares): the chart's Job, ft_launcher's --nnodes and the pods' infrastructure
rank. What the spares do with real processes is tests/training/test_nvrx_spares.py."""

from __future__ import annotations

import shlex
import stat
import subprocess
from pathlib import Path
from typing import Any

import cdk8s
import pytest
from nvidia_resiliency_ext.fault_tolerance.launcher import get_args_parser, parse_min_max_nnodes

from infra.spec import ENVIRONMENTS
from k8s.charts.nvrx_job import NvrxJobChart
from k8s.check_lock import check_lock
from k8s.images import ImageLock
from k8s.nvrx_spec import INFRA_RANK_ENV, NVRX_IMAGE, NvrxFsdpJob
from k8s.ray_spec import WorkloadError

# Hot spares need NVRx 0.7.0's barrier rendezvous (k8s/nvrx_spec.py SPARES_MIN_NVRX).
LOCK = check_lock(ImageLock.load()).with_digest(NVRX_IMAGE, "sha256:" + "0" * 64)
SUPERVISOR = ["python", "-m", "training.fabric_gate", "supervise", "--"]


def _chart(env: str, job: NvrxFsdpJob) -> tuple[NvrxJobChart, dict[str, Any]]:
    chart = NvrxJobChart(cdk8s.Testing.app(), "n", environment=ENVIRONMENTS[env], lock=LOCK, job=job)
    (spec,) = [o["spec"] for o in cdk8s.Testing.synth(chart) if o["kind"] == "Job"]
    return chart, spec


def _launcher_args(chart: NvrxJobChart) -> Any:
    (line,) = [line for line in chart.script.splitlines() if line.startswith("exec ")]
    argv = shlex.split(line.removeprefix("exec ").replace("$is_host", "0"))
    assert argv[: len(SUPERVISOR)] == SUPERVISOR, "every pod, the standbys too, runs under the fabric gate"
    argv = argv[len(SUPERVISOR) :]
    assert argv[0] == "ft_launcher"
    # --ft-restart-policy goes with NVRx 0.7.0 (only any-failed is left, and it is the default); not this test's flag.
    return get_args_parser().parse_args([a for a in argv[1:] if not a.startswith("--ft-restart-policy")])


def test_without_spares_the_job_is_as_before() -> None:
    chart, spec = _chart("prod", NvrxFsdpJob())
    assert (chart.nodes, chart.pods) == (2, 2)
    assert spec["completions"] == spec["parallelism"] == 2
    assert "successPolicy" not in spec
    assert _launcher_args(chart).nnodes == "2"
    assert INFRA_RANK_ENV not in chart.script


def test_a_spare_adds_a_standby_pod_and_a_min_max_rendezvous() -> None:
    chart, spec = _chart("prod", NvrxFsdpJob(spares=1))
    assert (chart.nodes, chart.pods) == (2, 3)
    # The Job (and so Kueue's Workload, whose PodSet count is the parallelism) covers the active pods and the spare.
    assert spec["completions"] == spec["parallelism"] == 3
    args = _launcher_args(chart)
    assert parse_min_max_nnodes(args.nnodes) == (2, 3)
    assert args.nproc_per_node == "8"
    # Each lost pod 0 costs a counted failure on every other pod, standbys included (store_host_losses = 2).
    assert spec["backoffLimit"] == (3 - 1) * 2
    # The preconditions wait for every pod's marker in the checkpoint directory, the standby's too.
    assert "--peers 3" in chart.script


def test_with_spares_the_job_completes_when_pod_0_succeeds() -> None:
    _, spec = _chart("prod", NvrxFsdpJob(spares=1))
    assert spec["successPolicy"] == {"rules": [{"succeededIndexes": "0"}]}


def test_each_pod_pins_its_infrastructure_rank_to_its_index(tmp_path: Path) -> None:
    chart, _ = _chart("prod", NvrxFsdpJob(spares=1))
    stubs = tmp_path / "bin"
    stubs.mkdir()
    python = '[ "$1 $2 $3 $4" = "-m training.fabric_gate supervise --" ] && { shift 4; exec "$@"; }; exit 0'
    launcher = f'echo "{INFRA_RANK_ENV}=${INFRA_RANK_ENV}"'
    for name, body in (("python", python), ("mkdir", "exit 0"), ("ft_launcher", launcher)):
        path = stubs / name
        path.write_text(f"#!/bin/bash\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    for index in ("0", "1", "2"):
        env = {"PATH": f"{stubs}:/usr/bin:/bin", "JOB_COMPLETION_INDEX": index, "JOB_UID": "u-1"}
        done = subprocess.run(["/bin/bash", "-c", chart.script], env=env, capture_output=True, text=True, check=True)
        assert done.stdout.strip() == f"{INFRA_RANK_ENV}={index}"


@pytest.mark.parametrize(
    ("env", "job", "message"),
    [
        (
            "prod",
            lambda: NvrxFsdpJob(spares=3),
            r"nvrx.spares=3 must be 0 \(no hot spares\) to 2 .*nvrx.nodes=2",
        ),
        # prod's p5 group holds 8: 7 active + 1 spare + the fabric gate's node to re-place onto is 9.
        (
            "prod",
            lambda: NvrxFsdpJob(nodes=7, spares=1),
            r"nvrx.spares=1 with nvrx.nodes=7 needs 9 nodes of GPU group 'p5' \(7 active \+ 1 hot spare\(s\) \+ 1 "
            r"for the fabric gate.*max_size 8\); lower spares or nodes, or raise the group's max_size",
        ),
        # dev's g6 group holds 3: the gang of 2 and the gate's spare, no room for a hot spare.
        ("dev", lambda: NvrxFsdpJob(spares=1), r"needs 4 nodes of GPU group 'g6'.*max_size 3"),
    ],
)
def test_spares_that_do_not_fit_are_refused_with_the_fix(env: str, job: Any, message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        _chart(env, job())


@pytest.mark.parametrize(
    ("spares", "nodes", "message"),
    [
        (-1, None, r"nvrx.spares=-1 must be 0 \(no hot spares\) to 4 \(at most 4: .*use 0 to turn hot spares off"),
        (5, None, r"nvrx.spares=5 must be 0 \(no hot spares\) to 4"),
        (3, 2, r"nvrx.spares=3 must be 0 \(no hot spares\) to 2 \(at most 4 and at most nvrx.nodes=2"),
    ],
)
def test_a_bad_spares_count_is_refused_naming_field_value_and_fix(spares: int, nodes: int | None, message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        NvrxFsdpJob(spares=spares, nodes=nodes)


def test_spares_on_an_nvrx_without_standbys_are_refused() -> None:
    with pytest.raises(
        WorkloadError,
        match=r"nvrx.spares=1 needs nvidia-resiliency-ext 0.7.0 or later in nvrx.pip "
        r"\(pinned: 0.4.1\).*use spares=0",
    ):
        NvrxFsdpJob(spares=1, pip=("nvidia-resiliency-ext==0.4.1",))
