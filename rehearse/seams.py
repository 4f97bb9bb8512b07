"""The two seams through which a cluster model decides where and when the rehearsal's pods run.

The run loop (rehearse/loop.py) asks, and never decides itself:
- `Admission`, before a workload's pods are created: is the workload admitted? (Kueue's role: quota,
  queues.) Default `AlwaysAdmit`. The loop tells it when a pod becomes ready, ends, and when a workload
  finishes, and asks it each tick for `evictions()`: a workload evicted there is suspended (its pods
  deleted, not counted as failures, as the Job controller does for `suspend: true`) and asked for
  admission again, so an emulator can requeue it.
- `Placement`, before each pod starts: which node? (kube-scheduler's role: filters, capacity.) Default
  `Unconstrained` (node None: any pod runs on this machine). `Pending(reason)` leaves the pod Pending with
  that reason (it counts as active for its Job, as a Pending pod does on a cluster) and the loop asks again
  on every tick until it is placed or deleted; `release` is called when a placed pod ends or is deleted.

`NodeLoss` (optional, a Placement may also be one): nodes that go away during the run. The loop asks it each
tick which placed pods lost their node (their processes die at once, the pods stay until evicted) and which
of them to evict now, with the DisruptionTarget reason (rehearse/cluster/placement.py: taint-based eviction).

`ApiServer` (optional): a Kubernetes API the pods reach (rehearse/cluster/apiserver.py, with --env). The run
starts it on the run's network, each pod's environment gets what `pod_env` gives (its address and the pod's
token), and the loop stops the run (exit 2) as soon as `unemulated` names a request it could not emulate.

`Clock` is the time every controller and the loop read: `MonotonicClock` for real runs, a fake clock
(rehearse/fake.py) for controller unit tests that run in milliseconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from pathlib import Path

    from rehearse.controller import Controller
    from rehearse.network import Network
    from rehearse.pods import Pod, PodPlan


class Clock(Protocol):
    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@dataclass(frozen=True)
class Pending:
    """Not now, and why (the pod's or the workload's Pending reason, shown in the report)."""

    reason: str


@dataclass(frozen=True, kw_only=True)
class WorkloadRef:
    """A workload as the seams see it: its kind, name, namespace and the manifest as applied."""

    kind: str
    name: str
    namespace: str
    obj: dict[str, Any] = field(compare=False, hash=False, repr=False)

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"


class Placement(Protocol):
    def place(self, plan: PodPlan) -> str | Pending | None:
        """The node the pod is bound to (None: unconstrained), or Pending(reason)."""
        ...

    def release(self, pod: Pod) -> None:
        """The pod (placed on `pod.node`) ended or was deleted: what it held is free again."""
        ...


class Unconstrained:
    """Every pod runs on this machine, on no particular node."""

    def place(self, plan: PodPlan) -> str | Pending | None:
        return None

    def release(self, pod: Pod) -> None:
        return None


@runtime_checkable
class NodeLoss(Protocol):
    def node_lost_pods(self, now: float) -> list[str]:
        """Names of placed pods whose node was lost by `now` (each reported once)."""
        ...

    def node_evictions(self, now: float) -> list[tuple[str, str]]:
        """(pod name, DisruptionTarget reason) of the pods to delete now (each reported once)."""
        ...

    def arm(self, exists: Callable[[Path], bool], now: float) -> None:
        """Starts the clock of each node loss waiting for a path (relative to the output directory) that now exists."""
        ...


class Admission(Protocol):
    def admit(self, workload: WorkloadRef) -> bool | Pending:
        """True: create its pods now; Pending(reason) (or False): ask again next tick."""
        ...

    def pod_ready(self, workload: WorkloadRef, pod: Pod) -> None:
        """A pod of the workload started running (its containers were started)."""
        ...

    def pod_ended(self, workload: WorkloadRef, pod: Pod) -> None:
        """A pod of the workload ended (`pod.phase` Succeeded or Failed) or was deleted."""
        ...

    def workload_finished(self, workload: WorkloadRef, state: str) -> None:
        """The workload reached its final state (Complete, Failed, Ready, ...): its quota is free."""
        ...

    def evictions(self) -> list[tuple[WorkloadRef, str]]:
        """Admitted workloads to suspend now, each with the reason (e.g. PodsReady timeout, preemption)."""
        ...


class AlwaysAdmit:
    def admit(self, workload: WorkloadRef) -> bool | Pending:
        return True

    def pod_ready(self, workload: WorkloadRef, pod: Pod) -> None:
        return None

    def pod_ended(self, workload: WorkloadRef, pod: Pod) -> None:
        return None

    def workload_finished(self, workload: WorkloadRef, state: str) -> None:
        return None

    def evictions(self) -> list[tuple[WorkloadRef, str]]:
        return []


class ApiServer(Protocol):
    def start(self, network: Network) -> None: ...

    def attach(self, controllers: Iterable[Controller], pods: Mapping[str, Pod]) -> None:
        """The run's workloads and pods, which the API serves while the run goes on."""
        ...

    def pod_env(self, plan: PodPlan) -> dict[str, str]:
        """Environment variables of the pod's containers (the API's address, the pod's token)."""
        ...

    def unemulated(self) -> str | None:
        """The first request it could not emulate, if any."""
        ...

    def close(self) -> None: ...
