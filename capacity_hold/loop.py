"""The hold controller's loop: every `poll_s`, read each block group's ClusterQueue, decide, and write what changed.

State lives in the cluster: the ClusterQueue's stopPolicy and the controller's record (decide.py HOLD_ANNOTATION), so
a restarted controller picks up where it was. A new block's end arrives as a new config (the chart's ConfigMap,
which the kubelet refreshes in the mounted file): `run` re-reads it on every poll."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from capacity_hold import act
from capacity_hold.config import BlockGroup, ConfigError, HoldConfig
from capacity_hold.decide import Decision, QueueState, decide, iso
from training.kube_api import KubeApi, KubeError


class Controller:
    def __init__(
        self,
        api: KubeApi,
        config: HoldConfig,
        *,
        clock: Callable[[], float] = time.time,
        log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
    ) -> None:
        self.api, self.config, self.clock, self.log = api, config, clock, log
        self.said: dict[str, str] = {}

    def announce(self) -> None:
        for group in self.config.groups.values():
            self.log(
                f"group {group.name}: ClusterQueue {group.queue} holds from {iso(group.hold_at())} (block end "
                f"{group.end} - stop margin {group.stop_margin_s:g} s - {group.lead or f'lead {group.lead_s:g} s'})"
            )

    def _say(self, group: BlockGroup, line: str) -> None:
        """Logs a group's state once, not on every poll."""
        if self.said.get(group.name) != line:
            self.said[group.name] = line
            self.log(f"group {group.name}: {line}")

    def tick(self) -> list[Decision]:
        """One poll; returns the decisions written."""
        written = []
        for group in self.config.groups.values():
            try:
                queue = self.api.get_or_none(act.queue_path(group))
                if queue is None:
                    self._say(group, f"ClusterQueue {group.queue} does not exist")
                    continue
                state = QueueState.of(queue)
                decision = decide(group, state, self.clock())
                if decision.policy is None:
                    self._say(group, decision.why)
                    continue
                act.write(self.api, group, state, decision)
            except KubeError as exc:
                # A 409 (changed since read) or an unreachable API server: decided again on the next poll.
                self._say(group, f"ClusterQueue {group.queue}: {exc}; retried on the next poll")
                continue
            written.append(decision)
            self._say(group, f"stopPolicy {decision.policy}: {decision.why}")
            try:
                act.event(self.api, group, state, decision)
            except KubeError as exc:
                self.log(f"group {group.name}: the Event was not posted: {exc}")
        return written

    def reload(self, load: Callable[[], HoldConfig]) -> None:
        try:
            config = load()
        except (OSError, ValueError, ConfigError) as exc:
            self.log(f"config not reloaded, the previous one stays: {exc}")
            return
        if config != self.config:
            self.config = config
            self.announce()

    def run(self, load: Callable[[], HoldConfig] | None = None, *, ticks: int | None = None) -> None:
        self.announce()
        done = 0
        while ticks is None or done < ticks:
            if load is not None:
                self.reload(load)
            self.tick()
            done += 1
            time.sleep(self.config.poll_s)
