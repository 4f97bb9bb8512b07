"""`trainctl scale` against moto (EKS clusters, node groups, UpdateNodegroupConfig), a loopback EKS front
for DescribeUpdate, and a loopback Kubernetes API whose nodes and plugin pods change from poll to poll."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from infra.spec import get_environment
from tests.trainctl.fake_aws import EksFront, MotoServer
from tests.trainctl.fake_kube import ClusterKube, daemon_pod_object, node_object
from tests.trainctl.test_submit import write_kubeconfig
from trainctl.aws import Aws
from trainctl.cli import main
from trainctl.eks_auth import api_client_from_kubeconfig
from trainctl.scale import EFA_PLUGIN, EFA_RESOURCE, GPU_RESOURCE, NODEGROUP_LABEL, NVIDIA_PLUGIN, ScaleReport, scale

pytestmark = pytest.mark.usefixtures("fake_aws_credentials")

ENV = get_environment("dev")
GROUP = ENV.gpu_node_groups[0]
NODEGROUP = f"{ENV.cluster.name}-{GROUP.name}-{ENV.gpu_availability_zone}-od"  # infra/spec/replacement_names.py
GPUS = GROUP.instance.gpu.count if GROUP.instance.gpu else 0
EFA = GROUP.efa_interface_count
WANT = GROUP.scaling.max_size
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
    front: EksFront, kube: ClusterKube | None, tmp_path: Path, nodes: int, *, wait_s: float = 5.0
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


@pytest.fixture
def cluster_kube() -> Iterator[Callable[..., ClusterKube]]:
    made: list[ClusterKube] = []

    def make(script: Callable[[int], tuple[list[dict[str, Any]], list[dict[str, Any]]]]) -> ClusterKube:
        made.append(ClusterKube(script).start())  # type: ignore[arg-type]
        return made[-1]

    yield make
    for kube in made:
        kube.stop()
        assert kube.handler_errors == []


def test_nodes_that_become_ready_over_polls_pass(
    cluster: MotoServer,
    front_factory: Callable[..., EksFront],
    cluster_kube: Callable[..., ClusterKube],
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


def test_node_without_efa_and_plugin_pending_on_a_taint_fail_naming_each(
    cluster: MotoServer,
    front_factory: Callable[..., EksFront],
    cluster_kube: Callable[..., ClusterKube],
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


def test_missing_nodes_are_named_not_launched(
    cluster: MotoServer,
    front_factory: Callable[..., EksFront],
    cluster_kube: Callable[..., ClusterKube],
    tmp_path: Path,
) -> None:
    kube = cluster_kube(lambda poll: ([], []))
    report = run_scale(front_factory(), kube, tmp_path, WANT, wait_s=0.2)
    assert report.exit_code == 1
    assert f"{WANT} node(s) not launched or not registered yet" in report.render()[0]


def test_failed_update_is_reported_with_its_errors_and_no_node_wait(
    cluster: MotoServer, front_factory: Callable[..., EksFront], tmp_path: Path
) -> None:
    errors = [
        {
            "errorCode": "AsgInstanceLaunchFailures",
            "errorMessage": "InsufficientInstanceCapacity",
            "resourceIds": ["asg-1"],
        }
    ]
    front = front_factory(statuses=("InProgress", "Failed"), errors=errors)
    report = run_scale(front, None, tmp_path, WANT)
    assert report.exit_code == 1
    assert report.update_status == "Failed"
    assert "AsgInstanceLaunchFailures: InsufficientInstanceCapacity (asg-1)" in report.summary()


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


def test_scale_to_zero_needs_no_kubernetes_api(
    cluster: MotoServer,
    front_factory: Callable[..., EksFront],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("trainctl.scale.POLL_S", 0.05)
    eks = boto3.client("eks", region_name=ENV.region, endpoint_url=cluster.url)
    eks.update_nodegroup_config(
        clusterName=ENV.cluster.name, nodegroupName=NODEGROUP, scalingConfig={"desiredSize": WANT}
    )
    front = front_factory()
    # A kubeconfig that does not exist: any Kubernetes call would fail the command.
    code = main(
        [
            "scale",
            "--env",
            ENV.name,
            "--group",
            GROUP.name,
            "--nodes",
            "0",
            "--json",
            "--endpoint-url",
            f"eks={front.url}",
            "--kubeconfig",
            str(tmp_path / "none"),
        ]
    )
    out, _ = capsys.readouterr()
    document = json.loads(out)
    assert code == 0, document
    assert document["update"]["status"] == "Successful"
    assert document["ready"] is None
    assert scaling(cluster)["desiredSize"] == 0


def test_unknown_group_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["scale", "--env", ENV.name, "--group", "nope", "--nodes", "1"])
    _, err = capsys.readouterr()
    assert code == 2
    assert "'nope'" in err
    assert GROUP.name in err
