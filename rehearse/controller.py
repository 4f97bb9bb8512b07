"""What a controller sees of the cluster (`PodAPI`) and what the run loop sees of a controller (`Controller`).

Controllers (jobs.py, kuberay.py, barepod.py) create and delete pods only through a `PodAPI`: the run loop's
scheduler (placement seam, rehearse/seams.py) over the process runtime (pods.py) in a real rehearsal, or
over the fake runtime (fake.py) in the controllers' unit tests. They read time only through `api.now()`.
"""

from __future__ import annotations

from typing import Any, Protocol

from rehearse.pods import Pod, PodPlan


class PodAPI(Protocol):
    def now(self) -> float: ...

    def start(self, plan: PodPlan) -> Pod:
        """Creates the pod; it runs as soon as it is placed (it may stay Pending)."""
        ...

    def add_service(self, service: dict[str, Any]) -> None:
        """A Service a controller creates while the run goes on (a retried RayJob's new head Service)."""
        ...

    def kill(self, pod: Pod, *, disruption: str | None = None) -> None:
        """Deletes the pod (SIGKILL of every process); `disruption`: the DisruptionTarget reason it gets."""
        ...

    def refresh(self, pod: Pod) -> None:
        """Re-reads a running pod's container statuses (restarts, exit codes)."""
        ...

    def dashboard_get(self, head: Pod, path: str) -> dict[str, Any] | None:
        """GET a Ray head pod's dashboard API (None when it does not answer)."""
        ...


class Controller(Protocol):
    kind: str
    name: str
    namespace: str
    obj: dict[str, Any]
    pods: list[Pod]
    notes: list[str]
    started: float
    finished: float | None
    # A long-lived workload (a RayCluster, a bare Pod with restartPolicy Always) has no end of its own: the
    # loop stops it when the run ends (see loop.py).
    long_lived: bool
    # status.conditions as the real controller writes them (empty where it writes none the report uses).
    conditions: list[dict[str, str]]

    def status_fields(self) -> dict[str, str]:
        """The status fields the report shows (e.g. a Job's completedIndexes, a RayJob's jobStatus)."""
        ...

    @property
    def done(self) -> bool: ...

    def start(self, api: PodAPI) -> None: ...

    def on_pod_end(self, api: PodAPI, pod: Pod) -> None: ...

    def tick(self, api: PodAPI) -> None: ...

    def suspend(self, api: PodAPI, reason: str) -> None:
        """Evicted by the admission seam: delete the pods (not counted as failures) until started again."""
        ...

    def stop(self, api: PodAPI, reason: str) -> None:
        """The run ended while this long-lived workload still ran: delete its pods, keep its state."""
        ...

    def state(self) -> tuple[str, str]: ...
