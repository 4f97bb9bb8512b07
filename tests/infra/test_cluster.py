"""The EKS control plane: version, private endpoint, logging, encryption, access, add-ons."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import aws_cdk as cdk
from aws_cdk.assertions import Template

from infra.cluster import ADDONS_BEFORE_NODES, CLUSTER_ADMIN_POLICY
from infra.spec import ENVIRONMENTS, ClusterConfig, EndpointAccess
from infra.spec.replacement_names import gpu_nodegroup_name, system_nodegroup_name
from infra.spec.versions import CORE_ADDONS, KUBERNETES_VERSION, MANAGED_ADDONS
from infra.stage import PlatformStage
from tests.conftest import cdk_json_context
from tests.helpers import managed_policy_names, node_role_of, nodegroup, of_type, only


def _cluster(resources: dict[str, Any], env_name: str) -> dict[str, Any]:
    return only(resources[env_name], "AWS::EKS::Cluster")[1]["Properties"]


def test_version_and_name(resources: dict[str, Any], env_name: str) -> None:
    props = _cluster(resources, env_name)
    assert props["Version"] == KUBERNETES_VERSION
    assert props["Name"] == ENVIRONMENTS[env_name].cluster.name


def test_endpoint_private_by_default(resources: dict[str, Any], env_name: str) -> None:
    vpc_config = _cluster(resources, env_name)["ResourcesVpcConfig"]
    assert vpc_config["EndpointPrivateAccess"] is True
    assert vpc_config["EndpointPublicAccess"] is False
    assert "PublicAccessCidrs" not in vpc_config


def test_control_plane_enis_in_private_subnets(resources: dict[str, Any], env_name: str) -> None:
    template = resources[env_name]
    private = {
        k
        for k, v in of_type(template, "AWS::EC2::Subnet").items()
        if {"Key": "aws-cdk:subnet-type", "Value": "Private"} in v["Properties"]["Tags"]
    }
    subnet_refs = {ref["Ref"] for ref in _cluster(resources, env_name)["ResourcesVpcConfig"]["SubnetIds"]}
    assert subnet_refs == private


def test_all_five_control_plane_log_types(resources: dict[str, Any], env_name: str) -> None:
    enabled = _cluster(resources, env_name)["Logging"]["ClusterLogging"]["EnabledTypes"]
    assert sorted(t["Type"] for t in enabled) == sorted(
        ["api", "audit", "authenticator", "controllerManager", "scheduler"]
    )


def test_control_plane_log_retention_set_before_the_cluster(resources: dict[str, Any], env_name: str) -> None:
    # The group EKS writes to is not owned by the stack: a custom resource creates it when missing,
    # adopts it when it exists (a retry after a rollback, a re-created environment) and sets the
    # retention, before the cluster starts logging.
    config = ENVIRONMENTS[env_name].cluster
    template = resources[env_name]
    retention_id, retention = only(template, "Custom::LogRetention")
    assert retention["Properties"]["LogGroupName"] == f"/aws/eks/{config.name}/cluster"
    assert retention["Properties"]["RetentionInDays"] == config.control_plane_log_retention_days
    assert retention["Properties"].get("RemovalPolicy", "retain") == "retain"
    _cluster_id, cluster = only(template, "AWS::EKS::Cluster")
    assert retention_id in cluster["DependsOn"]


def _fixed(name: Any) -> bool:
    """A physical name the next create would collide with: no Ref/GetAtt of a resource whose own
    name CloudFormation generates (the kubectl Lambda's `/aws/lambda/<generated function name>`)."""
    text = json.dumps(name)
    return name is not None and '"Ref"' not in text and '"Fn::GetAtt"' not in text


def test_no_retained_log_group_under_a_fixed_name(resources: dict[str, Any], env_name: str) -> None:
    # A retained group with a fixed name outlives a rollback or a destroy and makes the next
    # create fail with "already exists"; generated names (the flow-log group) do not collide.
    for logical_id, group in of_type(resources[env_name], "AWS::Logs::LogGroup").items():
        fixed = _fixed(group["Properties"].get("LogGroupName"))
        assert not (fixed and group.get("DeletionPolicy") == "Retain"), logical_id


def test_fixed_name_check_catches_the_old_control_plane_group() -> None:
    assert _fixed("/aws/eks/ml-prod/cluster")
    assert not _fixed({"Fn::Join": ["", ["/aws/lambda/", {"Ref": "Handler"}]]})
    assert not _fixed(None)


def test_no_retained_resource_under_a_fixed_name(resources: dict[str, Any], env_name: str) -> None:
    # The same retry problem for any other retained resource: none carries a fixed physical name.
    name_keys = {"AWS::KMS::Alias": "AliasName", "AWS::FSx::FileSystem": "FileSystemName"}
    assert of_type(resources[env_name], "AWS::KMS::Alias") == {}
    for logical_id, res in resources[env_name]["Resources"].items():
        if res.get("DeletionPolicy") == "Retain":
            key = name_keys.get(res["Type"], "LogGroupName")
            assert not _fixed(res.get("Properties", {}).get(key)), logical_id


def test_secrets_encrypted_with_a_rotating_customer_key(resources: dict[str, Any], env_name: str) -> None:
    # The environment also has the alarm topic's key (infra/monitoring.py): take the one the cluster names.
    key_id = _cluster(resources, env_name)["EncryptionConfig"][0]["Provider"]["KeyArn"]["Fn::GetAtt"][0]
    key = resources[env_name]["Resources"][key_id]
    assert key["Properties"]["EnableKeyRotation"] is True
    assert key["DeletionPolicy"] == "Retain"
    encryption = _cluster(resources, env_name)["EncryptionConfig"]
    assert encryption == [{"Provider": {"KeyArn": {"Fn::GetAtt": [key_id, "Arn"]}}, "Resources": ["secrets"]}]


def test_api_authentication_without_creator_admin(resources: dict[str, Any], env_name: str) -> None:
    assert _cluster(resources, env_name)["AccessConfig"] == {
        "AuthenticationMode": "API",
        "BootstrapClusterCreatorAdminPermissions": False,
    }


def test_no_auto_mode_and_no_default_capacity(resources: dict[str, Any], env_name: str) -> None:
    props = _cluster(resources, env_name)
    assert props["ComputeConfig"] == {"Enabled": False}
    assert props["BootstrapSelfManagedAddons"] is False
    # Node groups are ours alone: the system group and one per declared GPU group.
    env = ENVIRONMENTS[env_name]
    nodegroups = of_type(resources[env_name], "AWS::EKS::Nodegroup")
    assert sorted(n["Properties"]["NodegroupName"] for n in nodegroups.values()) == sorted(
        [system_nodegroup_name(env), *(gpu_nodegroup_name(env, g) for g in env.gpu_node_groups)]
    )


def test_admin_access_entries_come_from_the_environment(resources: dict[str, Any], env_name: str) -> None:
    entries = of_type(resources[env_name], "AWS::EKS::AccessEntry")
    principals = [str(e["Properties"]["PrincipalArn"]) for e in entries.values()]
    for admin in ENVIRONMENTS[env_name].cluster.admin_principals:
        assert sum(f":role/{admin}" in p for p in principals) == 1, principals
    for entry in entries.values():
        assert "*" not in str(entry["Properties"]["PrincipalArn"])
        policy = entry["Properties"]["AccessPolicies"][0]
        assert CLUSTER_ADMIN_POLICY in str(policy["PolicyArn"])
        assert policy["AccessScope"] == {"Type": "cluster"}


def test_managed_addons_pinned(resources: dict[str, Any], env_name: str) -> None:
    addons = {
        a["Properties"]["AddonName"]: a["Properties"].get("AddonVersion")
        for a in of_type(resources[env_name], "AWS::EKS::Addon").values()
    }
    core = {"vpc-cni", "coredns", "kube-proxy", "eks-pod-identity-agent"}
    assert core == set(CORE_ADDONS)
    assert {name: addons[name] for name in core} == {name: MANAGED_ADDONS[name] for name in core}
    for version in addons.values():
        assert version
        assert version.startswith("v")
        assert "eksbuild" in version


def test_addon_ordering_around_the_system_nodes(resources: dict[str, Any], env_name: str) -> None:
    template = resources[env_name]
    addon_ids = {a["Properties"]["AddonName"]: k for k, a in of_type(template, "AWS::EKS::Addon").items()}
    nodegroup_id, system = nodegroup(template, "system")
    for name in ADDONS_BEFORE_NODES:
        assert addon_ids[name] in system["DependsOn"], f"node group must wait for {name}"
    assert nodegroup_id in template["Resources"][addon_ids["coredns"]]["DependsOn"]


def _addons(template: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    return {a["Properties"]["AddonName"]: (k, a) for k, a in of_type(template, "AWS::EKS::Addon").items()}


def test_vpc_cni_permissions_are_on_aws_node_own_pod_identity(resources: dict[str, Any], env_name: str) -> None:
    """AmazonEKS_CNI_Policy sits on a role only kube-system/aws-node gets (EKS Pod Identity, owned by the vpc-cni
    add-on), on no node role: a pod that reached the node role would not get the CNI's ENI and IP calls."""
    template = resources[env_name]
    addons = _addons(template)
    _, cni = addons["vpc-cni"]
    (association,) = cni["Properties"]["PodIdentityAssociations"]
    assert association["ServiceAccount"] == "aws-node"
    role_id = association["RoleArn"]["Fn::GetAtt"][0]
    role = template["Resources"][role_id]["Properties"]
    (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert sorted(trust["Action"]) == ["sts:AssumeRole", "sts:TagSession"]
    assert managed_policy_names(role) == {"AmazonEKS_CNI_Policy"}
    assert not [
        p for p in of_type(template, "AWS::IAM::Policy").values() if {"Ref": role_id} in p["Properties"]["Roles"]
    ]
    carriers = {
        k
        for k, r in of_type(template, "AWS::IAM::Role").items()
        if "AmazonEKS_CNI_Policy" in managed_policy_names(r["Properties"])
    }
    assert carriers == {role_id}
    # The add-on owns the association (no separate one for aws-node): EKS restarts aws-node when it changes.
    assert not [
        a
        for a in of_type(template, "AWS::EKS::PodIdentityAssociation").values()
        if a["Properties"]["ServiceAccount"] == "aws-node"
    ]


def test_the_vpc_cni_enforces_network_policies(resources: dict[str, Any], env_name: str) -> None:
    """NetworkPolicy objects are accepted by any API server; only the VPC CNI's node agent, switched on by the
    add-on's enableNetworkPolicy, enforces them. Off, a default-deny policy would be silently ignored."""
    _, cni = _addons(resources[env_name])["vpc-cni"]
    values = json.loads(cni["Properties"]["ConfigurationValues"])
    assert values["enableNetworkPolicy"] == "true"


def test_the_kubectl_handler_reads_no_container_registry(resources: dict[str, Any], env_name: str) -> None:
    """aws-cdk-lib 2.275.0 (aws-eks-v2 kubectl-provider.js) gives the kubectl handler ECR and ECR Public read on every
    repository, for Helm charts kept in ECR; none of ours is (infra/spec/versions.py HELM_CHARTS)."""
    template = resources[env_name]
    (role,) = [
        r
        for k, r in of_type(template, "AWS::IAM::Role").items()
        if k.startswith("EksClusterKubectlProviderHandlerServiceRole")
    ]
    arns = json.dumps(role["Properties"]["ManagedPolicyArns"])
    assert "ContainerRegistry" not in arns
    assert "AWSLambdaBasicExecutionRole" in arns
    assert "AWSLambdaVPCAccessExecutionRole" in arns


def _arn_text(value: Any) -> str:
    """An ARN as the template writes it, with <Ref> for each reference: Fn::Join of strings and Refs."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Ref" in value:
        return f"<{value['Ref']}>"
    if isinstance(value, dict) and "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return str(separator).join(_arn_text(part) for part in parts)
    raise AssertionError(f"not an ARN the test can read: {value}")


def test_the_log_retention_function_changes_only_the_groups_it_keeps(resources: dict[str, Any], env_name: str) -> None:
    """aws-cdk-lib's LogRetention handler (one per stack) sets the retention of each Custom::LogRetention's group and,
    on Create, one day on its own /aws/lambda/<function> group; the library grants it PutRetentionPolicy and
    DeleteRetentionPolicy on every log group of the account ("*"). It may change those groups and no other (issue 38:
    a role that could drop the retention of the audit trail, or of any group, is not its own)."""
    template = resources[env_name]
    kept = {r["Properties"]["LogGroupName"] for r in of_type(template, "Custom::LogRetention").values()}
    assert kept == {f"/aws/eks/{ENVIRONMENTS[env_name].cluster.name}/cluster"}
    (function_id,) = [k for k in of_type(template, "AWS::Lambda::Function") if k.startswith("LogRetention")]
    role_id = template["Resources"][function_id]["Properties"]["Role"]["Fn::GetAtt"][0]
    retention_actions = {"logs:PutRetentionPolicy", "logs:DeleteRetentionPolicy"}
    changed: set[str] = set()
    for policy in of_type(template, "AWS::IAM::Policy").values():
        if {"Ref": role_id} not in policy["Properties"]["Roles"]:
            continue
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            if not retention_actions & set(actions):
                continue
            arns = [
                _arn_text(r)
                for r in (statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]])
            ]
            assert "*" not in arns, statement
            for arn in arns:
                assert ":log-group:" in arn, arn
                changed.add(arn.split(":log-group:", 1)[1].removesuffix(":*"))
    assert changed == kept | {f"/aws/lambda/<{function_id}>"}


def test_aws_node_gets_its_identity_before_the_nodes_lose_theirs(resources: dict[str, Any], env_name: str) -> None:
    """The Pod Identity agent hands aws-node its credentials, so vpc-cni waits for it; the system node role (which
    loses AmazonEKS_CNI_Policy on an existing cluster) waits for vpc-cni, whose association update restarts aws-node
    with its own credentials first. GPU stacks follow Platform as a whole (test_efa_nodegroups)."""
    template = resources[env_name]
    addons = _addons(template)
    cni_id, cni = addons["vpc-cni"]
    assert addons["eks-pod-identity-agent"][0] in cni["DependsOn"]
    role_id, role = node_role_of(template, nodegroup(template, "system")[1]["Properties"])
    assert cni_id in role["DependsOn"], role_id


def test_kubectl_handler_runs_in_the_private_subnets_with_matching_layer(
    resources: dict[str, Any], env_name: str
) -> None:
    template = resources[env_name]
    handlers = [
        f["Properties"]
        for f in of_type(template, "AWS::Lambda::Function").values()
        if "kubectl" in f["Properties"].get("Description", "")
    ]
    assert len(handlers) == 1
    handler = handlers[0]
    assert len(handler["VpcConfig"]["SubnetIds"]) == len(ENVIRONMENTS[env_name].network.availability_zones)
    layers = of_type(template, "AWS::Lambda::LayerVersion")
    descriptions = " ".join(str(layer["Properties"].get("Description", "")) for layer in layers.values())
    assert f"/opt/kubectl/kubectl {KUBERNETES_VERSION}." in descriptions


def test_outputs(templates: dict[str, Template], env_name: str) -> None:
    env = ENVIRONMENTS[env_name]
    outputs = templates[env_name].to_json()["Outputs"]
    assert "ClusterName" in outputs
    assert (
        outputs["UpdateKubeconfigCommand"]["Value"]
        == f"aws eks update-kubeconfig --name {env.cluster.name} --region {env.region}"
    )


def test_public_endpoint_is_opt_in_with_an_allow_list() -> None:
    dev = ENVIRONMENTS["dev"]
    opened = dataclasses.replace(
        dev,
        cluster=ClusterConfig(
            name="ml-dev",
            admin_principals=("PlatformAdmin",),
            endpoint_access=EndpointAccess.PUBLIC_AND_PRIVATE,
            public_access_cidrs=("203.0.113.0/24",),
        ),
    )
    app = cdk.App(context=cdk_json_context())
    stage = PlatformStage(app, "open", environment=opened)
    vpc_config = Template.from_stack(stage.platform).to_json()["Resources"]
    cluster = next(v for v in vpc_config.values() if v["Type"] == "AWS::EKS::Cluster")["Properties"]
    assert cluster["ResourcesVpcConfig"]["EndpointPublicAccess"] is True
    assert cluster["ResourcesVpcConfig"]["EndpointPrivateAccess"] is True
    assert cluster["ResourcesVpcConfig"]["PublicAccessCidrs"] == ["203.0.113.0/24"]


def _pod_identity_associations(template: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(namespace, service account, role ARN) of every EKS Pod Identity association: standalone, or an add-on's."""
    found = [
        (p["Namespace"], p["ServiceAccount"], p["RoleArn"])
        for p in (r["Properties"] for r in of_type(template, "AWS::EKS::PodIdentityAssociation").values())
    ]
    for addon in of_type(template, "AWS::EKS::Addon").values():
        for association in addon["Properties"].get("PodIdentityAssociations", []):
            found.append(("kube-system", association["ServiceAccount"], association["RoleArn"]))
    return found


def test_every_pod_identity_role_is_its_service_accounts_on_its_cluster(
    resources: dict[str, Any], env_name: str
) -> None:
    """The role's trust names the session tags EKS Pod Identity sends (EKS User Guide, "Create IAM role with trust
    policy required by EKS Pod Identity"): an association another namespace or cluster makes with it gets nothing
    (issue 38). The add-ons' associations are in kube-system, the add-ons' namespace."""
    template = resources[env_name]
    name = ENVIRONMENTS[env_name].cluster.name
    associations = _pod_identity_associations(template)
    assert len(associations) >= 2  # the VPC CNI's, the FSx CSI controller's (and the CloudWatch agent's where on)
    for namespace, service_account, role_arn in associations:
        role = template["Resources"][role_arn["Fn::GetAtt"][0]]
        (trust,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
        tags = trust["Condition"]["StringEquals"]
        assert tags["aws:RequestTag/kubernetes-namespace"] == namespace
        assert tags["aws:RequestTag/kubernetes-service-account"] == service_account
        assert _arn_text(tags["aws:RequestTag/eks-cluster-arn"]).endswith(f":cluster/{name}")


def test_the_cluster_and_flow_log_roles_are_this_accounts_cluster_and_flow_logs(
    resources: dict[str, Any], env_name: str
) -> None:
    """EKS User Guide, "Cross-service confused deputy prevention in Amazon EKS"; Amazon VPC User Guide, "IAM role for
    publishing flow logs to CloudWatch Logs"."""
    template = resources[env_name]
    config = ENVIRONMENTS[env_name]
    expected = {
        "eks.amazonaws.com": f"arn:aws:eks:{config.region}:<AWS::AccountId>:cluster/{config.cluster.name}",
        "vpc-flow-logs.amazonaws.com": f"arn:aws:ec2:{config.region}:<AWS::AccountId>:vpc-flow-log/*",
    }
    seen = set()
    for role in of_type(template, "AWS::IAM::Role").values():
        for trust in role["Properties"]["AssumeRolePolicyDocument"]["Statement"]:
            service = trust["Principal"].get("Service")
            if service in expected:
                assert trust["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
                assert _arn_text(trust["Condition"]["ArnLike"]["aws:SourceArn"]) == expected[service]
                seen.add(service)
    assert seen == set(expected)
