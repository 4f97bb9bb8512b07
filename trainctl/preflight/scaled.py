"""scaled: a GPU node group `trainctl scale` left at another size than the spec's desired_size (eks:DescribeNodegroup).

Its Kueue quota moved with it (trainctl/queue_quota.py); a `cdk deploy` puts either back to desired_size
when it touches them: a Platform deploy that changes the queue objects sets the quota back, a deploy of
the group's stack that changes its scaling config sets the node count back. Either way quota and nodes
then differ (issue 22 #5) until `trainctl scale` runs again; this row says so before the deploy. It is
asked with the leftover check's eks:DescribeNodegroup (trainctl/preflight/leftover.py), for node groups
that exist.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infra.spec import Environment, GpuNodeGroupConfig
from infra.spec.replacement_names import gpu_nodegroup_name
from trainctl.preflight.results import Check, CheckResult, Status, group_subject


def evaluate_scaled(env: Environment, group: GpuNodeGroupConfig, nodegroup: Mapping[str, Any] | None) -> CheckResult:
    subject = group_subject(group)
    desired = group.scaling.desired_size
    if nodegroup is None:
        return CheckResult(
            Check.SCALED, subject, Status.PASS, f"not deployed yet: nodes and Kueue quota start together at {desired}"
        )
    running = int((nodegroup.get("scalingConfig") or {}).get("desiredSize", desired))
    if running == desired:
        return CheckResult(
            Check.SCALED, subject, Status.PASS, f"desired size {running}, as the spec deploys it and its quota covers"
        )
    return CheckResult(
        Check.SCALED,
        subject,
        Status.WARN,
        f"node group {nodegroup.get('nodegroupName', gpu_nodegroup_name(env, group))} has desired size {running} "
        f"(trainctl scale) where the spec deploys {desired}: a cdk deploy that changes the queues sets the Kueue "
        f"quota back to {desired} node(s), one that changes the group's scaling sets the nodes back to {desired}",
        f"after the deploy, run `trainctl scale --env {env.name} --group {group.name} --nodes {running}` to put "
        f"nodes and quota together again (`trainctl status` shows both)",
    )
