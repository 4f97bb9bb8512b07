"""`trainctl scale` against moto (EKS clusters, node groups, UpdateNodegroupConfig), a loopback EKS front
for DescribeUpdate, and a loopback Kubernetes API whose nodes and plugin pods change from poll to poll and
which holds the environment's Kueue ClusterQueues (the group's quota moves with its nodes, issue 22 #5)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from infra.spec import get_environment
from k8s.queueing import queue_objects
from tests.trainctl.fake_aws import EksFront, MotoServer
from tests.trainctl.fake_kube import daemon_pod_object, node_object
from tests.trainctl.fake_queues import QueueKube, gpu_nominal
from tests.trainctl.test_submit import write_kubeconfig
from trainctl.aws import Aws
from trainctl.cli import main
from trainctl.eks_auth import api_client_from_kubeconfig
from trainctl.node_readiness import EFA_PLUGIN, EFA_RESOURCE, GPU_RESOURCE, NODEGROUP_LABEL, NVIDIA_PLUGIN
from trainctl.scale import ScaleReport, scale
from training.fabric_gate import TAINT_KEY

pytestmark = pytest.mark.usefixtures("fake_aws_credentials")

ENV = get_environment("dev")
GROUP = ENV.gpu_node_groups[0]
NODEGROUP = f"{ENV.cluster.name}-{GROUP.name}-{ENV.gpu_availability_zone}-od"  # infra/spec/replacement_names.py
GPUS = GROUP.instance.gpu.count if GROUP.instance.gpu else 0
EFA = GROUP.efa_interface_count
WANT = GROUP.scaling.max_size
GANG = GROUP.workload_nodes  # dev's g6: a gated gang of 2, and max_size 3 holds its spare
FULL = {GPU_RESOURCE: str(GPUS), EFA_RESOURCE: str(EFA)}
NVIDIA_LABELS = dict(term.split("=") for term in NVIDIA_PLUGIN.selector.split(","))
EFA_LABELS = dict(term.split("=") for term in EFA_PLUGIN.selector.split(","))
TAINT_MESSAGE = (
    "0/5 nodes are available: 1 node(s) had untolerated taint {nvidia.com/gpu: true}, "
    "4 node(s) didn't match Pod's node affinity/selector."
)


@pytest.fixture
def cluster(moto: MotoServer) -> Iterator[MotoServer]:
    """The dev cluster and its GPU node group in moto, desired size 0 (as a fresh deploy leaves it)."""
    moto.reset()  # moto's backends are the process's: another module's server may have left an ml-dev
    eks = boto3.client("eks", region_name=ENV.region, endpoint_url=moto.url)
    eks.create_cluster(
        name=ENV.cluster.name,
        roleArn="arn:aws:iam::123456789012:role/cluster",
        resourcesVpcConfig={"subnetIds": ["subnet-1", "subnet-2"]},
    )
    eks.create_nodegroup(
        clusterName=ENV.cluster.name,
        nodegroupName=NODEGROUP,
        scalingConfig={"minSize": GROUP.scaling.min_size, "maxSize": GROUP.scaling.max_size, "desiredSize": 0},
        subnets=["subnet-1"],
        nodeRole="arn:aws:iam::123456789012:role/node",
    )
    try:
        yield moto
    finally:
        moto.reset()


def scaling(moto: MotoServer) -> dict[str, int]:
    eks = boto3.client("eks", region_name=ENV.region, endpoint_url=moto.url)
    found: dict[str, int] = eks.describe_nodegroup(clusterName=ENV.cluster.name, nodegroupName=NODEGROUP)["nodegroup"][
        "scalingConfig"
    ]
    return found


def gpu_node(name: str, **kwargs: Any) -> dict[str, Any]:
    return node_object(name, labels={NODEGROUP_LABEL: NODEGROUP}, **kwargs)


def plugins(node: str, *, efa_unschedulable: str | None = None) -> list[dict[str, Any]]:
    return [
        daemon_pod_object(f"nvidia-device-plugin-{node}", node=node, labels=NVIDIA_LABELS),
        daemon_pod_object(
            f"aws-efa-k8s-device-plugin-{node}", node=node, labels=EFA_LABELS, unschedulable=efa_unschedulable
        ),
    ]


def run_scale(
    front: EksFront, kube: QueueKube | None, tmp_path: Path, nodes: int, *, wait_s: float = 5.0
) -> ScaleReport:
    def connect(env: object) -> Any:
        assert kube is not None, "no Kubernetes API expected"
        return api_client_from_kubeconfig(write_kubeconfig(tmp_path / "kubeconfig", kube.url), None)

    messages: list[str] = []
    return scale(
        ENV.name,
        GROUP.name,
        nodes,
        aws_factory=lambda region: Aws(region=region, endpoint_urls={"eks": front.url}),
        kube=connect,
        wait_s=wait_s,
        poll_s=0.05,
        request_timeout=5.0,
        say=messages.append,
    )


def started_front(moto: MotoServer, **kwargs: Any) -> EksFront:
    front = EksFront(moto.url, **kwargs)
    front.start()
    return front


@pytest.fixture
def front_factory(cluster: MotoServer) -> Iterator[Callable[..., EksFront]]:
    made: list[EksFront] = []

    def make(**kwargs: Any) -> EksFront:
        made.append(started_front(cluster, **kwargs))
        return made[-1]

    yield make
    for front in made:
        front.stop()


QUEUE = f"gpu-{GROUP.name}"


def cluster_queues(quota_nodes: int) -> list[dict[str, Any]]:
    """The environment's ClusterQueues as CDK applies them, the group's quota covering `quota_nodes` nodes."""
    return [o for o in queue_objects(ENV, {GROUP.name: quota_nodes}) if o["kind"] == "ClusterQueue"]


def quota_of(kube: QueueKube) -> int:
    return int(gpu_nominal(kube.queues[QUEUE], QUEUE)) // GPUS


@pytest.fixture
def cluster_kube(cluster: MotoServer) -> Iterator[Callable[..., QueueKube]]:
    """A loopback Kubernetes API with the nodes of `script` and the ClusterQueues (quota for `quota_nodes`,
    0 as deployed); each quota patch records moto's desired size at that moment."""
    made: list[QueueKube] = []

    def make(
        script: Callable[[int], tuple[list[dict[str, Any]], list[dict[str, Any]]]], quota_nodes: int = 0
    ) -> QueueKube:
        kube = QueueKube(script, cluster_queues(quota_nodes), on_patch=lambda: scaling(cluster)["desiredSize"])
        made.append(kube.start())  # type: ignore[arg-type]
        return made[-1]

    yield make
    for kube in made:
        kube.stop()
        assert kube.handler_errors == []


def test_nodes_that_become_ready_over_polls_pass(
    cluster: MotoServer,
    front_factory: Callable[..., EksFront],
    cluster_kube: Callable[..., QueueKube],
    tmp_path: Path,
) -> None:
    names = [f"ip-10-10-0-{i}" for i in range(WANT)]

    def script(poll: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        if poll == 0:
            return [], []
        if poll < 3:  # registered, kubelet not ready yet, no plugins advertised
            return [gpu_node(n, ready=False) for n in names], []
        pods = [p for n in names for p in plugins(n)]
        return [gpu_node(n, allocatable=FULL) for n in names], pods

    front = front_factory(statuses=("InProgress", "InProgress", "Successful"))
    kube = cluster_kube(script)
    report = run_scale(front, kube, tmp_path, WANT)
    assert report.exit_code == 0, report.to_json()
    assert report.ready is True
    assert scaling(cluster) == {
        "minSize": GROUP.scaling.min_size,
        "maxSize": GROUP.scaling.max_size,
        "desiredSize": WANT,
    }
    assert len(front.updates_seen) == 3  # followed until Successful
    assert kube.node_polls >= 4
    assert sorted(report.node_report.usable if report.node_report else []) == names
    assert "node(s) Ready with their GPUs" in report.summary()
    # The quota went up once, after the node group had grown and the nodes were usable (poll 3, the 4th list).
    assert quota_of(kube) == WANT
    (patch,) = kube.patches
    assert patch.seen == WANT
    assert patch.node_polls >= 4
    assert f"Kueue quota of {QUEUE}: 0 -> {WANT} node(s)" in report.summary()
    assert report.to_json()["queue_quota"] == {"cluster_queue": QUEUE, "nodes_before": 0, "nodes_after": WANT}
    assert WANT == GANG + 1
    assert report.warnings == []  # the gang and its spare, none tainted


# A spare for every gated gang: the fabric gate takes a node out with a taint, and the gang is re-placed only onto an
# untainted node beside it.

GATE_TAINT = {"key": TAINT_KEY, "value": "fallback", "effect": "NoSchedule"}


def usable_nodes(names: list[str], tainted: tuple[str, ...] = ()) -> Callable[[int], tuple[list[Any], list[Any]]]:
    def script(poll: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        nodes = [gpu_node(n, allocatable=FULL, taints=[GATE_TAINT] if n in tainted else []) for n in names]
        return nodes, [p for n in names for p in plugins(n)]

    return script


def test_scaling_a_gated_group_to_its_gang_alone_warns_naming_the_fix(
    cluster: MotoServer,
    front_factory: Callable[..., EksFront],
    cluster_kube: Callable[..., QueueKube],
    tmp_path: Path,
) -> None:
    kube = cluster_kube(usable_nodes([f"ip-10-10-0-{i}" for i in range(GANG)]))
    report = run_scale(front_factory(), kube, tmp_path, GANG)
    assert report.exit_code == 0, report.to_json()  # a warning: the nodes are there and usable
    (warning,) = report.warnings
    assert warning.startswith(f"group {GROUP.name}: {GANG} node(s) give its gated gang of {GANG} no spare")
    assert "fabric gate" in warning
    assert warning.endswith(f"Fix: trainctl scale --env {ENV.name} --group {GROUP.name} --nodes {GANG + 1}")
    _, err = report.render()
    assert f"warning: {warning}\n" in err
    assert report.to_json()["warnings"] == [warning]


def test_a_gate_tainted_node_is_no_spare(
    cluster: MotoServer,
    front_factory: Callable[..., EksFront],
    cluster_kube: Callable[..., QueueKube],
    tmp_path: Path,
) -> None:
    """The group already runs the gang and its spare, and the gate took one of them out: scaling to gang + 1 again
    leaves no spare, and the warning names the node and how to put it back."""
    eks = boto3.client("eks", region_name=ENV.region, endpoint_url=cluster.url)
    eks.update_nodegroup_config(
        clusterName=ENV.cluster.name, nodegroupName=NODEGROUP, scalingConfig={"desiredSize": GANG + 1}
    )
    names = [f"ip-10-10-0-{i}" for i in range(GANG + 1)]
    kube = cluster_kube(usable_nodes(names, tainted=(names[0],)), quota_nodes=GANG + 1)
    report = run_scale(front_factory(), kube, tmp_path, GANG + 1, wait_s=0.3)
    assert report.exit_code == 1  # the tainted node never becomes usable (unchanged: scale waits for every node)
    (warning,) = report.warnings
    assert warning.startswith(
        f"group {GROUP.name}: {GANG + 1} node(s), 1 of them taken out by the fabric gate ({names[0]}), leave {GANG} "
        f"untainted and give its gated gang of {GANG} no spare"
    )
    assert f"release {names[0]} after repair (kubectl taint node {names[0]} {TAINT_KEY}:NoSchedule-)" in warning
    assert "--nodes" not in warning.split("Fix:")[1]  # the count is right; the node is what is missing


def test_scaling_to_zero_does_not_warn(
    cluster: MotoServer,
    front_factory: Callable[..., EksFront],
    cluster_kube: Callable[..., QueueKube],
    tmp_path: Path,
) -> None:
    kube = cluster_kube(lambda poll: ([], []))
    assert run_scale(front_factory(), kube, tmp_path, 0).warnings == []


def test_node_without_efa_and_plugin_pending_on_a_taint_fail_naming_each(
    cluster: MotoServer,
    front_factory: Callable[..., EksFront],
    cluster_kube: Callable[..., QueueKube],
    tmp_path: Path,
) -> None:
    def script(poll: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        good = gpu_node("ip-good", allocatable=FULL)
        bad = gpu_node("ip-bad", allocatable={GPU_RESOURCE: str(GPUS)})  # EFA never advertised
        pods = plugins("ip-good") + plugins("ip-bad", efa_unschedulable=TAINT_MESSAGE)
        return ([good, bad] if WANT > 1 else [bad]), pods

    kube = cluster_kube(script)
    report = run_scale(front_factory(), kube, tmp_path, WANT, wait_s=0.3)
    assert report.exit_code == 1
    assert report.ready is False
    out, _ = report.render()
    assert f"ip-bad: {EFA_RESOURCE} allocatable absent, expected {EFA}" in out
    assert "aws-efa-k8s-device-plugin pod kube-system/aws-efa-k8s-device-plugin-ip-bad not scheduled" in out
    assert "untolerated taint {nvidia.com/gpu: true}" in out
    assert "ip-good:" not in out.split("missing:")[1]
    assert "not every node became usable in time" in out
    assert quota_of(kube) == (1 if WANT > 1 else 0)  # the quota covers the usable node only


def test_missing_nodes_are_named_not_launched(
    cluster: MotoServer,
    front_factory: Callable[..., EksFront],
    cluster_kube: Callable[..., QueueKube],
    tmp_path: Path,
) -> None:
    kube = cluster_kube(lambda poll: ([], []))
    report = run_scale(front_factory(), kube, tmp_path, WANT, wait_s=0.2)
    assert report.exit_code == 1
    assert f"{WANT} node(s) not launched or not registered yet" in report.render()[0]
    assert kube.patches == []  # no usable node: the quota stays at 0


def test_failed_update_is_reported_with_its_errors_and_no_node_wait(
    cluster: MotoServer,
    front_factory: Callable[..., EksFront],
    cluster_kube: Callable[..., QueueKube],
    tmp_path: Path,
) -> None:
    errors = [
        {
            "errorCode": "AsgInstanceLaunchFailures",
            "errorMessage": "InsufficientInstanceCapacity",
            "resourceIds": ["asg-1"],
        }
    ]
    front = front_factory(statuses=("InProgress", "Failed"), errors=errors)
    kube = cluster_kube(lambda poll: ([], []))
    report = run_scale(front, kube, tmp_path, WANT)
    assert report.exit_code == 1
    assert report.update_status == "Failed"
    assert "AsgInstanceLaunchFailures: InsufficientInstanceCapacity (asg-1)" in report.summary()
    assert kube.node_polls == 0
    assert kube.patches == []  # no nodes came: the quota was not raised


def test_above_max_is_refused_naming_bound_field_and_file_and_nothing_changes(
    cluster: MotoServer, front_factory: Callable[..., EksFront], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    front = front_factory()
    code = main(
        [
            "scale",
            "--env",
            ENV.name,
            "--group",
            GROUP.name,
            "--nodes",
            str(WANT + 1),
            "--endpoint-url",
            f"eks={front.url}",
            "--kubeconfig",
            str(tmp_path / "none"),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 2
    assert f"above the maximum {WANT}" in out + err
    assert f"gpu_node_groups[{GROUP.name}].scaling.max_size" in out + err
    assert "infra/spec/environments.py" in out + err
    assert front.calls == []
    assert front.forwarded == []
    assert scaling(cluster)["desiredSize"] == 0


def _scale_to_zero(front: EksFront, kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    argv = ["scale", "--env", ENV.name, "--group", GROUP.name, "--nodes", "0", "--json"]
    code = main([*argv, "--endpoint-url", f"eks={front.url}", "--kubeconfig", str(kubeconfig)])
    out, err = capsys.readouterr()
    return code, out + err


def test_scale_to_zero_lowers_the_quota_first_then_the_node_group(
    cluster: MotoServer,
    front_factory: Callable[..., EksFront],
    cluster_kube: Callable[..., QueueKube],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("trainctl.scale.POLL_S", 0.05)
    eks = boto3.client("eks", region_name=ENV.region, endpoint_url=cluster.url)
    eks.update_nodegroup_config(
        clusterName=ENV.cluster.name, nodegroupName=NODEGROUP, scalingConfig={"desiredSize": WANT}
    )
    kube = cluster_kube(lambda poll: ([], []), quota_nodes=WANT)
    code, output = _scale_to_zero(front_factory(), write_kubeconfig(tmp_path / "kubeconfig", kube.url), capsys)
    document = json.loads(output[: output.rindex("}") + 1])
    assert code == 0, document
    assert document["update"]["status"] == "Successful"
    assert document["ready"] is None
    assert scaling(cluster)["desiredSize"] == 0
    (patch,) = kube.patches
    assert patch.seen == WANT  # lowered while the node group still had its nodes
    assert quota_of(kube) == 0
    assert kube.node_polls == 0  # no node wait when shrinking
    assert document["queue_quota"] == {"cluster_queue": QUEUE, "nodes_before": WANT, "nodes_after": 0}


def test_scale_down_without_the_kubernetes_api_changes_nothing(
    cluster: MotoServer, front_factory: Callable[..., EksFront], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The quota cannot be lowered first, so the node group is not shrunk under it."""
    eks = boto3.client("eks", region_name=ENV.region, endpoint_url=cluster.url)
    eks.update_nodegroup_config(
        clusterName=ENV.cluster.name, nodegroupName=NODEGROUP, scalingConfig={"desiredSize": WANT}
    )
    front = front_factory()
    code, output = _scale_to_zero(front, tmp_path / "none", capsys)
    assert code == 2, output
    assert "kubeconfig" in output
    assert scaling(cluster)["desiredSize"] == WANT
    assert not [call for call in front.forwarded if call.endswith("/update-config")]


def test_a_missing_cluster_queue_is_named_and_nothing_changes(
    cluster: MotoServer,
    front_factory: Callable[..., EksFront],
    cluster_kube: Callable[..., QueueKube],
    tmp_path: Path,
) -> None:
    kube = cluster_kube(lambda poll: ([], []))
    kube.queues.clear()
    front = front_factory()
    report = run_scale(front, kube, tmp_path, WANT)
    assert report.exit_code == 2
    assert f"ClusterQueue {QUEUE} does not exist (is the Platform stack deployed?); nothing changed" in (
        report.summary()
    )
    assert scaling(cluster)["desiredSize"] == 0
    assert not [call for call in front.forwarded if call.endswith("/update-config")]


def test_unknown_group_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["scale", "--env", ENV.name, "--group", "nope", "--nodes", "1"])
    _, err = capsys.readouterr()
    assert code == 2
    assert "'nope'" in err
    assert GROUP.name in err
