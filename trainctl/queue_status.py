"""`trainctl status`'s GPU queue rows: each group's Kueue quota beside the nodes that can run its pods.

The ClusterQueues are found by the labels k8s/queueing.py puts on them (app.kubernetes.io/managed-by=
ml-platform, platform/environment=<env>), so this works with --kubeconfig too; the nodes are counted as
`trainctl scale` counts them (Ready, GPUs and EFA interfaces advertised, device plugins Ready). Where
the two differ, the row says what it costs and the command that closes the gap (trainctl/queue_quota.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from capacity_hold.config import CONFIG_MAP, BlockGroup, HoldConfig
from capacity_hold.config import ConfigError as HoldConfigError
from capacity_hold.decide import HoldRecord, QueueState, iso
from infra.spec import ConfigError, get_environment
from infra.spec.namespaces import CAPACITY_HOLD_SYSTEM
from k8s.capacity_deadline import on_block
from k8s.queueing import cluster_queue_name, gpu_flavor_name, quota_nodes
from trainctl import queue_quota
from trainctl.kube import api_errors
from trainctl.node_readiness import NODEGROUP_LABEL, expectation, survey
from trainctl.output import table
from trainctl.scale import nodegroup_name
from training.fabric_verdict import TAKEN_ANNOTATION, release_command

PLATFORM_SELECTOR = "app.kubernetes.io/managed-by=ml-platform"
HOLD_CONFIG_PATH = f"/api/v1/namespaces/{CAPACITY_HOLD_SYSTEM.name}/configmaps/{CONFIG_MAP}"
ENVIRONMENT_LABEL = "platform/environment"


@dataclass(frozen=True)
class GroupQueue:
    environment: str
    group: str
    queue: str
    quota_nodes: int | None
    usable_nodes: int
    registered_nodes: int
    difference: str | None
    taken_out: tuple[str, ...] = field(default=())
    """Nodes the fabric gate's controller took out of this queue's quota (its annotation, fabric_controller/)."""
    stop_policy: str = "None"
    hold: HoldRecord | None = None
    """The hold controller's record (capacity_hold/): the block it holds this queue for; None: it did not hold it."""
    on_block: bool = False
    """The group is on a Capacity Block in this checkout's spec."""
    block: BlockGroup | None = None
    """The group's block as the hold controller is deployed with it (its ConfigMap); None: none deployed."""

    def to_json(self) -> dict[str, Any]:
        return {
            "environment": self.environment,
            "group": self.group,
            "cluster_queue": self.queue,
            "quota_nodes": self.quota_nodes,
            "usable_nodes": self.usable_nodes,
            "registered_nodes": self.registered_nodes,
            "difference": self.difference,
            "taken_out": [{"node": n, "release": release_command(n)} for n in self.taken_out],
            "stop_policy": {
                "policy": self.stop_policy,
                "held_for_block_ending": None if self.hold is None else self.hold.end,
            },
            "capacity_block": None
            if self.block is None
            else {"ends": self.block.end, "admits_until": self.admits_until},
        }

    @property
    def admits_until(self) -> str | None:
        return None if self.block is None else iso(self.block.hold_at())


def taken_out(queue: dict[str, Any]) -> tuple[str, ...]:
    """The nodes the fabric gate's controller recorded on a ClusterQueue (an unreadable record shows as none)."""
    text = ((queue.get("metadata") or {}).get("annotations") or {}).get(TAKEN_ANNOTATION)
    try:
        return tuple(sorted((json.loads(text) or {}).get("nodes") or {})) if text else ()
    except (ValueError, AttributeError):
        return ()


def list_group_queues(api: Any, *, timeout: float) -> list[GroupQueue] | None:
    """One row per GPU group whose ClusterQueue the platform applied; None where Kueue is not installed
    (KubeError: the API could not be asked)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    with api_errors("list clusterqueues.kueue.x-k8s.io"):
        try:
            listed = client.CustomObjectsApi(api).list_cluster_custom_object(
                queue_quota.GROUP,
                queue_quota.VERSION,
                queue_quota.PLURAL,
                label_selector=PLATFORM_SELECTOR,
                _request_timeout=timeout,
            )
        except ApiException as exc:
            if exc.status == 404:  # no Kueue CRDs: the environment runs without Kueue
                return None
            raise
    queues = {q["metadata"]["name"]: q for q in listed.get("items") or [] if isinstance(q, dict)}
    names = {str((q["metadata"].get("labels") or {}).get(ENVIRONMENT_LABEL, "")) for q in queues.values()}
    blocks = deployed_blocks(api, timeout=timeout)
    rows: list[GroupQueue] = []
    for name in sorted(names):
        try:
            env = get_environment(name)
        except ConfigError:
            continue  # not one of this checkout's environments
        for group in env.gpu_node_groups:
            queue = queues.get(cluster_queue_name(group.name))
            if queue is None:
                quota = queue_quota.QueueQuota(cluster_queue_name(group.name), None, "its ClusterQueue is missing")
            else:
                gpus = queue_quota.gpu_quota_text(queue, gpu_flavor_name(group.name))
                nodes = quota_nodes(group, int(gpus)) if gpus is not None and gpus.isdigit() else None
                quota = queue_quota.QueueQuota(queue["metadata"]["name"], nodes, f"no GPU quota ({gpus})")
            report = survey(
                api,
                f"{NODEGROUP_LABEL}={nodegroup_name(env, group)}",
                expectation(env, group, 0),
                timeout=timeout,
            )
            usable, registered = len(report.usable), len(report.nodes)
            difference = queue_quota.difference(env, group, quota, usable, registered)
            taken = taken_out(queue) if queue is not None else ()
            state = QueueState.of(queue) if queue is not None else None
            rows.append(
                GroupQueue(
                    env.name,
                    group.name,
                    quota.queue,
                    quota.nodes,
                    usable,
                    registered,
                    difference,
                    taken,
                    stop_policy=state.stop_policy if state is not None else "None",
                    hold=state.record if state is not None else None,
                    on_block=on_block(group),
                    block=blocks.get(group.name),
                )
            )
    return rows


def render(rows: list[GroupQueue]) -> list[str]:
    if not rows:
        return []
    cells = [
        [r.group, r.queue, "-" if r.quota_nodes is None else str(r.quota_nodes), str(r.usable_nodes)] for r in rows
    ]
    for cell, row in zip(cells, rows, strict=True):
        cell += [str(row.registered_nodes), "yes" if row.difference is None else "NO (see the warning)"]
    lines = [
        "GPU queues (Kueue quota in whole nodes, beside the nodes that can run its pods):",
        table(["GROUP", "CLUSTERQUEUE", "QUOTA", "USABLE", "REGISTERED", "MATCH"], cells),
    ]
    blocks = [[r.group, r.queue, r.block.end, "held" if r.hold else str(r.admits_until)] for r in rows if r.block]
    if blocks:
        lines += [
            "",
            "Capacity Block queues (Kueue admits until a job could no longer reach its first checkpoint):",
            table(["GROUP", "CLUSTERQUEUE", "BLOCK ENDS", "ADMITS UNTIL"], blocks),
        ]
    held = [r for r in rows if r.stop_policy != "None"]
    if held:
        lines += [
            "",
            "Queues that admit no new workload (Kueue stopPolicy):",
            table(
                ["GROUP", "CLUSTERQUEUE", "POLICY", "WHY"],
                [[r.group, r.queue, r.stop_policy, _why_held(r)] for r in held],
            ),
        ]
    taken = [[r.group, n, release_command(n)] for r in rows for n in r.taken_out]
    if taken:
        lines += [
            "",
            "Quota the fabric gate's controller took out with a node (given back once the node is released):",
            table(["GROUP", "NODE", "RELEASE AFTER REPAIR"], taken),
        ]
    return lines


def _why_held(row: GroupQueue) -> str:
    lift = f'kubectl patch clusterqueue {row.queue} --type merge -p \'{{"spec":{{"stopPolicy":"None"}}}}\''
    if row.hold is not None and row.on_block:
        return f"the Capacity Block ends {row.hold.end} (held from {row.hold.hold_at}): deploy the next block's end"
    if row.hold is not None:
        return (
            f"held for the Capacity Block that ended {row.hold.end}, but the group is no longer on a block: delete "
            f"namespace capacity-hold-system, then {lift}"
        )
    return f"set by someone else; to admit again: {lift}"


def deployed_blocks(api: Any, *, timeout: float) -> dict[str, BlockGroup]:
    """The block groups of the hold controller's deployed config; none where it is not deployed, or this identity may
    not read it (the rest of the status does not depend on it)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    with api_errors(f"get configmap {CAPACITY_HOLD_SYSTEM.name}/{CONFIG_MAP}"):
        try:
            found = client.CoreV1Api(api).read_namespaced_config_map(
                CONFIG_MAP, CAPACITY_HOLD_SYSTEM.name, _request_timeout=timeout
            )
        except ApiException as exc:
            if exc.status in (403, 404):
                return {}
            raise
    text = (found.data or {}).get("config.json")
    try:
        return dict(HoldConfig.from_json(json.loads(text)).groups) if text else {}
    except (ValueError, HoldConfigError):
        return {}
