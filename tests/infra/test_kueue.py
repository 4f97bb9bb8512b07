"""Kueue: the pinned OCI chart on the system nodes, its manager configuration, the queues CDK applies."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gates.manifests import load_crd
from infra.spec import ENVIRONMENTS, AddOnsConfig, ConfigError
from infra.spec.kueue import KUEUE, KueueProps, frameworks, manager_config
from infra.spec.namespaces import TRAINING_NAMESPACES
from infra.spec.versions import HELM_CHARTS, KUEUE_VERSION
from k8s.queueing import queue_objects
from tests.conftest import ROOT
from tests.helpers import helm_charts, kubernetes_objects, nodegroup, without_prune_label


def _manifest_id(template: dict[str, Any], kind: str, name: str) -> str:
    return next(
        k
        for k, objs in kubernetes_objects(template).items()
        if any(o["kind"] == kind and o["metadata"]["name"] == name for o in objs)
    )


def test_chart_is_the_oci_artifact_of_the_pinned_release() -> None:
    pin = HELM_CHARTS["kueue"]
    assert pin.repository == "oci://registry.k8s.io/kueue/charts/kueue"
    assert pin.chart == "kueue"
    assert pin.version == KUEUE_VERSION
    kinds = {load_crd(p)["spec"]["names"]["kind"] for p in (ROOT / "k8s" / "crds").glob("kueue-*/*")}
    assert kinds == {"ClusterQueue", "LocalQueue", "ResourceFlavor"}
    assert [p.name for p in (ROOT / "k8s" / "crds").glob("kueue-*")] == [f"kueue-v{KUEUE_VERSION}"]


def _platform(stack_templates: dict[str, dict[str, Any]], env_name: str) -> dict[str, Any]:
    return stack_templates[env_name]["Platform"]


def test_kueue_in_platform_on_system_nodes_after_kuberay(
    stack_templates: dict[str, dict[str, Any]], env_name: str
) -> None:
    template = _platform(stack_templates, env_name)
    props = helm_charts(template)["kueue"]
    assert props["Repository"] == HELM_CHARTS["kueue"].repository
    assert props["Version"] == KUEUE_VERSION
    assert props["Namespace"] == KUEUE.name
    assert props.get("CreateNamespace", False) is False
    assert all("kueue" not in helm_charts(t) for name, t in stack_templates[env_name].items() if name != "Platform")
    manager = props["Values"]["controllerManager"]
    system_id, system = nodegroup(template, "system")
    assert all(system["Properties"]["Labels"].get(k) == v for k, v in manager["nodeSelector"].items())
    assert manager["nodeSelector"] == {"role": "system"}
    namespace_id = _manifest_id(template, "Namespace", KUEUE.name)
    kuberay = helm_charts(template)["kuberay-operator"]["LogicalId"]
    assert {namespace_id, system_id, kuberay} <= set(props["DependsOn"])
    namespace = kubernetes_objects(template)[namespace_id][0]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"


def test_manager_configuration_in_the_release(stack_templates: dict[str, dict[str, Any]], env_name: str) -> None:
    values = helm_charts(_platform(stack_templates, env_name))["kueue"]["Values"]
    config = yaml.safe_load(values["managerConfig"]["controllerManagerConfigYaml"])
    assert config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert config["kind"] == "Configuration"
    assert config["integrations"]["frameworks"] == ["batch/job", "ray.io/rayjob", "ray.io/raycluster"]
    assert config["manageJobsWithoutQueueName"] is False
    assert config["waitForPodsReady"] == {
        "timeout": "20m",
        "recoveryTimeout": "31m",
        # Off: it is global in Kueue v0.19.2, and the quota covers the nodes that exist (issue 22 #5).
        "blockAdmission": False,
        "requeuingStrategy": {"timestamp": "Creation", "backoffLimitCount": 3},
    }
    # The chart's own settings the manager needs are still there (the value replaces the whole document).
    assert config["webhook"] == {"port": 9443}
    assert config["health"] == {"healthProbeBindAddress": ":8081"}
    assert config["leaderElection"]["leaderElect"] is True
    assert values["metricsService"] == {"type": "ClusterIP"}


def test_queues_applied_after_the_chart_and_the_workload_namespaces(
    stack_templates: dict[str, dict[str, Any]], env_name: str
) -> None:
    template = _platform(stack_templates, env_name)
    environment = ENVIRONMENTS[env_name]
    applied = [
        (k, objs)
        for name, stack in stack_templates[env_name].items()
        for k, objs in kubernetes_objects(stack).items()
        if objs[0]["apiVersion"].startswith("kueue.x-k8s.io/")
    ]
    assert len(applied) == 1
    queues_id, objects = applied[0]
    assert queues_id in template["Resources"]
    assert [without_prune_label(o) for o in objects] == queue_objects(environment)
    assert {o["metadata"]["name"] for o in objects if o["kind"] == "ClusterQueue"} == {
        f"gpu-{g.name}" for g in environment.gpu_node_groups
    }
    depends = set(template["Resources"][queues_id].get("DependsOn", []))
    assert helm_charts(template)["kueue"]["LogicalId"] in depends
    for ns in TRAINING_NAMESPACES:
        assert _manifest_id(template, "Namespace", ns.name) in depends


def test_ray_integrations_only_with_the_kuberay_operator() -> None:
    assert frameworks(KueueProps(ray_integrations=False)) == ["batch/job"]
    config = manager_config(KueueProps(ray_integrations=False, block_admission=True))
    assert config["integrations"]["frameworks"] == ["batch/job"]
    assert config["waitForPodsReady"]["blockAdmission"] is True


def test_kueue_is_switchable_and_on_by_default() -> None:
    assert AddOnsConfig().kueue is True
    assert AddOnsConfig(kueue=False).kueue is False


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("pods_ready_timeout_minutes", 0, r"kueue.pods_ready_timeout_minutes=0 is invalid; allowed: 1 to 1440"),
        ("recovery_timeout_minutes", 2000, r"kueue.recovery_timeout_minutes=2000 is invalid"),
        ("requeue_limit", -1, r"kueue.requeue_limit=-1 is invalid; allowed: 0 to 100"),
    ],
)
def test_bad_kueue_props_name_the_field(field: str, value: int, message: str) -> None:
    kwargs: dict[str, Any] = {field: value}
    with pytest.raises(ConfigError, match=message):
        KueueProps(**kwargs)
