"""`trainctl scale`: set a GPU node group's size and wait until every node can run GPU and EFA pods.

    trainctl scale --env prod --group p5 --nodes 2             grow to 2 nodes, wait (30 min at most)
    trainctl scale --env prod --group p5 --nodes 0             shrink to none (no node wait)
    trainctl scale --env dev --group g6 --nodes 2 --kubeconfig ~/.kube/config --wait 900

Steps:
1. N must lie within the group's scaling.min_size..max_size (infra/spec/environments.py) and the
   deployed node group's (eks:DescribeNodegroup); otherwise nothing is changed.
2. Kueue quota, shrinking (trainctl/queue_quota.py): ClusterQueue gpu-<group>'s quota is read and, when it
   covers more than N nodes, lowered to N before the node group changes (nothing new lands on leaving nodes).
3. eks:UpdateNodegroupConfig sets scalingConfig.desiredSize=N, keeping min and max; the update is
   followed with eks:DescribeUpdate until Successful, Failed or Cancelled.
4. Then (N > 0) the Kubernetes API is polled until N nodes labelled eks.amazonaws.com/nodegroup=<cluster>-<group>
   are Ready, each advertises allocatable nvidia.com/gpu and vpc.amazonaws.com/efa equal to the
   instance facts (GPU count, the group's EFA interfaces), and the NVIDIA and EFA device-plugin pods
   on each are Ready. On timeout it names, per node, what is missing.
5. Kueue quota, growing: once the nodes are usable the quota covers them (on timeout: the usable ones), so
   Kueue never admits a gang onto nodes that are not there (issue 22 #5).

A later `cdk deploy` that changes the group's scaling config sets the desired size back to the template's,
and one that changes the Platform stack's queues sets the quota back to desired_size: `trainctl status`
says when quota and nodes differ, and running this command again puts them together.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.spec import ENVIRONMENTS, ConfigError, Environment, GpuNodeGroupConfig, get_environment
from infra.spec.versions import HELM_CHARTS
from trainctl import gate_taints, queue_quota
from trainctl.arguments import node_count, seconds
from trainctl.aws import Aws, AwsError, describe_nodegroup, describe_update, update_nodegroup_scaling
from trainctl.eks_auth import (
    DEFAULT_REQUEST_TIMEOUT_S,
    ConnectError,
    TokenSource,
    api_client_for_eks,
    api_client_from_kubeconfig,
    describe_cluster,
    eks_token,
)
from trainctl.exit_codes import ExitCode
from trainctl.kube import KubeError, api_errors
from trainctl.output import table, to_json
from trainctl.preflight import aws_endpoint

ENVIRONMENTS_FILE = "infra/spec/environments.py"
NODEGROUP_LABEL = "eks.amazonaws.com/nodegroup"
"""EKS puts this label, with the node group's name, on every node of a managed node group."""
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
DEFAULT_WAIT_S = 1800.0
POLL_S = 10.0
UPDATE_DONE = frozenset({"Successful", "Failed", "Cancelled"})


@dataclass(frozen=True)
class Plugin:
    """A device-plugin DaemonSet, found by the labels its Helm chart puts on its pods."""

    name: str
    selector: str
    resource: str


# infra/addons/helm.py installs each chart with release name = chart name (HELM_CHARTS keys).
# nvidia-device-plugin (templates/_helpers.tpl "templateLabels"): app.kubernetes.io/name and
# app.kubernetes.io/instance; its GFD and MPS DaemonSets carry other names.
# aws-efa-k8s-device-plugin (templates/daemonset.yaml): `name: <fullname>`, which is the release name
# when it contains the chart name.
_NVIDIA = "nvidia-device-plugin"
_EFA = "aws-efa-k8s-device-plugin"
assert _NVIDIA in HELM_CHARTS
assert _EFA in HELM_CHARTS
NVIDIA_PLUGIN = Plugin(_NVIDIA, f"app.kubernetes.io/name={_NVIDIA},app.kubernetes.io/instance={_NVIDIA}", GPU_RESOURCE)
EFA_PLUGIN = Plugin(_EFA, f"name={_EFA}", EFA_RESOURCE)


def nodegroup_name(env: Environment, group: GpuNodeGroupConfig) -> str:
    """The managed node group's name, as infra/stage.py sets it (infra/spec/replacement_names.py)."""
    from infra.spec.replacement_names import gpu_nodegroup_name

    return gpu_nodegroup_name(env, group)


class ScaleError(Exception):
    """Refused before changing anything, or an AWS call failed."""


# --- nodes and plugin pods -----------------------------------------------------------------------


@dataclass(frozen=True)
class NodeView:
    name: str
    ready: bool
    ready_reason: str
    allocatable: Mapping[str, str]
    taints: tuple[str, ...]


@dataclass(frozen=True)
class PodView:
    name: str
    namespace: str
    node: str | None
    """spec.nodeName, or (unscheduled) the node its DaemonSet pinned it to."""
    phase: str
    ready: bool
    unscheduled: str | None
    """The PodScheduled=False condition's reason and message."""


def _conditions(obj: Any) -> dict[str, Any]:
    status = obj.status
    return {c.type: c for c in ((status.conditions if status is not None else None) or [])}


def _node_view(item: Any) -> NodeView:
    ready = _conditions(item).get("Ready")
    taints = tuple(f"{t.key}={t.value or ''}:{t.effect}" for t in (item.spec.taints or []))
    return NodeView(
        name=item.metadata.name,
        ready=ready is not None and ready.status == "True",
        ready_reason="no Ready condition yet"
        if ready is None
        else f"Ready={ready.status} ({ready.reason or '-'}: {ready.message or '-'})",
        allocatable=dict((item.status.allocatable if item.status is not None else None) or {}),
        taints=taints,
    )


def _pinned_node(item: Any) -> str | None:
    """The node a DaemonSet pod is for: the controller pins it with a required node affinity on the
    field metadata.name (Kubernetes docs, DaemonSet, "How Daemon Pods are scheduled"), not nodeName."""
    if item.spec.node_name:
        return str(item.spec.node_name)
    affinity = item.spec.affinity
    required = affinity.node_affinity.required_during_scheduling_ignored_during_execution if affinity else None
    if affinity is None or affinity.node_affinity is None or required is None:
        return None
    for term in required.node_selector_terms or []:
        for expression in term.match_fields or []:
            if expression.key == "metadata.name" and expression.operator == "In" and expression.values:
                return str(expression.values[0])
    return None


def _pod_view(item: Any) -> PodView:
    conditions = _conditions(item)
    scheduled = conditions.get("PodScheduled")
    ready = conditions.get("Ready")
    unscheduled = None
    if scheduled is not None and scheduled.status == "False":
        unscheduled = f"{scheduled.reason or 'Unschedulable'}: {scheduled.message or '-'}"
    return PodView(
        name=item.metadata.name,
        namespace=item.metadata.namespace,
        node=_pinned_node(item),
        phase=(item.status.phase if item.status is not None else None) or "Unknown",
        ready=ready is not None and ready.status == "True",
        unscheduled=unscheduled,
    )


def list_nodes(api: Any, selector: str, *, timeout: float) -> list[NodeView]:
    from kubernetes import client

    with api_errors(f"list nodes -l {selector}"):
        items = client.CoreV1Api(api).list_node(label_selector=selector, _request_timeout=timeout)
    return sorted((_node_view(item) for item in items.items), key=lambda n: n.name)


def list_plugin_pods(api: Any, plugin: Plugin, *, timeout: float) -> list[PodView]:
    from kubernetes import client

    with api_errors(f"list pods -A -l {plugin.selector}"):
        items = client.CoreV1Api(api).list_pod_for_all_namespaces(
            label_selector=plugin.selector, _request_timeout=timeout
        )
    return [_pod_view(item) for item in items.items]


@dataclass(frozen=True)
class Expectation:
    nodes: int
    gpus: int
    efa: int
    plugins: tuple[Plugin, ...]


def expectation(env: Environment, group: GpuNodeGroupConfig, nodes: int) -> Expectation:
    """What each of `nodes` nodes of the group must advertise and run to be usable."""
    plugins = tuple(
        plugin
        for plugin, enabled in (
            (NVIDIA_PLUGIN, env.add_ons.nvidia_device_plugin),
            (EFA_PLUGIN, env.add_ons.efa_device_plugin),
        )
        if enabled
    )
    gpu = group.instance.gpu
    assert gpu is not None  # GpuNodeGroupConfig validates it
    return Expectation(nodes=nodes, gpus=gpu.count, efa=group.efa_interface_count, plugins=plugins)


def node_problems(node: NodeView, expected: Expectation, pods: Mapping[str, Sequence[PodView]]) -> list[str]:
    """What keeps one node from running a whole-node GPU+EFA pod; empty when nothing does."""
    problems = gate_taints.problems(node.name, node.taints)
    if not node.ready:
        problems.append(f"not Ready: {node.ready_reason}")
    for resource, want in ((GPU_RESOURCE, expected.gpus), (EFA_RESOURCE, expected.efa)):
        seen = node.allocatable.get(resource)
        if seen != str(want):
            problems.append(f"{resource} allocatable {seen or 'absent'}, expected {want}")
    for plugin in expected.plugins:
        mine = [p for p in pods.get(plugin.name, ()) if p.node == node.name]
        if not mine:
            taints = ", ".join(node.taints) or "none"
            problems.append(
                f"no {plugin.name} pod for this node (its DaemonSet does not select it: compare its nodeSelector "
                f"and tolerations with the node's labels and taints: {taints})"
            )
        elif not any(p.ready for p in mine):
            pod = mine[0]
            why = f"not scheduled: {pod.unscheduled}" if pod.unscheduled else f"{pod.phase}, not Ready"
            problems.append(f"{plugin.name} pod {pod.namespace}/{pod.name} {why}")
    return problems


@dataclass
class NodeReport:
    nodes: list[NodeView] = field(default_factory=list)
    problems: dict[str, list[str]] = field(default_factory=dict)
    missing: int = 0
    """Nodes not launched (or not yet registered) of the N wanted."""

    @property
    def usable(self) -> list[str]:
        return [n.name for n in self.nodes if not self.problems.get(n.name)]


def survey(api: Any, selector: str, expected: Expectation, *, timeout: float) -> NodeReport:
    nodes = list_nodes(api, selector, timeout=timeout)
    pods = {plugin.name: list_plugin_pods(api, plugin, timeout=timeout) for plugin in expected.plugins}
    report = NodeReport(nodes=nodes)
    for node in nodes:
        report.problems[node.name] = node_problems(node, expected, pods)
    report.missing = max(0, expected.nodes - len(nodes))
    return report


def wait_for_nodes(
    api: Any,
    selector: str,
    expected: Expectation,
    *,
    wait_s: float,
    poll_s: float = POLL_S,
    timeout: float = DEFAULT_REQUEST_TIMEOUT_S,
    say: Callable[[str], None] = lambda message: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[bool, NodeReport]:
    """(True, report) once N nodes are usable; (False, the last report) when `wait_s` runs out."""
    deadline = clock() + wait_s
    last_line = ""
    while True:
        report = survey(api, selector, expected, timeout=timeout)
        if len(report.usable) >= expected.nodes:
            return True, report
        line = f"{len(report.usable)} of {expected.nodes} node(s) usable, {len(report.nodes)} registered"
        if line != last_line:
            say(f"waiting: {line}")
            last_line = line
        if clock() >= deadline:
            return False, report
        sleep(min(poll_s, max(0.0, deadline - clock())))


# --- the command ---------------------------------------------------------------------------------


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
    errors: list[str] = field(default_factory=list)
    """Could not run: refused input, AWS or Kubernetes API failures."""

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
        err = "".join(f"error: {e}\n" for e in self.errors)
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
        found = describe_update(aws, cluster, nodegroup, update_id)
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
    cluster = cluster_name or env.cluster.name
    report.nodegroup = nodegroup = nodegroup_name(env, group)
    aws = aws_factory(env.region)
    report.quota = quota = queue_quota.QuotaSync(env, group, nodes, kube, timeout=request_timeout, say=say)
    try:
        deployed = describe_nodegroup(aws, cluster, nodegroup)
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
            update = update_nodegroup_scaling(aws, cluster, nodegroup, min_size=low, max_size=high, desired_size=nodes)
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
            health = describe_nodegroup(aws, cluster, nodegroup).get("health") or {}
            report.health = [f"{i.get('code')}: {i.get('message')}" for i in health.get("issues") or []]
        except AwsError as exc:
            report.health = [f"could not read: {exc.api}: {exc}"]
    return report


# --- command line ------------------------------------------------------------------------------


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "scale",
        help="set a GPU node group's desired size and wait until every node has its GPUs, EFA and device plugins",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes: 0 scaled (and, N > 0, every node usable), 1 the update failed or the nodes were not "
        "usable within --wait (what is missing is named per node), 2 could not run (refused N, unknown "
        "environment or group, AWS or Kubernetes API errors)",
    )
    parser.add_argument("--env", required=True, choices=sorted(ENVIRONMENTS), help="the environment")
    parser.add_argument("--group", required=True, metavar="NAME", help="the GPU node group")
    parser.add_argument("--nodes", required=True, type=node_count(0), metavar="N", help="the desired node count")
    parser.add_argument(
        "--wait",
        type=seconds(24 * 3600),
        default=DEFAULT_WAIT_S,
        metavar="SECONDS",
        help="for the update and the nodes, each (default: %(default)g)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    group = parser.add_argument_group(
        "connection",
        "The Kubernetes API: by default the environment's EKS cluster (endpoint and CA from eks:DescribeCluster, "
        "token signed with your AWS credentials; private endpoint: run from inside the VPC), or --kubeconfig.",
    )
    group.add_argument("--kubeconfig", type=Path, metavar="FILE", help="use this kubeconfig for the Kubernetes API")
    group.add_argument("--context", metavar="NAME", help="kubeconfig context (default: its current-context)")
    group.add_argument("--cluster", metavar="NAME", help="EKS cluster name (default: the environment's)")
    group.add_argument("--profile", metavar="NAME", help="AWS profile (default: the usual AWS chain)")
    group.add_argument(
        "--request-timeout",
        type=seconds(3600),
        default=DEFAULT_REQUEST_TIMEOUT_S,
        metavar="SECONDS",
        help="per API request (default: %(default)g)",
    )
    group.add_argument(
        "--endpoint-url",
        type=aws_endpoint,
        action="append",
        default=[],
        metavar="[SERVICE=]URL",
        help="send AWS requests (eks) to another endpoint, e.g. a local emulator; repeatable",
    )
    parser.set_defaults(run=run)


def _kube_factory(args: argparse.Namespace, endpoints: Mapping[str, str]) -> Callable[[Environment], Any]:
    def connect(env: Environment) -> Any:
        if args.kubeconfig is not None:
            return api_client_from_kubeconfig(args.kubeconfig, args.context)
        if args.context:
            raise ConnectError("--context goes with --kubeconfig")
        import boto3
        from botocore.exceptions import BotoCoreError

        name = args.cluster or env.cluster.name
        try:
            session = boto3.Session(profile_name=args.profile, region_name=env.region)
            eks = session.client("eks", region_name=env.region, endpoint_url=endpoints.get("eks") or endpoints.get("*"))
        except BotoCoreError as exc:
            raise ConnectError(f"AWS session: {exc}") from None
        access = describe_cluster(eks, name, env.region)
        return api_client_for_eks(access, TokenSource(lambda: eks_token(session, env.region, name)))

    return connect


def run(args: argparse.Namespace) -> int:
    def say(message: str) -> None:
        sys.stderr.write(f"trainctl: {message}\n")
        sys.stderr.flush()

    endpoints: dict[str, str] = dict(args.endpoint_url)
    report = scale(
        args.env,
        args.group,
        args.nodes,
        aws_factory=lambda region: Aws(region=region, profile=args.profile, endpoint_urls=endpoints),
        kube=_kube_factory(args, endpoints),
        wait_s=args.wait,
        poll_s=POLL_S,
        request_timeout=args.request_timeout,
        say=say,
        cluster_name=args.cluster,
    )
    if args.json:
        sys.stdout.write(to_json(report.to_json()) + "\n")
        sys.stderr.write(report.render()[1])
    else:
        out, err = report.render()
        sys.stdout.write(out)
        sys.stderr.write(err)
    return int(report.exit_code)
