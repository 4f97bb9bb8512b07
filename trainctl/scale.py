"""Scaling a GPU node group (`trainctl scale`, the command in trainctl/commands/scale.py): the planning and
the AWS half, then the wait for the nodes (trainctl/node_readiness.py).

1. N must lie within the group's scaling.min_size..max_size (infra/spec/environments.py) and the
   deployed node group's (eks:DescribeNodegroup); otherwise nothing is changed. A gated group (its jobs run the
   fabric gate) should get its gang plus a spare (GpuNodeGroupConfig.nodes_with_spare): below that, or when a node
   of the group carries the gate's taint, the report warns, naming the fix (trainctl/gate_taints.py spare_warning).
2. Kueue quota, shrinking (trainctl/queue_quota.py): ClusterQueue gpu-<group>'s quota is read and, when it
   covers more than N nodes, lowered to N before the node group changes (nothing new lands on leaving nodes).
3. eks:UpdateNodegroupConfig sets scalingConfig.desiredSize=N, keeping min and max; the update is
   followed with eks:DescribeUpdate until Successful, Failed or Cancelled.
4. Then (N > 0) trainctl.node_readiness.wait_for_nodes, until every node is usable or the wait ends.
5. Kueue quota, growing: once the nodes are usable the quota covers them (on timeout: the usable ones), so
   Kueue never admits a gang onto nodes that are not there (issue 22 #5).

A later `cdk deploy` that changes the group's scaling config sets the desired size back to the template's,
and one that changes the Platform stack's queues sets the quota back to desired_size: `trainctl status`
says when quota and nodes differ, and running this command again puts them together.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from infra.spec import ConfigError, Environment, GpuNodeGroupConfig, get_environment
from trainctl import gate_taints, queue_quota
from trainctl.aws import Aws, AwsError
from trainctl.eks_auth import DEFAULT_REQUEST_TIMEOUT_S, ConnectError
from trainctl.exit_codes import ExitCode
from trainctl.kube import KubeError
from trainctl.node_readiness import (
    EFA_RESOURCE,
    GPU_RESOURCE,
    NODEGROUP_LABEL,
    NodeReport,
    expectation,
    wait_for_nodes,
)

# The command's poll interval (trainctl/commands/scale.py reads it here, so a test can shorten it here).
from trainctl.node_readiness import POLL_S as POLL_S
from trainctl.output import table

ENVIRONMENTS_FILE = "infra/spec/environments.py"
DEFAULT_WAIT_S = 1800.0
UPDATE_DONE = frozenset({"Successful", "Failed", "Cancelled"})


def nodegroup_name(env: Environment, group: GpuNodeGroupConfig) -> str:
    """The managed node group's name, as infra/stage.py sets it (infra/spec/replacement_names.py)."""
    from infra.spec.replacement_names import gpu_nodegroup_name

    return gpu_nodegroup_name(env, group)


@dataclass
class ScaleReport:
    environment: str
    group: str | None = None
    nodegroup: str | None = None
    nodes: int | None = None
    previous: dict[str, Any] | None = None
    update_id: str | None = None
    update_status: str | None = None
    update_errors: list[str] = field(default_factory=list)
    ready: bool | None = None
    node_report: NodeReport | None = None
    health: list[str] = field(default_factory=list)
    quota: queue_quota.QuotaSync | None = None
    """The group's Kueue quota, moved with the nodes."""
    spare: str | None = None
    """Why the gated gang has no spare untainted node (gate_taints.spare_warning), or None."""
    errors: list[str] = field(default_factory=list)
    """Could not run: refused input, AWS or Kubernetes API failures."""

    @property
    def warnings(self) -> list[str]:
        return [] if self.spare is None or self.errors else [self.spare]

    @property
    def exit_code(self) -> ExitCode:
        if self.errors:
            return ExitCode.ERROR
        if self.update_status not in (None, "Successful") or self.ready is False:
            return ExitCode.CHECK_FAILED
        return ExitCode.OK

    def missing_lines(self) -> list[str]:
        report = self.node_report
        if report is None:
            return []
        lines = [f"{name}: {'; '.join(problems)}" for name, problems in report.problems.items() if problems]
        if report.missing:
            lines.append(f"{report.missing} node(s) not launched or not registered yet")
        return lines

    def summary(self) -> str:
        line = self._summary()
        quota = self.quota.summary() if self.quota is not None and not self.errors else None
        return f"{line}; {quota}" if quota else line

    def _summary(self) -> str:
        if self.errors:
            return f"scale could not run: {self.errors[0]}"
        target = f"node group {self.nodegroup} to {self.nodes}"
        if self.update_status not in (None, "Successful"):
            errors = "; ".join(self.update_errors) or "no error detail"
            return f"scaling {target}: update {self.update_id} {self.update_status}: {errors}"
        if self.ready is False:
            return f"scaled {target}, but not every node became usable in time (see above)"
        if self.nodes == 0:
            return f"scaled {target}"
        return f"scaled {target}: {self.nodes} node(s) Ready with their GPUs, EFA interfaces and device plugins"

    def to_json(self) -> dict[str, Any]:
        nodes = self.node_report
        return {
            "command": "scale",
            "environment": self.environment,
            "group": self.group,
            "nodegroup": self.nodegroup,
            "nodes": self.nodes,
            "previous_scaling": self.previous,
            "update": {"id": self.update_id, "status": self.update_status, "errors": list(self.update_errors)},
            "ready": self.ready,
            "node_status": None
            if nodes is None
            else {
                "usable": nodes.usable,
                "not_launched": nodes.missing,
                "problems": {k: v for k, v in nodes.problems.items() if v},
            },
            "nodegroup_health": list(self.health),
            "queue_quota": None if self.quota is None else self.quota.to_json(),
            "exit_code": int(self.exit_code),
            "summary": self.summary(),
            "warnings": self.warnings,
            "errors": list(self.errors),
        }

    def render(self) -> tuple[str, str]:
        out: list[str] = []
        if self.node_report is not None and self.node_report.nodes:
            rows = [
                [
                    n.name,
                    "yes" if n.ready else "no",
                    n.allocatable.get(GPU_RESOURCE, "-"),
                    n.allocatable.get(EFA_RESOURCE, "-"),
                    "; ".join(self.node_report.problems.get(n.name, [])) or "usable",
                ]
                for n in self.node_report.nodes
            ]
            out += [table(["NODE", "READY", "GPU", "EFA", "STATUS"], rows), ""]
        missing = self.missing_lines() if self.ready is False else []
        if missing:
            out += ["missing:", *(f"  {line}" for line in missing), ""]
        if self.health and self.ready is False:
            out += ["node group health:", *(f"  {line}" for line in self.health), ""]
        out.append(self.summary())
        err = "".join(f"warning: {w}\n" for w in self.warnings) + "".join(f"error: {e}\n" for e in self.errors)
        return "\n".join(out) + "\n", err


def _bounds_error(group: GpuNodeGroupConfig, nodes: int) -> str | None:
    scaling = group.scaling
    field_prefix = f"gpu_node_groups[{group.name}].scaling"
    if nodes > scaling.max_size:
        return (
            f"--nodes {nodes} is above the maximum {scaling.max_size} ({field_prefix}.max_size in "
            f"{ENVIRONMENTS_FILE}); raise it there and cdk deploy first"
        )
    if nodes < scaling.min_size:
        return (
            f"--nodes {nodes} is below the minimum {scaling.min_size} ({field_prefix}.min_size in {ENVIRONMENTS_FILE})"
        )
    return None


def follow_update(
    aws: Aws,
    cluster: str,
    nodegroup: str,
    update: Mapping[str, Any],
    *,
    wait_s: float,
    poll_s: float,
    say: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[str, list[str]]:
    """(final status, error lines) of a node group update; 'InProgress' if `wait_s` ran out."""
    update_id = str(update["id"])
    status = str(update.get("status", "InProgress"))
    found: Mapping[str, Any] = update
    deadline = clock() + wait_s
    while status not in UPDATE_DONE and clock() < deadline:
        sleep(poll_s)
        found = aws.describe_update(cluster, nodegroup, update_id)
        status = str(found.get("status"))
        say(f"update {update_id}: {status}")
    errors = [
        f"{e.get('errorCode', '?')}: {e.get('errorMessage', '')}"
        + (f" ({', '.join(e['resourceIds'])})" if e.get("resourceIds") else "")
        for e in found.get("errors") or []
    ]
    return status, errors


def scale(
    env_name: str,
    group_name: str,
    nodes: int,
    *,
    aws_factory: Callable[[str], Aws],
    kube: Callable[[Environment], Any] | None,
    wait_s: float = DEFAULT_WAIT_S,
    poll_s: float = POLL_S,
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT_S,
    say: Callable[[str], None] = lambda message: None,
    cluster_name: str | None = None,
) -> ScaleReport:
    """`kube`: the Kubernetes API client for the environment (for the group's Kueue quota and the new nodes)."""
    report = ScaleReport(env_name, group=group_name, nodes=nodes)
    try:
        env = get_environment(env_name)
    except ConfigError as exc:
        report.errors.append(f"unknown environment {env_name!r}; known: {exc.allowed} ({ENVIRONMENTS_FILE})")
        return report
    groups = {g.name: g for g in env.gpu_node_groups}
    group = groups.get(group_name)
    if group is None:
        report.errors.append(
            f"--group {group_name!r}: environment {env.name} has GPU node groups {sorted(groups) or 'none'} "
            f"({ENVIRONMENTS_FILE})"
        )
        return report
    bounds = _bounds_error(group, nodes)
    if bounds:
        report.errors.append(bounds)
        return report
    fix = f"trainctl scale --env {env.name} --group {group.name} --nodes {group.nodes_with_spare}"
    report.spare = gate_taints.spare_warning(group, nodes, fix=fix)  # the count; the nodes' taints once seen
    cluster = cluster_name or env.cluster.name
    report.nodegroup = nodegroup = nodegroup_name(env, group)
    aws = aws_factory(env.region)
    report.quota = quota = queue_quota.QuotaSync(env, group, nodes, kube, timeout=request_timeout, say=say)
    try:
        deployed = aws.describe_nodegroup(cluster, nodegroup)
        scaling = dict(deployed.get("scalingConfig") or {})
        report.previous = scaling
        low, high = int(scaling.get("minSize", 0)), int(scaling.get("maxSize", 0))
        if not low <= nodes <= high:
            report.errors.append(
                f"--nodes {nodes} is outside the deployed node group's {low}..{high} (the spec allows "
                f"{group.scaling.min_size}..{group.scaling.max_size}): cdk deploy the spec first"
            )
            return report
        problem = quota.before()  # a shrinking group's quota goes down first
        if problem is not None:
            report.errors.append(problem)
            return report
        if int(scaling.get("desiredSize", -1)) == nodes:
            say(f"{nodegroup} already has desired size {nodes}; not updated")
            report.update_status = "Successful"
        else:
            say(f"setting the desired size of {nodegroup} to {nodes} (min {low}, max {high})")
            update = aws.update_nodegroup_scaling(cluster, nodegroup, min_size=low, max_size=high, desired_size=nodes)
            report.update_id = str(update.get("id"))
            status, errors = follow_update(aws, cluster, nodegroup, update, wait_s=wait_s, poll_s=poll_s, say=say)
            report.update_status, report.update_errors = status, errors
            if status != "Successful":
                return report
    except AwsError as exc:
        report.errors.append(f"{exc.api}: {exc}")
        return report
    if nodes == 0 or kube is None:
        return report
    expected = expectation(env, group, nodes)
    try:
        api = kube(env)
    except ConnectError as exc:
        report.errors.append(str(exc))
        return report
    try:
        report.ready, report.node_report = wait_for_nodes(
            api,
            f"{NODEGROUP_LABEL}={nodegroup}",
            expected,
            wait_s=wait_s,
            poll_s=poll_s,
            timeout=request_timeout,
            say=say,
        )
        tainted = [t for n in report.node_report.nodes if (t := gate_taints.from_taints(n.name, n.taints))]
        report.spare = gate_taints.spare_warning(group, nodes, fix=fix, tainted=tainted)
        quota.after(api, len(report.node_report.usable))  # a growing group's quota goes up once its nodes are usable
    except KubeError as exc:
        report.errors.append(str(exc))
        return report
    finally:
        close = getattr(api, "close", None)
        if close is not None:
            close()
    if report.ready is False:
        try:
            health = aws.describe_nodegroup(cluster, nodegroup).get("health") or {}
            report.health = [f"{i.get('code')}: {i.get('message')}" for i in health.get("issues") or []]
        except AwsError as exc:
            report.health = [f"could not read: {exc.api}: {exc}"]
    return report
