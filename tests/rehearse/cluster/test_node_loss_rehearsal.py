"""The NVRx job on prod's cluster with a node lost under each of its pods (issue 22 #7: `--kill-node`, here as
NodeKill after the step-2 checkpoint is committed on the claim), on three g6 nodes (the third stands in for the
instance the Auto Scaling group would bring: node replacement is not modelled), at time scale 20: the eviction
comes 17.5 s of wall time after the loss.

A lost node is unreachable, not deleted: its pods' processes die at once, the pods stay bound until taint-based
eviction deletes them 50 + 300 cluster seconds later with DisruptionTarget (DeletionByTaintManager), which the Job's
Ignore rule does not count, and their replacements cannot use the node (its unreachable taint). The training
processes run in wall time: the survivors' rendezvous (read_timeout 900 s) outlasts those 350 s in any case.
Kueue's recovery timeout (31 cluster minutes, 93 s of wall time here) must outlast the replacement pod's start.
CI does not run these (tests/tiers.py CI_REHEARSALS): the controller side is tests/rehearse/cluster/test_cluster_loop.py
on the fake runtime, the processes' side the README's pod-loss rehearsal (tests/rehearse/test_input_runs.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from k8s.check_lock import check_lock
from k8s.images import ImageLock
from rehearse import Options, Rehearsal
from rehearse.cluster.placement import NodeKill
from rehearse.cluster.session import run_on_environment
from tests.image_envs import image_pythons
from tests.rehearse.test_workloads import nvrx_job, nvrx_manifests, trainer_logs

pytestmark = [pytest.mark.rehearsal, pytest.mark.usefixtures("namespaces")]
COMMITTED = Path("claims/training/checkpoints/nvrx-fsdp/step_000000002/COMMITTED")
TAINT_EVICTION = {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}


def lose_node_under(tmp_path: Path, tiny_model: Path, lock: ImageLock, alias: str) -> Rehearsal:
    job = nvrx_job(tiny_model, gpu_group="g6")
    options = Options(
        output_dir=tmp_path / "out",
        host_paths=(tiny_model,),
        backoff_base_s=1.0,
        timeout_s=12000.0,  # cluster seconds: 10 wall minutes at scale 20, a hang guard
        image_python=image_pythons(check_lock(ImageLock.load())),
        ranks_per_pod=1,
    )
    return run_on_environment(
        nvrx_manifests("prod", job, lock),
        options,
        environment="prod",
        gpu_nodes={"g6": 3},
        time_scale=20.0,
        node_kills=(NodeKill(node=alias, seconds=0, after=COMMITTED),),
    )


def counted(pods: list[Any]) -> list[Any]:
    return [p for p in pods if p.phase == "Failed" and not any(c["type"] == "DisruptionTarget" for c in p.conditions)]


def loss_time(result: Rehearsal, pod: str) -> float:
    (note,) = [n for n in result.notes if n.startswith(f"pod {pod}: node ") and " lost at " in n]
    return float(note.rsplit(" lost at ", 1)[1].removesuffix(" s"))


def nodes_by_alias(result: Rehearsal) -> dict[str, dict[str, Any]]:
    assert result.cluster is not None
    return {n["alias"]: n for n in result.cluster["nodes"]}


def completed_after_the_loss(result: Rehearsal, alias: str) -> tuple[Any, dict[str, dict[str, Any]], str]:
    """The job completed, the node stayed lost, and Kueue never requeued it (recovered within its recoveryTimeout,
    31 min): the job's outcome, the nodes by alias and the trainers' logs."""
    nvrx = result.workload("nvrx-fsdp")
    logs = trainer_logs(result)
    assert nvrx.state == "Complete", f"{nvrx.state} {nvrx.message} {result.notes}\n{logs}"
    nodes = nodes_by_alias(result)
    assert nodes[alias]["ready"] is False
    assert nvrx.admission is not None
    assert nvrx.admission["requeues"] == []
    return nvrx, nodes, logs


def evicted_after_the_toleration(result: Rehearsal, pod: Any) -> None:
    """Evicted 50 + 300 cluster seconds after the loss (its processes had died at the loss), with DisruptionTarget."""
    assert pod.conditions == [TAINT_EVICTION]
    assert pod.end_s is not None
    assert pod.end_s - loss_time(result, pod.name) == pytest.approx(350, abs=20)  # a loop tick at scale 20


def test_losing_pod_1s_node_evicts_it_uncounted_and_the_job_completes_on_the_spare_node(
    tmp_path: Path, tiny_model: Path, lock: ImageLock
) -> None:
    result = lose_node_under(tmp_path, tiny_model, lock, "g6-1")
    nvrx, nodes, logs = completed_after_the_loss(result, "g6-1")
    assert [(p.hostname, p.node) for p in nvrx.pods[:2]] == [
        ("nvrx-fsdp-0", nodes["g6-0"]["name"]),
        ("nvrx-fsdp-1", nodes["g6-1"]["name"]),
    ], logs
    lost, replacement = nvrx.pods[1], nvrx.pods[2]
    evicted_after_the_toleration(result, lost)
    assert (replacement.hostname, replacement.node) == ("nvrx-fsdp-1", nodes["g6-2"]["name"])
    assert counted(nvrx.pods) == []


def test_losing_pod_0s_node_costs_one_counted_failure_and_the_job_completes_on_the_spare_node(
    tmp_path: Path, tiny_model: Path, lock: ImageLock
) -> None:
    result = lose_node_under(tmp_path, tiny_model, lock, "g6-0")
    nvrx, nodes, logs = completed_after_the_loss(result, "g6-0")
    lost = nvrx.pods[0]
    assert (lost.hostname, lost.node) == ("nvrx-fsdp-0", nodes["g6-0"]["name"])
    evicted_after_the_toleration(result, lost)
    # Pod 0 hosted the c10d store: pod 1's launcher failed on a healthy node, which the Job counts; the Job's
    # backoffLimit ((nodes - 1) x 2) absorbs it.
    (failed,) = counted(nvrx.pods)
    assert failed.hostname == "nvrx-fsdp-1", logs
    replacements = [p for p in nvrx.pods if p.hostname == "nvrx-fsdp-0"][1:]
    assert [p.node for p in replacements] == [nodes["g6-2"]["name"]], [(p.name, p.node) for p in nvrx.pods]
