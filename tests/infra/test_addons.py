"""Cluster add-ons: pinned versions, scheduling, FSx checkpoint storage, ordering."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from gates.manifests import load_crd
from infra.spec import (
    ENVIRONMENTS,
    AddOnsConfig,
    CheckpointStorageConfig,
    ConfigError,
    LustreDeployment,
)
from infra.spec.namespaces import KUBERAY, TRAINING_NAMESPACES
from infra.spec.registries import eks_image_registry
from infra.spec.versions import HELM_CHARTS, KUBERAY_VERSION, MANAGED_ADDONS
from rehearse.manifests import yaml_documents
from tests.conftest import ROOT
from tests.helpers import helm_charts, kubernetes_objects, nodegroup, of_type, only, resolve, stack_of

EXACT_CHART_VERSION = re.compile(r"^v?\d+\.\d+\.\d+$")
EXACT_ADDON_VERSION = re.compile(r"^v\d+\.\d+\.\d+-eksbuild\.\d+$")


def _gpu_nodegroups(template: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        ng["Properties"]
        for ng in of_type(template, "AWS::EKS::Nodegroup").values()
        if ng["Properties"]["AmiType"] == "AL2023_x86_64_NVIDIA"
    ]


def _addon_id(template: dict[str, Any], name: str) -> str:
    return next(k for k, a in of_type(template, "AWS::EKS::Addon").items() if a["Properties"]["AddonName"] == name)


def _schedulable(values: dict[str, Any], nodegroup_props: dict[str, Any]) -> bool:
    """Would a pod with these values' nodeSelector and tolerations land on this node group?"""
    labels = nodegroup_props.get("Labels", {})
    if any(labels.get(k) != v for k, v in values.get("nodeSelector", {}).items()):
        return False
    for taint in nodegroup_props.get("Taints", []):
        effect = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}[
            taint["Effect"]
        ]
        tolerated = any(
            t.get("key") == taint["Key"]
            and t.get("effect", effect) == effect
            and (t.get("operator") == "Exists" or t.get("value") == taint.get("Value"))
            for t in values.get("tolerations", [])
        )
        if not tolerated:
            return False
    return True


# Versions: one place, nothing floats.


def test_every_helm_chart_is_pinned_exactly(resources: dict[str, Any], env_name: str) -> None:
    charts = helm_charts(resources[env_name])
    assert set(charts) == set(HELM_CHARTS)
    for name, props in charts.items():
        pin = HELM_CHARTS[name]
        assert props["Version"] == pin.version
        assert EXACT_CHART_VERSION.match(props["Version"]), f"{name} version floats: {props['Version']}"
        assert props["Repository"] == pin.repository
        assert props["Atomic"] is True


def test_every_managed_addon_is_pinned_exactly(resources: dict[str, Any], env_name: str) -> None:
    for addon in of_type(resources[env_name], "AWS::EKS::Addon").values():
        props = addon["Properties"]
        assert props["AddonVersion"] == MANAGED_ADDONS[props["AddonName"]]
        assert EXACT_ADDON_VERSION.match(props["AddonVersion"]), props


def test_pins_themselves_are_exact() -> None:
    for pin in HELM_CHARTS.values():
        assert EXACT_CHART_VERSION.match(pin.version), pin
    for name, version in MANAGED_ADDONS.items():
        assert EXACT_ADDON_VERSION.match(version), (name, version)


def test_kuberay_operator_matches_the_vendored_crds() -> None:
    crd_dir = ROOT / "k8s" / "crds" / f"kuberay-v{KUBERAY_VERSION}"
    assert HELM_CHARTS["kuberay-operator"].version == KUBERAY_VERSION
    kinds = {load_crd(p)["spec"]["names"]["kind"] for p in Path(crd_dir).glob("*.yaml")}
    assert kinds == {"RayCluster", "RayJob"}


# NVIDIA and EFA device plugins.


@pytest.mark.parametrize("chart", ["nvidia-device-plugin", "aws-efa-k8s-device-plugin"])
def test_device_plugins_schedule_on_every_gpu_group(resources: dict[str, Any], env_name: str, chart: str) -> None:
    """The silent zero-pod DaemonSet cannot happen: every GPU group matches the selector and taint."""
    props = helm_charts(resources[env_name])[chart]
    values = props["Values"]
    assert props["Namespace"] == "kube-system"
    assert values["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in values["tolerations"]
    groups = _gpu_nodegroups(resources[env_name])
    assert groups
    for group in groups:
        assert _schedulable(values, group), f"{chart} would not run on {group['NodegroupName']}"


@pytest.mark.parametrize("chart", ["nvidia-device-plugin", "aws-efa-k8s-device-plugin"])
def test_device_plugins_stay_off_the_system_nodes(resources: dict[str, Any], env_name: str, chart: str) -> None:
    values = helm_charts(resources[env_name])[chart]["Values"]
    system = nodegroup(resources[env_name], "system")[1]["Properties"]
    assert not _schedulable(values, system)


def test_schedulability_check_catches_a_missing_label_or_toleration(resources: dict[str, Any]) -> None:
    """The helper above must fail for the two ways the plugin silently does nothing."""
    group = _gpu_nodegroups(resources["prod"])[0]
    values = helm_charts(resources["prod"])["nvidia-device-plugin"]["Values"]
    unlabeled = {**group, "Labels": {k: v for k, v in group["Labels"].items() if k != "nvidia.com/gpu.present"}}
    assert not _schedulable(values, unlabeled)
    assert not _schedulable({**values, "tolerations": []}, group)


@pytest.mark.parametrize("chart", ["nvidia-device-plugin", "aws-efa-k8s-device-plugin"])
def test_device_plugins_live_in_platform_and_wait_for_no_gpu_group(
    stack_templates: dict[str, dict[str, Any]], env_name: str, chart: str
) -> None:
    # DaemonSets keyed on the GPU label: installed with the cluster, they run on any group's
    # nodes once those appear; no GPU stack (and no GPU capacity) is needed to install them.
    stacks = stack_templates[env_name]
    assert stack_of(stacks, helm_charts(stacks["Platform"])[chart]["LogicalId"]) == "Platform"
    for name, template in stacks.items():
        if name != "Platform":
            assert helm_charts(template) == {}, name
    depends = set(helm_charts(stacks["Platform"])[chart]["DependsOn"])
    assert not depends & set(of_type(stacks["Platform"], "AWS::EKS::Nodegroup")) - {
        nodegroup(stacks["Platform"], "system")[0]
    }


def test_efa_device_plugin_image_from_the_environment_region(resources: dict[str, Any], env_name: str) -> None:
    # prod is in us-east-2; the chart's default image is in us-west-2 (a cross-region pull over NAT).
    region = ENVIRONMENTS[env_name].region
    values = helm_charts(resources[env_name])["aws-efa-k8s-device-plugin"]["Values"]
    assert values["image"] == {
        "repository": f"602401143452.dkr.ecr.{region}.amazonaws.com/eks/aws-efa-k8s-device-plugin"
    }


def test_eks_image_registry_table() -> None:
    assert eks_image_registry("us-east-2") == "602401143452.dkr.ecr.us-east-2.amazonaws.com"
    assert eks_image_registry("af-south-1") == "877085696533.dkr.ecr.af-south-1.amazonaws.com"
    with pytest.raises(ConfigError, match=r"region='xx-moon-1'.*infra/spec/registries.py"):
        eks_image_registry("xx-moon-1")


# KubeRay operator.


def test_kuberay_operator_on_system_nodes_in_its_namespace(resources: dict[str, Any], env_name: str) -> None:
    template = resources[env_name]
    props = helm_charts(template)["kuberay-operator"]
    values = props["Values"]
    assert props["Namespace"] == KUBERAY.name
    # The namespace comes from its own manifest (with Pod Security labels), not from Helm.
    assert props.get("CreateNamespace", False) is False
    system_id, system = nodegroup(template, "system")
    assert _schedulable(values, system["Properties"])
    for group in _gpu_nodegroups(template):
        assert not _schedulable(values, group)
    assert values["resources"]["requests"] == {"cpu": "100m", "memory": "512Mi"}
    assert values["resources"]["limits"] == {"cpu": "1", "memory": "1Gi"}
    assert values["service"] == {"type": "ClusterIP"}
    namespace_id = next(
        k for k, objs in kubernetes_objects(template).items() if objs[0]["metadata"]["name"] == KUBERAY.name
    )
    assert {namespace_id, system_id} <= set(props["DependsOn"])


# Namespaces applied by CDK are the ones the cdk8s chart emits.


def test_cdk_namespaces_equal_the_cdk8s_ones(resources: dict[str, Any], env_name: str) -> None:
    import cdk8s

    from k8s.charts.namespaces import NamespacesChart

    applied = {
        objs[0]["metadata"]["name"]: objs[0]
        for objs in kubernetes_objects(resources[env_name]).values()
        if objs[0]["kind"] == "Namespace"
    }
    chart = NamespacesChart(cdk8s.Testing.app(), "ns", environment=env_name, namespaces=TRAINING_NAMESPACES)
    for emitted in cdk8s.Testing.synth(chart):
        if emitted["kind"] != "Namespace":  # the pod policy ships in the namespaces' file only
            continue
        cdk_side = applied[emitted["metadata"]["name"]]
        labels = {k: v for k, v in cdk_side["metadata"]["labels"].items() if not k.startswith("aws.cdk.eks/prune")}
        assert labels == emitted["metadata"]["labels"]
        assert cdk_side["metadata"]["annotations"] == emitted["metadata"]["annotations"]
    assert KUBERAY.name in applied
    assert applied[KUBERAY.name]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"


# FSx for Lustre checkpoint storage.


def test_fsx_in_the_gpu_zone_with_the_environment_settings(resources: dict[str, Any]) -> None:
    template = resources["prod"]
    config = ENVIRONMENTS["prod"].add_ons.checkpoint_storage
    assert config is not None
    _, fs = only(template, "AWS::FSx::FileSystem")
    props = fs["Properties"]
    subnet = template["Resources"][resolve(template, props["SubnetIds"][0])["Ref"]]["Properties"]
    assert len(props["SubnetIds"]) == 1
    assert subnet["AvailabilityZone"] == ENVIRONMENTS["prod"].gpu_availability_zone
    assert props["StorageCapacity"] == config.storage_capacity_gib
    assert props["LustreConfiguration"]["DeploymentType"] == config.deployment.value
    assert props["LustreConfiguration"]["PerUnitStorageThroughput"] == config.throughput_per_tib
    assert fs["DeletionPolicy"] == "Retain"


def test_dev_has_the_smallest_scratch_fsx(resources: dict[str, Any]) -> None:
    """Issue 17 #3: multi-node jobs need one checkpoint directory every pod sees, dev included."""
    _, fs = only(resources["dev"], "AWS::FSx::FileSystem")
    assert fs["Properties"]["StorageCapacity"] == 1200
    assert fs["Properties"]["LustreConfiguration"]["DeploymentType"] == "SCRATCH_2"
    assert "PerUnitStorageThroughput" not in fs["Properties"]["LustreConfiguration"]
    names = {a["Properties"]["AddonName"] for a in of_type(resources["dev"], "AWS::EKS::Addon").values()}
    assert "aws-fsx-csi-driver" in names


NODE_SG = {"Fn::GetAtt": ["EksClusterB2BDED5B", "ClusterSecurityGroupId"]}


def _rules(template: dict[str, Any], kind: str, group: Any) -> set[tuple[Any, ...]]:
    """(protocol, from, to, peer) of every inline and separate `kind` rule of `group`."""
    inline_key = "SecurityGroupIngress" if kind == "Ingress" else "SecurityGroupEgress"
    peer_key = "SourceSecurityGroupId" if kind == "Ingress" else "DestinationSecurityGroupId"
    found = []
    for logical_id, res in template["Resources"].items():
        if res["Type"] == "AWS::EC2::SecurityGroup" and {"Fn::GetAtt": [logical_id, "GroupId"]} == group:
            found += res["Properties"].get(inline_key, [])
        if res["Type"] == f"AWS::EC2::SecurityGroup{kind}" and resolve(template, res["Properties"]["GroupId"]) == group:
            found.append(res["Properties"])
    return {
        (r["IpProtocol"], r["FromPort"], r["ToPort"], json.dumps(resolve(template, r.get(peer_key)), sort_keys=True))
        for r in found
    }


def test_fsx_security_group_admits_lustre_from_the_nodes_only(resources: dict[str, Any]) -> None:
    template = resources["prod"]
    _, fs = only(template, "AWS::FSx::FileSystem")
    sg_ref = fs["Properties"]["SecurityGroupIds"][0]
    sg = template["Resources"][sg_ref["Fn::GetAtt"][0]]["Properties"]
    node, own = json.dumps(NODE_SG, sort_keys=True), json.dumps(sg_ref, sort_keys=True)
    lustre = {(988, 988), (1018, 1023)}
    assert _rules(template, "Ingress", sg_ref) == {("tcp", a, b, peer) for a, b in lustre for peer in (node, own)}
    assert _rules(template, "Egress", sg_ref) == {("tcp", a, b, peer) for a, b in lustre for peer in (node, own)}
    assert not any("CidrIp" in r for r in sg.get("SecurityGroupIngress", []))
    # No allow-all egress on the file system's group.
    assert not any(r.get("CidrIp") == "0.0.0.0/0" for r in sg.get("SecurityGroupEgress", []))


@pytest.mark.parametrize("env", ["dev", "prod"])  # both have checkpoint storage (issue 17: shared checkpoints)
def test_nodes_admit_lustre_from_the_file_servers(resources: dict[str, Any], env: str) -> None:
    # Client side (FSx Lustre guide, "limit access with security groups"): the file servers call
    # the clients back, so the nodes' (cluster) security group admits 988 and 1018-1023 from them.
    template = resources[env]
    _, fs = only(template, "AWS::FSx::FileSystem")
    own = json.dumps(fs["Properties"]["SecurityGroupIds"][0], sort_keys=True)
    from_fsx = {rule for rule in _rules(template, "Ingress", NODE_SG) if rule[3] == own}
    assert from_fsx == {("tcp", 988, 988, own), ("tcp", 1018, 1023, own)}


def test_fsx_waits_for_every_one_of_its_security_group_rules(stack_templates: dict[str, dict[str, Any]]) -> None:
    # CreateFileSystem checks the group's rules; a rule created after it fails the create.
    template = stack_templates["prod"]["Storage"]
    _fs_id, fs = only(template, "AWS::FSx::FileSystem")
    sg_ref = fs["Properties"]["SecurityGroupIds"][0]
    rules = {
        logical_id
        for logical_id, res in template["Resources"].items()
        if res["Type"] in ("AWS::EC2::SecurityGroupIngress", "AWS::EC2::SecurityGroupEgress")
        and (sg_ref in (res["Properties"]["GroupId"], res["Properties"].get("SourceSecurityGroupId")))
    }
    # Self-referencing ingress and egress (2 + 2) and the client-side ingress (2); the rules to and
    # from the node group are inline in the group, which the file system references.
    assert len(rules) == 6
    assert rules <= set(fs["DependsOn"])
    assert sg_ref["Fn::GetAtt"][0] in fs["DependsOn"]


def test_fsx_csi_driver_with_pod_identity(resources: dict[str, Any]) -> None:
    template = resources["prod"]
    (props,) = [  # the CloudWatch agent has one too (tests/infra/test_observability.py)
        a["Properties"]
        for a in of_type(template, "AWS::EKS::PodIdentityAssociation").values()
        if a["Properties"]["Namespace"] == "kube-system"
    ]
    assert (props["Namespace"], props["ServiceAccount"]) == ("kube-system", "fsx-csi-controller-sa")
    role = template["Resources"][props["RoleArn"]["Fn::GetAtt"][0]]["Properties"]
    statement = role["AssumeRolePolicyDocument"]["Statement"][0]
    assert statement["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert sorted(statement["Action"]) == ["sts:AssumeRole", "sts:TagSession"]
    policies = [
        p["Properties"]["PolicyDocument"]["Statement"]
        for p in of_type(template, "AWS::IAM::Policy").values()
        if p["Properties"]["Roles"] == [{"Ref": props["RoleArn"]["Fn::GetAtt"][0]}]
    ]
    assert policies == [[{"Action": "fsx:DescribeFileSystems", "Effect": "Allow", "Resource": "*"}]]
    addon_id = next(
        k
        for k, a in of_type(template, "AWS::EKS::Addon").items()
        if a["Properties"]["AddonName"] == "aws-fsx-csi-driver"
    )
    association_id = next(
        k
        for k, a in of_type(template, "AWS::EKS::PodIdentityAssociation").items()
        if a["Properties"]["Namespace"] == "kube-system"
    )
    assert association_id in template["Resources"][addon_id]["DependsOn"]


def test_fsx_csi_controller_is_told_its_region(resources: dict[str, Any], env_name: str) -> None:
    """The controller is not on the host network: with the nodes' IMDS hop limit of 1 it cannot read its region
    from IMDS, and its Kubernetes-API fallback yields none on EC2 (infra/addons/fsx_checkpoints.py)."""
    (addon,) = [
        a["Properties"]
        for a in of_type(resources[env_name], "AWS::EKS::Addon").values()
        if a["Properties"]["AddonName"] == "aws-fsx-csi-driver"
    ]
    config = json.loads(addon["ConfigurationValues"])  # a plain JSON string, no tokens
    assert config == {"controller": {"region": ENVIRONMENTS[env_name].region}}


@pytest.mark.parametrize("env_name", ["dev", "prod"])
def test_checkpoint_claims_bind_the_fsx_volumes(resources: dict[str, Any], env_name: str) -> None:
    """A claim per workload namespace (`training` for NVRx, `ray` for Ray Train's storage_path: issue 17 #2), each
    bound to its own static volume of the one file system (a claim binds one volume and lives in one namespace)."""
    template = resources[env_name]
    config = ENVIRONMENTS[env_name].add_ons.checkpoint_storage
    assert config is not None
    manifests = kubernetes_objects(template)
    claim_id, objects = next((k, objs) for k, objs in manifests.items() if objs[0]["kind"] == "StorageClass")
    (storage_class,) = [o for o in objects if o["kind"] == "StorageClass"]
    volumes = {o["metadata"]["name"]: o for o in objects if o["kind"] == "PersistentVolume"}
    claims = {o["metadata"]["namespace"]: o for o in objects if o["kind"] == "PersistentVolumeClaim"}
    assert sorted(claims) == ["ray", "training"]
    # Named after the file system's zone (a zone move replaces it: infra/spec/replacement_names.py).
    zone = ENVIRONMENTS[env_name].gpu_availability_zone
    assert sorted(volumes) == [f"{env_name}-checkpoints-{zone}", f"{env_name}-checkpoints-{zone}-ray"]
    assert storage_class["provisioner"] == "fsx.csi.aws.com"
    assert storage_class["reclaimPolicy"] == "Retain"
    for namespace, claim in claims.items():
        volume = volumes[claim["spec"]["volumeName"]]
        spec = volume["spec"]
        assert spec["csi"]["driver"] == "fsx.csi.aws.com"
        assert spec["csi"]["volumeHandle"] == "<token>"
        assert set(spec["csi"]["volumeAttributes"]) == {"dnsname", "mountname"}
        assert spec["accessModes"] == ["ReadWriteMany"]
        assert spec["persistentVolumeReclaimPolicy"] == "Retain"
        zone = spec["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]
        assert zone == {
            "key": "topology.kubernetes.io/zone",
            "operator": "In",
            "values": [ENVIRONMENTS[env_name].gpu_availability_zone],
        }
        assert claim["metadata"] == {
            "name": config.claim_name,
            "namespace": namespace,
            "labels": claim["metadata"]["labels"],
        }
        assert claim["spec"]["storageClassName"] == storage_class["metadata"]["name"] == spec["storageClassName"]
        assert claim["spec"]["resources"]["requests"]["storage"] == f"{config.storage_capacity_gib}Gi"
    depends = set(template["Resources"][claim_id]["DependsOn"])
    fs_id, _ = only(template, "AWS::FSx::FileSystem")
    # The training namespace is in Platform: the Storage stack as a whole follows it.
    # The file system is ordered by the Ref inside the manifest, not by an explicit DependsOn.
    assert fs_id not in depends
    assert {"Ref": fs_id} in template["Resources"][claim_id]["Properties"]["Manifest"]["Fn::Join"][1]
    csi = next(
        k
        for k, a in of_type(template, "AWS::EKS::Addon").items()
        if a["Properties"]["AddonName"] == "aws-fsx-csi-driver"
    )
    assert csi in depends


def test_node_monitoring_agent(resources: dict[str, Any], env_name: str) -> None:
    names = {a["Properties"]["AddonName"] for a in of_type(resources[env_name], "AWS::EKS::Addon").values()}
    assert "eks-node-monitoring-agent" in names
    for ng in of_type(resources[env_name], "AWS::EKS::Nodegroup").values():
        assert ng["Properties"]["NodeRepairConfig"] == {"Enabled": True}


# Nothing is exposed outside the cluster.


def _services(obj: Any) -> list[dict[str, Any]]:
    found = []
    if isinstance(obj, dict):
        if obj.get("kind") == "Service" or ("type" in obj and obj.get("type") in ("LoadBalancer", "NodePort")):
            found.append(obj)
        for value in obj.values():
            found += _services(value)
    elif isinstance(obj, list):
        for value in obj:
            found += _services(value)
    return found


def test_no_load_balancer_or_node_port_anywhere(resources: dict[str, Any], env_name: str, dist: Path) -> None:
    template = resources[env_name]
    everything: list[Any] = [props["Values"] for props in helm_charts(template).values()]
    everything += list(kubernetes_objects(template).values())
    files = sorted((dist / env_name).glob("*.yaml"))
    assert files
    everything += [(yaml_documents(p.read_text())) for p in files]
    for item in _services(everything):
        assert item.get("type", "ClusterIP") == "ClusterIP", item
        assert item.get("spec", {}).get("type", "ClusterIP") == "ClusterIP", item


def test_the_exposure_check_catches_a_load_balancer() -> None:
    assert _services({"service": {"type": "LoadBalancer"}})
    assert _services([{"kind": "Service", "spec": {"type": "NodePort"}}])


# Bad input.


def test_fsx_without_gpu_groups_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        dataclasses.replace(
            ENVIRONMENTS["prod"],
            gpu_node_groups=(),
            add_ons=AddOnsConfig(
                nvidia_device_plugin=False, efa_device_plugin=False, checkpoint_storage=CheckpointStorageConfig()
            ),
        )
    assert "add_ons.checkpoint_storage='enabled'" in str(err.value)
    assert "GPU node groups' zone" in str(err.value)


@pytest.mark.parametrize("plugin", ["nvidia_device_plugin", "efa_device_plugin"])
def test_device_plugin_without_gpu_groups_is_refused(plugin: str) -> None:
    add_ons = AddOnsConfig(
        nvidia_device_plugin=plugin == "nvidia_device_plugin", efa_device_plugin=plugin == "efa_device_plugin"
    )
    with pytest.raises(ConfigError, match=rf"add_ons.{plugin}='enabled'"):
        dataclasses.replace(ENVIRONMENTS["dev"], gpu_node_groups=(), add_ons=add_ons)


def test_cpu_only_environment_with_plugins_off_is_accepted() -> None:
    env = dataclasses.replace(
        ENVIRONMENTS["dev"],
        gpu_node_groups=(),
        add_ons=AddOnsConfig(nvidia_device_plugin=False, efa_device_plugin=False),
    )
    assert env.gpu_node_groups == ()


@pytest.mark.parametrize("capacity", [1000, 3600, 4000])
def test_fsx_capacity_must_be_a_lustre_size(capacity: int) -> None:
    with pytest.raises(ConfigError, match=rf"storage_capacity_gib={capacity}"):
        CheckpointStorageConfig(storage_capacity_gib=capacity)


def test_fsx_throughput_rules() -> None:
    with pytest.raises(ConfigError, match=r"throughput_per_tib=200"):
        CheckpointStorageConfig(throughput_per_tib=200)
    with pytest.raises(ConfigError, match=r"None for SCRATCH_2"):
        CheckpointStorageConfig(deployment=LustreDeployment.SCRATCH_2, throughput_per_tib=250)
    assert CheckpointStorageConfig(deployment=LustreDeployment.SCRATCH_2, throughput_per_tib=None)
