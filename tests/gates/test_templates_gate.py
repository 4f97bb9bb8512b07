"""The template gate passes the real templates and fails each broken one, naming the problem."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from gates import outputs
from gates.templates import check_template


def test_synthesized_templates_pass(cdk_out: Path) -> None:
    found = outputs.templates(cdk_out)
    # dev: Images, Platform, Storage, Gpu-g6; prod: Images, Platform, Storage, Gpu-p5, Gpu-g6.
    assert len(found) == 9
    for name, template in found.items():
        assert check_template(name, template) == []


def _one(resource: dict[str, Any], **others: dict[str, Any]) -> list[str]:
    return [f.message for f in check_template("t.json", {"Resources": {"R": resource, **others}})]


def test_open_security_group_ingress_fails() -> None:
    sg = {
        "Type": "AWS::EC2::SecurityGroup",
        "Properties": {"SecurityGroupIngress": [{"CidrIp": "0.0.0.0/0", "IpProtocol": "tcp", "FromPort": 22}]},
    }
    assert _one(sg) == ["security group ingress open to 0.0.0.0/0 (port 22)"]
    rule = {"Type": "AWS::EC2::SecurityGroupIngress", "Properties": {"CidrIpv6": "::/0", "IpProtocol": "-1"}}
    assert _one(rule) == ["security group ingress open to ::/0 (port all)"]


def _launch_template(**options: object) -> dict[str, Any]:
    return {"Type": "AWS::EC2::LaunchTemplate", "Properties": {"LaunchTemplateData": {"MetadataOptions": options}}}


@pytest.mark.parametrize(("tokens", "shown"), [(None, "is not set"), ("optional", "is optional")])
def test_launch_template_without_imdsv2_fails(tokens: str | None, shown: str) -> None:
    options: dict[str, object] = {"HttpPutResponseHopLimit": 1}
    if tokens is not None:
        options["HttpTokens"] = tokens
    assert _one(_launch_template(**options)) == [
        f"launch template does not require IMDSv2 (MetadataOptions.HttpTokens {shown}): "
        "set HttpTokens to required (infra/nodegroups/launch_template.py)"
    ]


@pytest.mark.parametrize("hop_limit", [2, "2", 3, 64])
def test_launch_template_letting_pods_reach_imds_fails(hop_limit: object) -> None:
    findings = check_template(
        "ml-prod-gpu-p5.template.json",
        {"Resources": {"GpuLt": _launch_template(HttpTokens="required", HttpPutResponseHopLimit=hop_limit)}},
    )
    assert [(f.gate, f.where) for f in findings] == [("templates", "ml-prod-gpu-p5.template.json:GpuLt")]
    message = findings[0].message
    assert f"MetadataOptions.HttpPutResponseHopLimit is {hop_limit}" in message
    assert "pods" in message
    assert "node role" in message
    assert "set HttpPutResponseHopLimit to 1" in message
    assert "IMDS_HOP_LIMIT" in message


def test_launch_template_without_a_hop_limit_fails() -> None:
    # AL2023 AMIs launch with a hop limit of 2 when the launch template leaves it out (imds-support v2.0).
    (message,) = _one(_launch_template(HttpTokens="required"))
    assert "MetadataOptions.HttpPutResponseHopLimit is not set" in message
    assert "set HttpPutResponseHopLimit to 1" in message


def test_launch_template_with_hop_limit_1_and_imdsv2_passes() -> None:
    assert _one(_launch_template(HttpTokens="required", HttpPutResponseHopLimit=1, HttpEndpoint="enabled")) == []
    assert _one(_launch_template(HttpTokens="required", HttpPutResponseHopLimit="1")) == []


def test_kms_key_without_rotation_fails() -> None:
    assert _one({"Type": "AWS::KMS::Key", "Properties": {}}) == [
        "KMS key without automatic rotation (EnableKeyRotation)"
    ]


def test_log_group_without_retention_fails() -> None:
    assert "without RetentionInDays" in _one({"Type": "AWS::Logs::LogGroup", "Properties": {}})[0]


@pytest.fixture
def cluster(resources: dict[str, Any]) -> dict[str, Any]:
    found = [r for r in resources["prod"]["Resources"].values() if r["Type"] == "AWS::EKS::Cluster"]
    return copy.deepcopy(found[0])


@pytest.fixture
def retention(resources: dict[str, Any]) -> dict[str, Any]:
    found = [r for r in resources["prod"]["Resources"].values() if r["Type"] == "Custom::LogRetention"]
    return copy.deepcopy(found[0])


def test_control_plane_log_group_without_retention_fails(cluster: dict[str, Any], retention: dict[str, Any]) -> None:
    message = "control-plane log group /aws/eks/ml-prod/cluster has no retention (LogGroup or Custom::LogRetention)"
    assert _one(cluster) == [message]
    assert _one(cluster, L=retention) == []
    group = {
        "Type": "AWS::Logs::LogGroup",
        "Properties": {"LogGroupName": "/aws/eks/ml-prod/cluster", "RetentionInDays": 365},
    }
    assert _one(cluster, L=group) == []
    del retention["Properties"]["RetentionInDays"]
    assert _one(cluster, L=retention) == [message]


def test_retained_log_group_under_a_fixed_name_fails() -> None:
    group = {
        "Type": "AWS::Logs::LogGroup",
        "DeletionPolicy": "Retain",
        "Properties": {"LogGroupName": "/aws/eks/ml-prod/cluster", "RetentionInDays": 365},
    }
    assert "retained under a fixed name" in _one(group)[0]
    generated = {**group, "Properties": {"RetentionInDays": 365}}
    assert _one(generated) == []


def test_real_cluster_passes(cluster: dict[str, Any], retention: dict[str, Any]) -> None:
    assert _one(cluster, L=retention) == []


def test_public_endpoint_without_allow_list_fails(cluster: dict[str, Any], retention: dict[str, Any]) -> None:
    cluster["Properties"]["ResourcesVpcConfig"]["EndpointPublicAccess"] = True
    assert _one(cluster, L=retention) == ["public API endpoint without a restricted PublicAccessCidrs allow-list"]
    cluster["Properties"]["ResourcesVpcConfig"]["PublicAccessCidrs"] = ["0.0.0.0/0"]
    assert _one(cluster, L=retention) == ["public API endpoint without a restricted PublicAccessCidrs allow-list"]
    cluster["Properties"]["ResourcesVpcConfig"]["PublicAccessCidrs"] = ["203.0.113.0/24"]
    assert _one(cluster, L=retention) == []


def test_missing_control_plane_log_type_fails(cluster: dict[str, Any], retention: dict[str, Any]) -> None:
    types = cluster["Properties"]["Logging"]["ClusterLogging"]["EnabledTypes"]
    cluster["Properties"]["Logging"]["ClusterLogging"]["EnabledTypes"] = [t for t in types if t["Type"] != "audit"]
    assert _one(cluster, L=retention) == ["control-plane log types not enabled: audit"]


def test_unencrypted_secrets_fail(cluster: dict[str, Any], retention: dict[str, Any]) -> None:
    del cluster["Properties"]["EncryptionConfig"]
    assert "not envelope-encrypted" in _one(cluster, L=retention)[0]


def _topic_policy(statement: dict[str, Any]) -> dict[str, Any]:
    return {
        "Type": "AWS::SNS::TopicPolicy",
        "Properties": {"PolicyDocument": {"Statement": [statement], "Version": "2012-10-17"}, "Topics": []},
    }


PUBLISH = {
    "Sid": "CloudWatchAlarmsPublish",
    "Effect": "Allow",
    "Principal": {"Service": "cloudwatch.amazonaws.com"},
    "Action": "sns:Publish",
    "Resource": "*",
}


def test_a_service_principal_grant_without_a_source_condition_fails_naming_it_and_the_fix() -> None:
    (message,) = _one(_topic_policy(PUBLISH))
    assert "AWS::SNS::TopicPolicy statement CloudWatchAlarmsPublish" in message
    assert "service principal cloudwatch.amazonaws.com (sns:Publish)" in message
    assert "add StringEquals aws:SourceAccount and ArnLike aws:SourceArn" in message
    findings = check_template("t.json", {"Resources": {"AlarmTopicPolicy": _topic_policy(PUBLISH)}})
    assert [f.where for f in findings] == ["t.json:AlarmTopicPolicy"]
    key = {
        "Type": "AWS::KMS::Key",
        "Properties": {
            "EnableKeyRotation": True,
            "KeyPolicy": {
                "Statement": [{**PUBLISH, "Sid": "Other", "Principal": {"Service": ["events.amazonaws.com"]}}]
            },
        },
    }
    assert "AWS::KMS::Key statement Other allows service principal events.amazonaws.com" in _one(key)[0]


@pytest.mark.parametrize(
    "condition",
    [
        {"StringEquals": {"aws:SourceAccount": "111122223333"}},
        {"ArnLike": {"AWS:SourceArn": "arn:aws:cloudwatch:us-east-1:111122223333:alarm:ml-prod-*"}},
        {"ArnEquals": {"kms:EncryptionContext:aws:logs:arn": "arn:aws:logs:us-east-1:111122223333:log-group:g"}},
    ],
)
def test_a_source_condition_passes(condition: dict[str, Any]) -> None:
    assert _one(_topic_policy({**PUBLISH, "Condition": condition})) == []


def test_an_unrelated_condition_or_an_account_principal_is_judged_as_it_is() -> None:
    other = {"StringEquals": {"aws:SecureTransport": "true"}}
    assert len(_one(_topic_policy({**PUBLISH, "Condition": other}))) == 1
    assert _one(_topic_policy({**PUBLISH, "Principal": {"AWS": "arn:aws:iam::111122223333:root"}})) == []
    assert _one(_topic_policy({**PUBLISH, "Effect": "Deny"})) == []


def test_only_the_acknowledged_key_grant_passes_and_its_sid_is_the_one_infra_writes() -> None:
    from infra.monitoring import KEY_GRANT_SID

    grant = {**PUBLISH, "Sid": KEY_GRANT_SID, "Action": ["kms:GenerateDataKey*", "kms:Decrypt"]}

    def key(statement: dict[str, Any]) -> dict[str, Any]:
        return {
            "Type": "AWS::KMS::Key",
            "Properties": {"EnableKeyRotation": True, "KeyPolicy": {"Statement": [statement]}},
        }

    assert _one(key(grant)) == []
    # The same statement with one action more, or on a topic, is not the acknowledged one.
    wider = {**grant, "Action": ["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey*"]}
    assert len(_one(key(wider))) == 1
    assert len(_one(_topic_policy(grant))) == 1


# --- roles a pod can reach: no writes on every resource that no acknowledgment justifies ---------------------------


# A Pod Identity role's trust as infra writes it: its cluster, namespace and service account (EKS User Guide).
POD_TRUST = {
    "StringEquals": {
        "aws:RequestTag/eks-cluster-arn": "arn:aws:eks:us-east-2:1:cluster/ml-prod",
        "aws:RequestTag/kubernetes-namespace": "kube-system",
        "aws:RequestTag/kubernetes-service-account": "aws-node",
    }
}


def _role(
    service: str,
    *,
    managed: tuple[str, ...] = (),
    inline: list[dict[str, Any]] | None = None,
    condition: dict[str, Any] | None = None,
) -> dict[str, Any]:
    trust: dict[str, Any] = {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}
    if condition or service == "pods.eks.amazonaws.com":
        trust["Condition"] = condition or POD_TRUST
    return {
        "Type": "AWS::IAM::Role",
        "Properties": {
            "AssumeRolePolicyDocument": {"Statement": [trust]},
            "ManagedPolicyArns": [
                {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, f":iam::aws:policy/{name}"]]} for name in managed
            ],
            **({"Policies": [{"PolicyName": "p", "PolicyDocument": {"Statement": inline}}]} if inline else {}),
        },
    }


def _allow(action: str | list[str], resource: Any = "*") -> dict[str, Any]:
    return {"Effect": "Allow", "Action": action, "Resource": resource}


def test_a_node_role_with_the_cni_policy_fails_naming_the_writes_and_the_fix() -> None:
    # What every node role held before issue 38: any pod reached it through IMDS (hop limit 2).
    (message,) = _one(_role("ec2.amazonaws.com", managed=("AmazonEKSWorkerNodePolicy", "AmazonEKS_CNI_Policy")))
    assert "ec2.amazonaws.com" in message
    assert "AmazonEKS_CNI_Policy" in message
    assert "ec2:CreateNetworkInterface" in message
    assert "POD_ROLE_WRITES_ACKNOWLEDGED" in message


def test_the_cni_policy_on_the_cnis_own_pod_identity_is_the_acknowledged_one() -> None:
    assert _one(_role("pods.eks.amazonaws.com", managed=("AmazonEKS_CNI_Policy",))) == []
    assert (
        _one(_role("ec2.amazonaws.com", managed=("AmazonEKSWorkerNodePolicy", "AmazonEC2ContainerRegistryReadOnly")))
        == []
    )


def test_a_pod_identity_role_that_writes_anywhere_fails_inline_or_attached() -> None:
    inline = _role("pods.eks.amazonaws.com", inline=[_allow(["logs:PutLogEvents", "ec2:DescribeTags"])])
    (message,) = _one(inline)
    assert "logs:PutLogEvents" in message
    assert "ec2:DescribeTags" not in message
    attached = {
        "Type": "AWS::IAM::Policy",
        "Properties": {"Roles": [{"Ref": "R"}], "PolicyDocument": {"Statement": [_allow("s3:*")]}},
    }
    assert [m for m in _one(_role("pods.eks.amazonaws.com"), P=attached) if "s3:*" in m]
    everything = _role("ec2.amazonaws.com", inline=[{"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"}])
    assert _one(everything)  # NotAction: everything else, writes included


def test_writes_on_named_resources_reads_anywhere_and_roles_no_pod_reaches_pass() -> None:
    own = _allow(["logs:PutLogEvents"], ["arn:aws:logs:us-east-2:1:log-group:/own:*"])
    reads = _allow(["ec2:Describe*", "ecr:BatchGetImage", "fsx:DescribeFileSystems"])
    assert _one(_role("pods.eks.amazonaws.com", inline=[own, reads])) == []
    assert _one(_role("lambda.amazonaws.com", inline=[_allow("ec2:CreateNetworkInterface")])) == []


def test_a_managed_policy_the_gate_does_not_know_on_a_pod_reachable_role_is_named() -> None:
    (message,) = _one(_role("pods.eks.amazonaws.com", managed=("AmazonS3FullAccess",)))
    assert "AmazonS3FullAccess" in message
    assert "MANAGED_POLICY_WRITES" in message


def test_irsa_roles_are_pod_reachable_too() -> None:
    role = _role("pods.eks.amazonaws.com", inline=[_allow("sqs:SendMessage")])
    role["Properties"]["AssumeRolePolicyDocument"]["Statement"] = [
        {
            "Effect": "Allow",
            "Principal": {"Federated": "arn:aws:iam::1:oidc-provider/x"},
            "Action": "sts:AssumeRoleWithWebIdentity",
        }
    ]
    assert _one(role)


# --- no role may change the retention of every log group -----------------------------------------------------------


def _policy(statement: dict[str, Any]) -> dict[str, Any]:
    return {"Type": "AWS::IAM::Policy", "Properties": {"Roles": [], "PolicyDocument": {"Statement": [statement]}}}


@pytest.mark.parametrize(
    "actions", [["logs:DeleteRetentionPolicy", "logs:PutRetentionPolicy"], "logs:DeleteLogGroup", "logs:*", "*"]
)
def test_a_grant_to_change_or_delete_every_log_group_fails(actions: Any) -> None:
    """What aws-cdk-lib's LogRetention handler held (issue 38): it could drop the retention of the audit trail, or of
    any other group of the account."""
    (message,) = _one(_policy(_allow(actions)))
    assert "every log group" in message
    assert "infra/cluster.py keep_log_retention_to_its_groups" in message
    inline = _role("lambda.amazonaws.com", inline=[_allow(actions)])
    assert [m for m in _one(inline) if "every log group" in m]


def test_retention_grants_on_named_groups_and_log_writes_anywhere_pass() -> None:
    named = _allow("logs:PutRetentionPolicy", ["arn:aws:logs:us-east-2:1:log-group:/aws/eks/ml-prod/cluster:*"])
    assert _one(_policy(named)) == []
    assert _one(_policy(_allow(["logs:CreateLogStream", "logs:DescribeLogGroups"]))) == []


# --- service roles: the trust policy names the calling resource where the service's guide documents how -------------

SOURCE = {
    "StringEquals": {"aws:SourceAccount": "111122223333"},
    "ArnLike": {"aws:SourceArn": "arn:aws:codebuild:us-east-2:111122223333:project/ml-prod-nvrx-image"},
}


def test_a_service_role_trusting_its_service_without_the_documented_source_keys_fails_naming_them() -> None:
    (message,) = _one(_role("codebuild.amazonaws.com"))
    assert "AWS::IAM::Role trust" in message
    assert "codebuild.amazonaws.com" in message
    assert "aws:SourceAccount, aws:SourceArn" in message
    assert "Allow CodeBuild to interact with other AWS services" in message
    only_account = {"StringEquals": {"aws:SourceAccount": "111122223333"}}
    (message,) = _one(_role("codebuild.amazonaws.com", condition=only_account))
    assert "without aws:SourceArn" in message
    assert _one(_role("codebuild.amazonaws.com", condition=SOURCE)) == []


@pytest.mark.parametrize("service", ["eks.amazonaws.com", "states.amazonaws.com", "vpc-flow-logs.amazonaws.com"])
def test_each_service_with_documented_source_keys_needs_both(service: str) -> None:
    assert len(_one(_role(service))) == 1
    assert _one(_role(service, condition={k.lower(): v for k, v in SOURCE.items()})) == []


def test_a_pod_identity_role_is_bound_to_its_cluster_namespace_and_service_account() -> None:
    unbound = _role("pods.eks.amazonaws.com")
    del unbound["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Condition"]
    (message,) = _one(unbound)
    assert "aws:RequestTag/eks-cluster-arn" in message
    assert "Create IAM role with trust policy required by EKS Pod Identity" in message
    no_account = {"StringEquals": {**POD_TRUST["StringEquals"]}}
    del no_account["StringEquals"]["aws:RequestTag/kubernetes-service-account"]
    assert "aws:RequestTag/kubernetes-service-account" in _one(_role("pods.eks.amazonaws.com", condition=no_account))[0]
    assert _one(_role("pods.eks.amazonaws.com")) == []


def test_services_that_document_no_source_key_for_their_role_are_the_acknowledged_ones() -> None:
    from gates.templates import SERVICE_GRANT_ACKNOWLEDGED

    for service in ("lambda.amazonaws.com", "ec2.amazonaws.com"):
        assert _one(_role(service)) == []
        reason = SERVICE_GRANT_ACKNOWLEDGED[("AWS::IAM::Role", "", service, ("sts:AssumeRole",))]
        assert "Guide" in reason  # names the document it rests on
    (message,) = _one(_role("events.amazonaws.com"))
    assert "events.amazonaws.com" in message
    assert "TRUST_SOURCE_KEYS" in message
