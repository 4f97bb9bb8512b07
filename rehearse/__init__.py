"""`trainctl rehearse`: run Kubernetes manifests as isolated pods on this Linux machine, on CPU.

The seam shared by the CLI and the tests is `run(manifests, options) -> Rehearsal`: manifests are
parsed objects (see `load_manifests`), the result holds one outcome per workload (Job, RayJob,
RayCluster) with its pods. Where things live:
- loop.py: the run loop (`run`, `drive`) and its `Scheduler`, the controllers' PodAPI;
- controller.py: the `PodAPI` and `Controller` protocols; jobs.py (batch/v1) and kuberay.py (KubeRay v1.7.0)
  implement them;
- seams.py: `Placement`, `Admission` and `Clock`, where a cluster model plugs in (defaults: unconstrained,
  always admitted, monotonic time);
- outcome.py: `Rehearsal`, `WorkloadOutcome`, `PodOutcome`, JSON and `format_table`;
- pods.py: the process runtime (namespaces, volumes, DNS) with podinit.py inside each pod, network.py for
  addresses, network_policy.py deciding what NetworkPolicies admit and policy_routes.py enforcing it;
  fake.py: a fake runtime on a fake clock for controller unit tests.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rehearse import manifests
from rehearse.errors import RehearsalError
from rehearse.loop import run
from rehearse.network import Network
from rehearse.options import Kill, Options
from rehearse.outcome import PodOutcome, Rehearsal, WorkloadOutcome, format_table
from rehearse.platform import check_platform


def load_manifests(paths: Iterable[Path], recursive: bool = False) -> list[dict[str, Any]]:
    """Every object of the files and directories, as `kubectl apply -f` reads them (rehearse/manifests.py:
    several documents, `kind: List`, generateName), or RehearsalError naming the file."""
    try:
        return manifests.load_manifests(paths, recursive)
    except manifests.ManifestError as exc:
        raise RehearsalError(str(exc)) from exc


__all__ = [
    "Kill",
    "Network",
    "Options",
    "PodOutcome",
    "Rehearsal",
    "RehearsalError",
    "WorkloadOutcome",
    "check_platform",
    "format_table",
    "load_manifests",
    "run",
]
