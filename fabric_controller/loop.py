"""The controller's loop: every `poll_s`, answer each verdict Event of the gated namespaces once, then give back the
quota of nodes an operator released (the taint removed) or that are gone (the instance replaced).

State lives in the cluster, not here: the answers are Events (a restarted controller reads them back and skips what
was answered), the nodes taken out and the quota each took are the ClusterQueue's annotation."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from fabric_controller import act
from fabric_controller.config import ControllerConfig
from fabric_controller.decide import Refuse, decide, has_gate_taint
from fabric_controller.facts import cluster_queue, gather, read_record
from training.fabric_verdict import (
    REFUSED_REASON,
    RELEASED_REASON,
    TAINT_EFFECT,
    TAINT_KEY,
    TAKEN_REASON,
    VERDICT_REASON,
    Answer,
    ReportedVerdict,
    read_answer,
    read_verdict,
    release_command,
)
from training.kube_api import KubeApi, KubeError


class Controller:
    def __init__(
        self,
        api: KubeApi,
        config: ControllerConfig,
        *,
        clock: Callable[[], float] = time.time,
        log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
    ) -> None:
        self.api, self.config, self.clock, self.log = api, config, clock, log
        self.answered: set[tuple[str, str]] | None = None

    def _events(self, namespace: str, reason: str) -> list[dict[str, Any]]:
        return self.api.list_items(f"/api/v1/namespaces/{namespace}/events", field_selector=f"reason={reason}")

    def _seed(self) -> set[tuple[str, str]]:
        """The verdict Events already answered (by this controller before a restart)."""
        answered = set()
        for namespace in self.config.namespaces:
            for reason in (TAKEN_REASON, REFUSED_REASON):
                for item in self._events(namespace, reason):
                    answer = read_answer(item)
                    if answer is not None:
                        answered.add((namespace, answer.verdict_event))
        return answered

    def tick(self) -> None:
        if self.answered is None:
            self.answered = self._seed()
        for namespace in self.config.namespaces:
            for item in self._events(namespace, VERDICT_REASON):
                claim = read_verdict(item)
                if claim is None or claim.namespace != namespace or (namespace, claim.event) in self.answered:
                    continue
                try:
                    self.handle(claim)
                except KubeError as exc:
                    self.log(f"verdict {namespace}/{claim.event}: {exc}; retried on the next poll")
                    continue
                self.answered.add((namespace, claim.event))
        self.release()

    def _answer(self, claim: ReportedVerdict, answer: Answer) -> None:
        self.api.create_event(answer.to_event(claim))
        self.log(f"verdict {claim.namespace}/{claim.event} ({claim.node}): {answer.message}")

    def handle(self, claim: ReportedVerdict) -> None:
        now = self.clock()
        facts = gather(self.api, claim, self.config, now)
        decision = decide(claim, facts, self.config)
        if isinstance(decision, Refuse):
            self._answer(claim, Answer(claim.event, False, f"not taken out: {decision.why}"))
            return
        take, queue = decision, decision.group.queue
        if take.already:
            self._answer(claim, Answer(claim.event, True, f"{claim.node} was already taken out", take.gang.uid))
            return
        act.taint(self.api, claim.node, claim.taint)
        try:
            act.move_quota(self.api, take.group, claim.node, sign=-1, entry=act.taken_entry(claim, take, now), now=now)
            quota = f"ClusterQueue {queue} lowered by one node"
        except (KubeError, ValueError) as exc:
            quota = f"ClusterQueue {queue} NOT lowered ({exc}): lower it with trainctl scale"
        done = (
            f"{claim.node} tainted {TAINT_KEY}={claim.taint}:{TAINT_EFFECT} for {take.gang.ref}; {quota}; "
            f"release after repair: {release_command(claim.node)}"
        )
        # The node's and the workload's Events carry the verdict; the answer goes to the pod that sent it.
        text = f"{done}. Verdict: {claim.message}"
        act.event(self.api, act.NODE_EVENT_NAMESPACE, act.node_ref(facts.node, claim.node), TAKEN_REASON, text)
        gang = take.gang
        involved = {"kind": gang.kind, "apiVersion": gang.api_version, "namespace": gang.namespace}
        act.event(self.api, gang.namespace, {**involved, "name": gang.name, "uid": gang.uid}, TAKEN_REASON, text)
        self._answer(claim, Answer(claim.event, True, done, gang.uid))

    def release(self) -> None:
        for group in self.config.groups.values():
            record = read_record(cluster_queue(self.api, group.queue))
            for name in record.nodes:
                node = self.api.get_or_none(f"/api/v1/nodes/{name}")
                if node is not None and has_gate_taint(node):
                    continue
                try:
                    act.move_quota(self.api, group, name, sign=+1, entry=None, now=self.clock())
                except (KubeError, ValueError) as exc:
                    self.log(f"giving back {name}'s quota to ClusterQueue {group.queue}: {exc}")
                    continue
                why = "released (the taint removed)" if node is not None else "gone (the instance was replaced)"
                text = f"{name} {why}: ClusterQueue {group.queue} raised by one node"
                self.log(text)
                if node is not None:
                    act.event(self.api, act.NODE_EVENT_NAMESPACE, act.node_ref(node, name), RELEASED_REASON, text)

    def run(self, *, ticks: int | None = None) -> None:
        done = 0
        while ticks is None or done < ticks:
            try:
                self.tick()
            except KubeError as exc:
                self.log(f"poll failed: {exc}")
            done += 1
            time.sleep(self.config.poll_s)
