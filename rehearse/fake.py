"""A fake pod runtime on a fake clock: the controllers' unit tests run in milliseconds, without processes.

A pod "runs" for `Script.after_s` seconds of fake time once launched and then "exits" with the scripted exit
code of each container (and reason/message: e.g. StartError 128). Scripts are looked up by the pod's hostname
or name prefix, one per attempt (the last one repeats), so a test can say "index 1 fails twice, then succeeds".
What only processes show (isolation, DNS, signals, kills of real process trees) is tested on the real
runtime (pods.py) instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rehearse.options import Options
from rehearse.outcome import Rehearsal
from rehearse.pods import Pod, PodPlan, finish_statuses, sidecar_names


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


@dataclass(frozen=True, kw_only=True)
class Script:
    """How one attempt of a pod ends: every main container exits `code` (or per container, `codes`)."""

    code: int = 0
    after_s: float = 1.0
    codes: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)
    # Init containers that never finish (e.g. a blocking init that waits forever) keep the pod initializing.
    never_ends: bool = False


Dashboard = Callable[[Pod, str, float], dict[str, Any] | None]


class FakeRuntime:
    def __init__(
        self,
        scripts: Mapping[str, Sequence[Script]] | None = None,
        *,
        clock: FakeClock | None = None,
        dashboard: Dashboard | None = None,
    ) -> None:
        self.clock = clock or FakeClock()
        self.pods: dict[str, Pod] = {}
        self.services: list[dict[str, Any]] = []
        self.scripts = scripts or {}
        self.dashboard = dashboard
        self.attempts: dict[str, int] = {}
        self._ends: dict[str, tuple[float, Script]] = {}
        self._next_address = 1

    def _script(self, plan: PodPlan) -> Script:
        for prefix in sorted(self.scripts, key=len, reverse=True):
            if plan.pod_hostname.startswith(prefix) or plan.name.startswith(prefix):
                attempt = self.attempts.get(prefix, 0)
                self.attempts[prefix] = attempt + 1
                sequence = self.scripts[prefix]
                return sequence[min(attempt, len(sequence) - 1)]
        # Unscripted: a pod that restarts its containers forever (a Ray node) runs until deleted.
        return Script(after_s=float("inf") if plan.spec.get("restartPolicy") == "Always" else 1.0)

    def create(self, plan: PodPlan) -> Pod:
        pod = Pod(plan=plan, directory=Path("/nonexistent/fake") / plan.name, started=self.clock.now(), images=["fake"])
        self.pods[plan.name] = pod
        return pod

    def launch(self, pod: Pod, node: str | None = None) -> None:
        pod.address = f"10.0.0.{self._next_address}"
        self._next_address += 1
        pod.launched, pod.phase, pod.node, pod.pending_reason = self.clock.now(), "Running", node, ""
        script = self._script(pod.plan)
        spec = pod.plan.spec
        sidecars = sidecar_names(spec)
        for c in spec.get("initContainers", []):
            pod.exit_codes[c["name"]] = None if c["name"] in sidecars or script.never_ends else 0
        for c in spec["containers"]:
            pod.exit_codes[c["name"]] = None
        if not script.never_ends:
            self._ends[pod.name] = (self.clock.now() + script.after_s, script)

    def poll(self) -> list[Pod]:
        ended = []
        for name, (at, script) in list(self._ends.items()):
            pod = self.pods[name]
            if at > self.clock.now() or not pod.running:
                continue
            del self._ends[name]
            for c in pod.plan.spec["containers"]:
                pod.exit_codes[c["name"]] = script.codes.get(c["name"], script.code)
            for c in pod.plan.spec.get("initContainers", []):
                if c["name"] in sidecar_names(pod.plan.spec):
                    pod.exit_codes[c["name"]] = 143
            for cname, code in pod.exit_codes.items():
                if code is not None:
                    pod.reasons[cname] = "Completed" if code == 0 else "Error"
            pod.reasons.update(script.reasons)
            pod.messages.update(script.messages)
            pod.ended = self.clock.now()
            finish_statuses(pod, killed=False)
            ended.append(pod)
        return ended

    def kill(self, pod: Pod, *, disruption: str | None = None) -> None:
        if not pod.running:
            return
        if disruption:
            pod.conditions.append({"type": "DisruptionTarget", "status": "True", "reason": disruption})
        self._ends.pop(pod.name, None)
        pod.ended = self.clock.now()
        if pod.launched is None:
            pod.phase = "Failed" if disruption else "Pending"
            return
        finish_statuses(pod, killed=True)

    def lose(self, pod: Pod) -> None:
        """Its node is gone: the pod never ends on its own; only its eviction (`kill`) ends it."""
        if pod.running and pod.launched is not None:
            self._ends.pop(pod.name, None)
            pod.node_lost = True

    def refresh(self, pod: Pod) -> None:
        return None

    def dashboard_get(self, head: Pod, path: str) -> dict[str, Any] | None:
        return self.dashboard(head, path, self.clock.now()) if self.dashboard else None


def rehearse_fake(
    manifests: Sequence[dict[str, Any]],
    runtime: FakeRuntime | None = None,
    **options: Any,
) -> Rehearsal:
    """The run loop (loop.drive) over a FakeRuntime: the same controllers and verdicts, in fake time."""
    from rehearse.loop import drive, prepare

    runtime = runtime or FakeRuntime()
    options.setdefault("backoff_base_s", 0.0)
    options.setdefault("timeout_s", 600.0)
    opts = Options(clock=runtime.clock, **options)
    prepared = prepare(manifests, opts)
    return drive(
        prepared.controllers,
        runtime,
        opts,
        output_dir=Path("/nonexistent/fake"),
        network="fake",
        notes=prepared.notes,
        pod_admission=prepared.pod_admission,
    )
