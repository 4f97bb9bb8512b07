"""infra/spec/system_room.py: the system pods of workloads that may run at the same time always get a node (issue 22
#1), judged against the system nodes at min_size, their add-on pods and every placement of the other pods."""

from __future__ import annotations

import dataclasses

import pytest

from infra.spec import ENVIRONMENTS, ConfigError, Scaling, SystemNodeGroupConfig
from infra.spec.system_room import Room, SystemPod, check_system_pods_fit, system_node_room, system_node_zones

# The requests the charts give (k8s/ray_spec.py head_resources on m7i.xlarge, the submitter, the autoscaler sidecar).
HEAD_CPU, HEAD_MEMORY = 2000, 8192
SUBMITTER = SystemPod(name="RayJob qwen-finetune submitter", cpu_millis=200, memory_mib=512)


def test_a_system_nodes_room_is_allocatable_less_every_add_on_pod_that_may_land_there() -> None:
    # m7i.xlarge allocatable 3920m / 15391Mi (infra/spec/kubelet.py); DaemonSets 465m / 287Mi on every node
    # (docs/rehearsal-cluster.md); CoreDNS 2 x 100m/70Mi, CloudWatch operator 100m/64Mi, FSx CSI controller
    # 2 x 40m/136Mi, KubeRay operator 100m/512Mi, Kueue manager 500m/512Mi, the fabric gate's and the hold
    # controller 2 x 50m/64Mi: 1080m / 1628Mi, counted whole on each node.
    assert system_node_room(ENVIRONMENTS["dev"]) == Room(cpu_millis=3920 - 465 - 1080, memory_mib=15391 - 287 - 1628)
    assert system_node_zones(ENVIRONMENTS["dev"]) == ["us-west-2a", "us-west-2b"]
    assert system_node_zones(ENVIRONMENTS["prod"]) == ["us-east-2a", "us-east-2b"]  # min_size 2 of 3 zones


def test_the_heads_as_issue_22_found_them_are_refused_naming_the_pod_the_zone_and_the_fix() -> None:
    """Both heads on the claim pinned to the GPU zone, whose one system node holds one head at most."""
    pods = [
        SystemPod(name="RayCluster training head", cpu_millis=2500, memory_mib=8704, zone_pinned=True),
        SystemPod(name="RayJob qwen-finetune head", cpu_millis=HEAD_CPU, memory_mib=HEAD_MEMORY, zone_pinned=True),
        SUBMITTER,
    ]
    with pytest.raises(ConfigError) as error:
        check_system_pods_fit(ENVIRONMENTS["dev"], pods)
    assert error.value.field == "dev.system_nodes"
    assert error.value.value == "2 x m7i.xlarge"
    message = str(error.value)
    assert "RayCluster training head (2500m, 8704Mi) may use the 1 system node(s) in us-west-2a" in message
    assert "each with 2375m and 13476Mi after the add-on pods, and does not fit there even alone" in message
    assert "Fix: raise system_nodes.scaling.min_size or pick a larger system_nodes.instance_type" in message
    # Without the sidecar the RayCluster head fits alone; the RayJob head then finds the node taken.
    pods[0] = SystemPod(name="RayCluster training head", cpu_millis=HEAD_CPU, memory_mib=HEAD_MEMORY, zone_pinned=True)
    with pytest.raises(ConfigError, match=r"node 0 \(us-west-2a\) holds RayJob qwen-finetune head"):
        check_system_pods_fit(ENVIRONMENTS["dev"], pods)


def test_heads_without_the_claim_fit_one_per_node_and_a_third_head_is_refused_until_a_node_is_added() -> None:
    dev = ENVIRONMENTS["dev"]
    heads = [
        SystemPod(name="RayCluster training head", cpu_millis=HEAD_CPU, memory_mib=HEAD_MEMORY),
        SystemPod(name="RayJob qwen-finetune head", cpu_millis=HEAD_CPU, memory_mib=HEAD_MEMORY),
    ]
    check_system_pods_fit(dev, [*heads, SUBMITTER])
    third = SystemPod(name="RayJob other head", cpu_millis=HEAD_CPU, memory_mib=HEAD_MEMORY)
    with pytest.raises(ConfigError) as error:
        check_system_pods_fit(dev, [*heads, third])
    assert (
        "RayCluster training head (2000m, 8192Mi) may use the 2 system node(s), each with 2375m and 13476Mi after the "
        "add-on pods, and stays Pending when node 0 (us-west-2a) holds RayJob qwen-finetune head; node 1 (us-west-2b) "
        "holds RayJob other head"
    ) in str(error.value)
    bigger = dataclasses.replace(
        dev, system_nodes=SystemNodeGroupConfig(scaling=Scaling(min_size=3, desired_size=3, max_size=3))
    )
    check_system_pods_fit(bigger, [*heads, third, SUBMITTER])


def test_min_size_counts_not_desired_size() -> None:
    """A group that may run at 1 node must hold everything on that node."""
    dev = ENVIRONMENTS["dev"]
    one = dataclasses.replace(
        dev, system_nodes=SystemNodeGroupConfig(scaling=Scaling(min_size=1, desired_size=2, max_size=3))
    )
    heads = [
        SystemPod(name="RayCluster training head", cpu_millis=HEAD_CPU, memory_mib=HEAD_MEMORY),
        SystemPod(name="RayJob qwen-finetune head", cpu_millis=HEAD_CPU, memory_mib=HEAD_MEMORY),
    ]
    with pytest.raises(ConfigError, match=r"dev.system_nodes='1 x m7i.xlarge' is invalid"):
        check_system_pods_fit(one, heads)
