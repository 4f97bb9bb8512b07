"""k8s/queueing.py: the queue label, the queue objects and their quotas, the flavor each pod gets."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gates.manifests import check_objects
from infra.spec import ENVIRONMENTS, ConfigError
from infra.spec.scheduling import SYSTEM_NODE_SELECTOR, gpu_group_selector
from k8s.queueing import (
    QUEUE_LABEL,
    cluster_queue,
    gpu_quota,
    group_nodes,
    local_queue_name,
    queue_labels,
    queue_objects,
    quota_nodes,
)


def _by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def _flavor_fits(selector: dict[str, str], flavor: dict[str, Any]) -> bool:
    """Kueue's rule (docs concepts/resource_flavor.md): a PodSet's nodeSelector must not contradict
    the flavor's nodeLabels on any key they share."""
    labels = flavor["spec"].get("nodeLabels", {})
    return all(labels[k] == v for k, v in selector.items() if k in labels)


def test_queue_label_is_kueues() -> None:
    assert QUEUE_LABEL == "kueue.x-k8s.io/queue-name"
    prod = ENVIRONMENTS["prod"]
    assert queue_labels(prod, "p5") == {QUEUE_LABEL: "p5"}
    assert queue_labels(prod, "g6") == {QUEUE_LABEL: "g6"}
    # The label names a LocalQueue that exists in every workload namespace.
    local = [o for o in queue_objects(prod) if o["kind"] == "LocalQueue"]
    assert {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in local} == {
        (ns, g) for ns in ("ray", "training") for g in ("p5", "g6")
    }


def test_queue_label_for_an_unknown_group_names_the_field_and_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"queue group='h100'.*allowed: g6, p5.*prod's GPU node groups"):
        queue_labels(ENVIRONMENTS["prod"], "h100")


def _quotas(queues: dict[str, dict[str, Any]], name: str) -> dict[str, dict[str, str]]:
    (group,) = queues[name]["spec"]["resourceGroups"]
    assert group["coveredResources"] == ["cpu", "memory", "nvidia.com/gpu", "vpc.amazonaws.com/efa"]
    return {f["name"]: {r["name"]: r["nominalQuota"] for r in f["resources"]} for f in group["flavors"]}


def test_prod_quotas_as_deployed_cover_the_desired_size_of_each_group() -> None:
    """Issue 22 #5: the quota follows the nodes that exist; prod deploys every GPU group at desired_size 0, so
    nothing is admitted onto a GPU group until `trainctl scale` brings nodes up and raises its quota."""
    prod = ENVIRONMENTS["prod"]
    assert group_nodes(prod) == {"p5": 0, "g6": 0}
    queues = _by_kind(queue_objects(prod), "ClusterQueue")
    zero = {"cpu": "0", "memory": "0Gi", "nvidia.com/gpu": "0", "vpc.amazonaws.com/efa": "0"}
    assert _quotas(queues, "gpu-p5")["gpu-p5"] == zero
    assert _quotas(queues, "gpu-g6")["gpu-g6"] == zero


def test_prod_quotas_of_groups_scaled_to_max_size() -> None:
    # Written out from the instance facts: p5.48xlarge 192 vCPU, 2048 GiB, 8 GPUs, 32 EFA, max 8;
    # g6.12xlarge 48 vCPU, 192 GiB, 4 GPUs, 1 EFA, max 4; workers get 5/6 of CPU and memory.
    prod = ENVIRONMENTS["prod"]
    queues = _by_kind(queue_objects(prod, {"p5": 8, "g6": 4}), "ClusterQueue")
    assert set(queues) == {"gpu-p5", "gpu-g6"}

    def quotas(name: str) -> dict[str, dict[str, str]]:
        return _quotas(queues, name)

    system = {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "0", "vpc.amazonaws.com/efa": "0"}
    assert quotas("gpu-p5") == {
        "system": system,
        "gpu-p5": {"cpu": "1280", "memory": "13648Gi", "nvidia.com/gpu": "64", "vpc.amazonaws.com/efa": "256"},
    }
    assert quotas("gpu-g6") == {
        "system": system,
        "gpu-g6": {"cpu": "160", "memory": "640Gi", "nvidia.com/gpu": "16", "vpc.amazonaws.com/efa": "4"},
    }
    # The system flavor comes first: a pod without a selector (KubeRay's submitter) takes it.
    assert [f["name"] for f in queues["gpu-p5"]["spec"]["resourceGroups"][0]["flavors"]] == ["system", "gpu-p5"]


@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_whole_node_pods_of_n_nodes_fit_and_one_more_does_not(nodes: int) -> None:
    """A quota for N nodes admits exactly N whole-node pods of the group (what gpu_pod_parts requests)."""
    from k8s.ray_spec import gpu_pod_parts

    for group in ENVIRONMENTS["prod"].gpu_node_groups:
        requests = gpu_pod_parts(group).resources["requests"]
        quota = gpu_quota(group, nodes)
        assert quota_nodes(group, quota.gpus) == nodes
        assert int(requests["nvidia.com/gpu"]) * nodes == quota.gpus
        assert int(requests["vpc.amazonaws.com/efa"]) * nodes == quota.efa
        assert int(requests["cpu"]) * nodes <= quota.cpu < int(requests["cpu"]) * (nodes + 1)
        memory = int(requests["memory"].removesuffix("Gi"))
        assert memory * nodes <= quota.memory_gib < memory * (nodes + 1)


def test_each_pod_gets_the_flavor_of_its_nodes() -> None:
    prod = ENVIRONMENTS["prod"]
    flavors = _by_kind(queue_objects(prod), "ResourceFlavor")
    assert set(flavors) == {"system", "gpu-p5", "gpu-g6"}
    head = dict(SYSTEM_NODE_SELECTOR)
    p5_worker = gpu_group_selector("p5")
    assert _flavor_fits(head, flavors["system"])
    assert not _flavor_fits(head, flavors["gpu-p5"])
    assert _flavor_fits(p5_worker, flavors["gpu-p5"])
    assert not _flavor_fits(p5_worker, flavors["system"])
    assert not _flavor_fits(p5_worker, flavors["gpu-g6"])
    assert flavors["gpu-p5"]["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]


def test_a_quota_beyond_the_group_or_a_scale_of_an_unknown_group_is_refused() -> None:
    prod = ENVIRONMENTS["prod"]
    p5 = prod.gpu_node_groups[0]
    with pytest.raises(ConfigError, match=r"quota nodes of p5=9.*0 to the group's max_size \(8\)"):
        gpu_quota(p5, 9)
    assert group_nodes(prod, {"g6": 3}) == {"p5": 0, "g6": 3}


def test_cluster_queues_admit_only_the_workload_namespaces() -> None:
    queue = cluster_queue(ENVIRONMENTS["prod"], ENVIRONMENTS["prod"].gpu_node_groups[0], 0)
    (expression,) = queue["spec"]["namespaceSelector"]["matchExpressions"]
    assert expression == {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["ray", "training"]}
    assert queue["spec"]["queueingStrategy"] == "StrictFIFO"


@pytest.mark.parametrize("env_name", sorted(ENVIRONMENTS))
def test_queue_objects_match_the_vendored_kueue_crds(env_name: str) -> None:
    environment = ENVIRONMENTS[env_name]
    scaled = {g.name: g.scaling.max_size for g in environment.gpu_node_groups}
    for objects in (queue_objects(environment), queue_objects(environment, scaled)):
        assert objects, env_name
        assert check_objects((f"queues/{env_name}", o) for o in objects) == []


def test_the_manifests_gate_validates_kueue_objects_strictly() -> None:
    prod = ENVIRONMENTS["prod"]
    queue = cluster_queue(prod, prod.gpu_node_groups[0], 0)
    queue["spec"]["queueingStrategy"] = "Fifo"
    queue["spec"]["resourceGroup"] = []
    messages = [f.message for f in check_objects([("queues", queue)])]
    assert any("ClusterQueue does not match the Kueue 0.19.2 CRD at spec.queueingStrategy" in m for m in messages)
    assert any("spec" in m and "'resourceGroup' was unexpected" in m for m in messages), messages
    local: dict[str, Any] = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": local_queue_name("p5"), "namespace": "ray"},
        "spec": {"clusterQueues": "gpu-p5"},
    }
    assert any("LocalQueue does not match the Kueue" in f.message for f in check_objects([("q", local)]))


def test_a_ray_job_mixing_gpu_types_fits_no_single_queue() -> None:
    """A workload names one LocalQueue, hence one ClusterQueue, whose flavors are `system` and its own
    group's: a worker group of the other GPU type has no flavor there, so Kueue never admits it
    (one GPU type per Ray job, issue 17 #5)."""
    prod = ENVIRONMENTS["prod"]
    flavors = _by_kind(queue_objects(prod), "ResourceFlavor")
    for queue in _by_kind(queue_objects(prod), "ClusterQueue").values():
        names = [f["name"] for f in queue["spec"]["resourceGroups"][0]["flavors"]]
        fitting = {
            g.name
            for g in prod.gpu_node_groups
            if any(_flavor_fits(gpu_group_selector(g.name), flavors[n]) for n in names)
        }
        assert len(fitting) == 1, (queue["metadata"]["name"], fitting)


def test_every_gpu_workload_in_dist_is_admitted_through_its_groups_queue(dist: Path) -> None:
    """Issue 17 (5): whole-node workloads queue in Kueue instead of starving each other. Every Job, RayJob and
    RayCluster that asks for GPUs carries the LocalQueue label of the one GPU group its pods select, on its own
    metadata (Kueue reads the job's label, not the pod template's). None autoscales (issue 22 #3): an elastic job's
    scale-up slices would skip waitForPodsReady."""
    from gates import outputs
    from k8s.queueing import ELASTIC_JOB_ANNOTATION

    seen = []
    for where, obj in outputs.manifests(dist):
        if obj.get("kind") not in ("Job", "RayJob", "RayCluster"):
            continue
        text = json.dumps(obj.get("spec", {}))
        if '"nvidia.com/gpu"' not in text:
            continue
        groups = set(re.findall(r'"platform/gpu-group": "([a-z0-9-]+)"', text))
        assert len(groups) == 1, f"{where}: pods select {sorted(groups)}: one GPU group per workload"
        labels = obj["metadata"].get("labels", {})
        assert labels.get(QUEUE_LABEL) == local_queue_name(groups.pop()), f"{where}: {labels}"
        assert ELASTIC_JOB_ANNOTATION not in obj["metadata"].get("annotations", {}), where
        assert obj["spec"].get("enableInTreeAutoscaling", False) is False, where
        seen.append(obj["kind"])
    assert sorted(set(seen)) == ["Job", "RayCluster", "RayJob"]
