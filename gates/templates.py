"""The project's own CloudFormation rules, including the EKS properties cdk-nag cannot see
on aws_eks_v2 clusters (its EKS1/EKS2 rules only recognise aws_eks)."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterator
from typing import Any

from gates.report import Finding

GATE = "templates"
OPEN = ("0.0.0.0/0", "::/0")
CONTROL_PLANE_LOG_TYPES = {"api", "audit", "authenticator", "controllerManager", "scheduler"}

Rule = Callable[[str, dict[str, Any], dict[str, Any]], Iterator[str]]


def _open_ingress(logical_id: str, res: dict[str, Any], template: dict[str, Any]) -> Iterator[str]:
    if res["Type"] == "AWS::EC2::SecurityGroup":
        rules = res.get("Properties", {}).get("SecurityGroupIngress", [])
    elif res["Type"] == "AWS::EC2::SecurityGroupIngress":
        rules = [res.get("Properties", {})]
    else:
        return
    for rule in rules:
        for key in ("CidrIp", "CidrIpv6"):
            if rule.get(key) in OPEN:
                yield f"security group ingress open to {rule[key]} (port {rule.get('FromPort', 'all')})"


def _metadata_options(res: dict[str, Any]) -> dict[str, Any] | None:
    if res["Type"] != "AWS::EC2::LaunchTemplate":
        return None
    options: dict[str, Any] = res.get("Properties", {}).get("LaunchTemplateData", {}).get("MetadataOptions", {})
    return options


def _shown(options: dict[str, Any], key: str) -> str:
    return f"is {options[key]}" if key in options else "is not set"


def _imdsv2(logical_id: str, res: dict[str, Any], template: dict[str, Any]) -> Iterator[str]:
    options = _metadata_options(res)
    if options is not None and options.get("HttpTokens") != "required":
        yield (
            f"launch template does not require IMDSv2 (MetadataOptions.HttpTokens {_shown(options, 'HttpTokens')}): "
            "set HttpTokens to required (infra/nodegroups/launch_template.py)"
        )


# IMDS answers an IMDSv2 token request with the hop limit as IP TTL, and a pod's own network namespace is one hop
# more than the node's: above 1, every pod gets the node role's credentials (infra/nodegroups/launch_template.py).
# Left out, the AMI decides, and AL2023 AMIs launch with 2. The gate's own number, not infra's: a change of the
# code's constant still fails here.
IMDS_HOP_LIMIT = 1


def _imds_hop_limit(logical_id: str, res: dict[str, Any], template: dict[str, Any]) -> Iterator[str]:
    options = _metadata_options(res)
    if options is None:
        return
    value = options.get("HttpPutResponseHopLimit")
    if str(value) == str(IMDS_HOP_LIMIT):
        return
    shown = _shown(options, "HttpPutResponseHopLimit")
    left_out = " (AL2023 AMIs then launch with 2)" if value is None else ""
    yield (
        f"launch template lets pods reach IMDS and the node role's credentials: "
        f"MetadataOptions.HttpPutResponseHopLimit {shown}{left_out}; set HttpPutResponseHopLimit to "
        f"{IMDS_HOP_LIMIT} (infra/nodegroups/launch_template.py IMDS_HOP_LIMIT), host-network agents keep IMDS"
    )


def _kms_rotation(logical_id: str, res: dict[str, Any], template: dict[str, Any]) -> Iterator[str]:
    if res["Type"] == "AWS::KMS::Key" and res.get("Properties", {}).get("EnableKeyRotation") is not True:
        yield "KMS key without automatic rotation (EnableKeyRotation)"


def _log_retention(logical_id: str, res: dict[str, Any], template: dict[str, Any]) -> Iterator[str]:
    if res["Type"] == "AWS::Logs::LogGroup" and "RetentionInDays" not in res.get("Properties", {}):
        yield "log group without RetentionInDays (kept forever, billed forever)"


def _has_retention(log_group_name: str, template: dict[str, Any]) -> bool:
    """A log group of that name gets a retention in this template: an AWS::Logs::LogGroup with
    RetentionInDays, or a Custom::LogRetention (aws_logs.LogRetention, which creates or adopts the
    group and sets its retention without the stack owning it)."""
    for res in template.get("Resources", {}).values():
        props = res.get("Properties", {})
        if (
            res.get("Type") in ("AWS::Logs::LogGroup", "Custom::LogRetention")
            and props.get("LogGroupName") == log_group_name
            and "RetentionInDays" in props
        ):
            return True
    return False


def _retained_fixed_name_log_group(logical_id: str, res: dict[str, Any], template: dict[str, Any]) -> Iterator[str]:
    name = res.get("Properties", {}).get("LogGroupName")
    if res["Type"] == "AWS::Logs::LogGroup" and isinstance(name, str) and res.get("DeletionPolicy") == "Retain":
        yield (
            f"log group {name} is retained under a fixed name: after a rollback or a destroy the next create "
            "fails with 'already exists'; set its retention with aws_logs.LogRetention instead"
        )


def _eks_cluster(logical_id: str, res: dict[str, Any], template: dict[str, Any]) -> Iterator[str]:
    if res["Type"] != "AWS::EKS::Cluster":
        return
    props = res["Properties"]
    name = props.get("Name")
    if isinstance(name, str) and props.get("Logging") and not _has_retention(f"/aws/eks/{name}/cluster", template):
        yield f"control-plane log group /aws/eks/{name}/cluster has no retention (LogGroup or Custom::LogRetention)"
    vpc = props.get("ResourcesVpcConfig", {})
    if vpc.get("EndpointPublicAccess", True):
        cidrs = vpc.get("PublicAccessCidrs")
        if not cidrs or any(c in OPEN for c in cidrs):
            yield "public API endpoint without a restricted PublicAccessCidrs allow-list"
    enabled = {t.get("Type") for t in props.get("Logging", {}).get("ClusterLogging", {}).get("EnabledTypes", [])}
    missing = CONTROL_PLANE_LOG_TYPES - enabled
    if missing:
        yield f"control-plane log types not enabled: {', '.join(sorted(missing))}"
    encrypted = [c for c in props.get("EncryptionConfig", []) if "secrets" in c.get("Resources", [])]
    if not encrypted:
        yield "Kubernetes secrets are not envelope-encrypted with a KMS key (EncryptionConfig)"


# Resource policies that grant an AWS service principal, and where each keeps its document.
SERVICE_GRANT_POLICIES = {
    "AWS::SNS::TopicPolicy": "PolicyDocument",
    "AWS::SNS::TopicInlinePolicy": "PolicyDocument",
    "AWS::KMS::Key": "KeyPolicy",
}
# What stops a confused deputy (IAM User Guide, "The confused deputy problem",
# https://docs.aws.amazon.com/IAM/latest/UserGuide/confused-deputy.html): the calling resource's account or ARN; for
# CloudWatch Logs on a KMS key, the log group's ARN in the encryption context (CloudWatch Logs User Guide, "Encrypt log
# data in CloudWatch Logs using AWS KMS"). Condition keys are case-insensitive.
SOURCE_KEYS = {"aws:sourceaccount", "aws:sourcearn", "kms:encryptioncontext:aws:logs:arn"}
# A role that trusts an AWS service is the service's to assume on behalf of a resource; the service passes that
# resource in the request where its guide documents condition keys for the role's trust policy (IAM User Guide, "The
# confused deputy problem"). Service -> the keys its guide documents, all of which the trust must name, and the guide.
TRUST_SOURCE_KEYS: dict[str, tuple[tuple[str, ...], str]] = {
    "codebuild.amazonaws.com": (
        ("aws:SourceAccount", "aws:SourceArn"),
        "CodeBuild User Guide, 'Allow CodeBuild to interact with other AWS services' (the project's account and ARN)",
    ),
    "eks.amazonaws.com": (
        ("aws:SourceAccount", "aws:SourceArn"),
        "EKS User Guide, 'Cross-service confused deputy prevention in Amazon EKS' (the cluster's account and ARN)",
    ),
    "states.amazonaws.com": (
        ("aws:SourceAccount", "aws:SourceArn"),
        "Step Functions Developer Guide, 'Creating an IAM role for your state machine', 'Prevent cross-service "
        "confused deputy issue' (arn:...:states:REGION:ACCOUNT:stateMachine:*)",
    ),
    "vpc-flow-logs.amazonaws.com": (
        ("aws:SourceAccount", "aws:SourceArn"),
        "Amazon VPC User Guide, 'IAM role for publishing flow logs to CloudWatch Logs' (arn:...:ec2:REGION:ACCOUNT:"
        "vpc-flow-log/*)",
    ),
    "pods.eks.amazonaws.com": (
        (
            "aws:RequestTag/eks-cluster-arn",
            "aws:RequestTag/kubernetes-namespace",
            "aws:RequestTag/kubernetes-service-account",
        ),
        "EKS User Guide, 'Create IAM role with trust policy required by EKS Pod Identity' (the session tags EKS Pod "
        "Identity sends: cluster, namespace, service account)",
    ),
}
# A role reaches a service only when a principal of this account passes it (iam:PassRole: "you can't pass a role to
# a service in another account", IAM User Guide, "Grant a user permissions to pass a role to an AWS service"); the
# source keys are what guards the role where the service also acts for resources of other accounts.
PASSED_ROLE = (
    "and the role reaches the service only when a principal of this account passes it (iam:PassRole, IAM User Guide, "
    "'Grant a user permissions to pass a role to an AWS service')"
)
# (resource type, Sid, service, sorted actions) -> why the grant carries no source condition. Keep each reason true.
SERVICE_GRANT_ACKNOWLEDGED: dict[tuple[str, str, str, tuple[str, ...]], str] = {
    ("AWS::KMS::Key", "CloudWatchAlarmsPublish", "cloudwatch.amazonaws.com", ("kms:Decrypt", "kms:GenerateDataKey*")): (
        "the alarm topic's own key (infra/monitoring.py): the Amazon SNS guide documents this grant without "
        "conditions and no AWS page documents aws:SourceArn/aws:SourceAccount in the KMS request SNS makes for a "
        "CloudWatch publish; the topic policy, which CloudWatch must pass first, carries both"
    ),
    ("AWS::IAM::Role", "", "lambda.amazonaws.com", ("sts:AssumeRole",)): (
        "every function's execution role (ours and aws-cdk-lib's: Provider framework, kubectl handler, LogRetention, "
        "the VPC's default-security-group handler): the Lambda Developer Guide gives the execution role's trust "
        "policy with the service principal alone ('Defining Lambda function permissions with an execution role') and "
        "names no source ARN for the AssumeRole Lambda makes (its 'Using source function ARN to control function "
        "access behavior': aws:SourceArn is for policies where the function is the target); a function runs with the "
        f"role its Role names, {PASSED_ROLE}"
    ),
    ("AWS::IAM::Role", "", "ec2.amazonaws.com", ("sts:AssumeRole",)): (
        "the node roles: the EKS User Guide gives the node role's trust policy with the service principal alone "
        "('Amazon EKS node IAM role') and EC2 documents no source key for the instance-profile role it assumes; an "
        f"instance gets the role through its instance profile, {PASSED_ROLE}"
    ),
}


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _service_grant_without_source(logical_id: str, res: dict[str, Any], template: dict[str, Any]) -> Iterator[str]:
    """An SNS topic policy or KMS key policy statement that allows an AWS service principal with neither
    aws:SourceAccount nor aws:SourceArn: the service may act on it for any account's resource (a confused deputy)."""
    field = SERVICE_GRANT_POLICIES.get(res["Type"])
    document = res.get("Properties", {}).get(field) if field else None
    if not isinstance(document, dict):
        return
    for statement in _listed(document.get("Statement", [])):
        principal = statement.get("Principal")
        if statement.get("Effect", "Allow") != "Allow" or not isinstance(principal, dict) or "Service" not in principal:
            continue
        keys = {key.lower() for operator in (statement.get("Condition") or {}).values() for key in operator}
        if keys & SOURCE_KEYS:
            continue
        sid = str(statement.get("Sid", ""))
        actions = tuple(sorted(str(a) for a in _listed(statement.get("Action", []))))
        for service in _listed(principal["Service"]):
            if (res["Type"], sid, service, actions) in SERVICE_GRANT_ACKNOWLEDGED:
                continue
            yield (
                f"{res['Type']} statement {sid or '(no Sid)'} allows service principal {service} "
                f"({', '.join(actions)}) without aws:SourceAccount or aws:SourceArn: any account's resource may have "
                f"{service} act on it (confused deputy); add StringEquals aws:SourceAccount and ArnLike aws:SourceArn "
                "of the calling resources where the service documents them, else acknowledge it with the reason in "
                "gates/templates.py SERVICE_GRANT_ACKNOWLEDGED"
            )


def _service_trust_without_source(logical_id: str, res: dict[str, Any], template: dict[str, Any]) -> Iterator[str]:
    """A role whose trust policy lets an AWS service assume it without the condition keys the service's guide
    documents for naming the calling resource (TRUST_SOURCE_KEYS), unless acknowledged."""
    if res["Type"] != "AWS::IAM::Role":
        return
    document = res.get("Properties", {}).get("AssumeRolePolicyDocument", {})
    for statement in _listed(document.get("Statement", [])):
        principal = statement.get("Principal")
        if statement.get("Effect", "Allow") != "Allow" or not isinstance(principal, dict) or "Service" not in principal:
            continue
        keys = {key.lower() for operator in (statement.get("Condition") or {}).values() for key in operator}
        sid = str(statement.get("Sid", ""))
        actions = tuple(sorted(str(a) for a in _listed(statement.get("Action", []))))
        for service in _listed(principal["Service"]):
            if (res["Type"], sid, service, actions) in SERVICE_GRANT_ACKNOWLEDGED:
                continue
            acknowledge = "gates/templates.py SERVICE_GRANT_ACKNOWLEDGED"
            if service not in TRUST_SOURCE_KEYS:
                yield (
                    f"AWS::IAM::Role trust statement {sid or '(no Sid)'} allows service principal {service} "
                    f"({', '.join(actions)}), for which the gate knows no documented source condition: read the "
                    "service guide's confused-deputy section for the role's trust policy, then add its keys to "
                    f"gates/templates.py TRUST_SOURCE_KEYS, or acknowledge it with the reason in {acknowledge}"
                )
                continue
            documented, guide = TRUST_SOURCE_KEYS[service]
            missing = [key for key in documented if key.lower() not in keys]
            if missing:
                yield (
                    f"AWS::IAM::Role trust statement {sid or '(no Sid)'} allows service principal {service} "
                    f"({', '.join(actions)}) without {', '.join(missing)}: any resource of {service} may have it "
                    f"assume the role (confused deputy); add {', '.join(documented)} as the {guide} documents them"
                )


# Who can take a role's credentials from inside a pod: EKS Pod Identity and IRSA roles, by design; a node role, from
# any pod with the host's network (and from every pod were the IMDS hop limit above 1).
POD_REACHABLE_SERVICES = {"pods.eks.amazonaws.com", "ec2.amazonaws.com"}
WEB_IDENTITY = "sts:AssumeRoleWithWebIdentity"
READ_VERBS = ("Describe", "Get", "List", "BatchGet", "BatchCheck")
# The AWS managed policies our roles attach, and what each lets its holder change on every resource ("*"), from their
# published documents (AWS Managed Policy Reference Guide): AmazonEKS_CNI_Policy v5 (its CreateTags is limited to
# network interfaces), AmazonEKSWorkerNodePolicy v3 (EC2/EKS reads, and eks-auth:AssumeRoleForPodIdentity, which
# trades a pod's service-account token for that pod's own role), AmazonEC2ContainerRegistryReadOnly (ECR reads).
MANAGED_POLICY_WRITES: dict[str, tuple[str, ...]] = {
    "AmazonEKS_CNI_Policy": (
        "ec2:AssignPrivateIpAddresses",
        "ec2:AttachNetworkInterface",
        "ec2:CreateNetworkInterface",
        "ec2:DeleteNetworkInterface",
        "ec2:DetachNetworkInterface",
        "ec2:ModifyNetworkInterfaceAttribute",
        "ec2:UnassignPrivateIpAddresses",
    ),
    "AmazonEKSWorkerNodePolicy": (),
    "AmazonEC2ContainerRegistryReadOnly": (),
}
# (principal, managed policy) -> why that holder may write on every resource. Keep each reason true.
POD_ROLE_WRITES_ACKNOWLEDGED: dict[tuple[str, str], str] = {
    ("pods.eks.amazonaws.com", "AmazonEKS_CNI_Policy"): (
        "the VPC CNI's own Pod Identity role (infra/cluster.py Eks/VpcCniRole, kube-system/aws-node only): it creates, "
        "attaches and assigns addresses on the ENIs of every node it runs on, which the EKS User Guide "
        "(cni-iam-role.html) grants with this managed policy; no node role and no workload pod holds it"
    ),
}


POLICY_TYPES = ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy")


def _policy_statements(res: dict[str, Any]) -> list[dict[str, Any]]:
    """The statements of a policy resource, or of a role's inline policies."""
    props = res.get("Properties", {})
    if res["Type"] in POLICY_TYPES:
        return list(_listed(props.get("PolicyDocument", {}).get("Statement", [])))
    if res["Type"] == "AWS::IAM::Role":
        return [s for p in props.get("Policies", []) for s in _listed(p["PolicyDocument"]["Statement"])]
    return []


def _trusted_by_pods(role: dict[str, Any]) -> list[str]:
    document = role.get("Properties", {}).get("AssumeRolePolicyDocument", {})
    found = []
    for statement in _listed(document.get("Statement", [])):
        if statement.get("Effect", "Allow") != "Allow":
            continue
        principal = statement.get("Principal") or {}
        services = _listed(principal.get("Service", [])) if isinstance(principal, dict) else []
        found += [str(s) for s in services if s in POD_REACHABLE_SERVICES]
        if WEB_IDENTITY in _listed(statement.get("Action", [])):
            found.append("IRSA (web identity)")
    return found


def _managed_name(arn: Any) -> str | None:
    if isinstance(arn, dict) and "Fn::Join" in arn:
        arn = "".join(part for part in arn["Fn::Join"][1] if isinstance(part, str))
    if isinstance(arn, str) and ":iam::aws:policy/" in arn:
        return arn.rsplit("/", 1)[1]
    return None


def _writes_anywhere(statement: dict[str, Any]) -> list[str]:
    if statement.get("Effect", "Allow") != "Allow":
        return []
    if "NotResource" not in statement and "*" not in _listed(statement.get("Resource", [])):
        return []
    if "NotAction" in statement:
        return [f"NotAction {_listed(statement['NotAction'])}"]
    actions = [str(a) for a in _listed(statement.get("Action", []))]
    return [a for a in actions if a == "*" or not a.split(":", 1)[-1].startswith(READ_VERBS)]


def _pod_reachable_writes_anywhere(logical_id: str, res: dict[str, Any], template: dict[str, Any]) -> Iterator[str]:
    """A role a pod can take (Pod Identity, IRSA, a node role) that may change every resource of a kind."""
    if res["Type"] != "AWS::IAM::Role":
        return
    holders = _trusted_by_pods(res)
    if not holders:
        return
    fix = "scope it to what its holder owns, or acknowledge it in POD_ROLE_WRITES_ACKNOWLEDGED (gates/templates.py)"
    statements = _policy_statements(res)
    for other in template.get("Resources", {}).values():
        if other["Type"] in POLICY_TYPES and {"Ref": logical_id} in other.get("Properties", {}).get("Roles", []):
            statements += _policy_statements(other)
    writes = sorted({w for statement in statements for w in _writes_anywhere(statement)})
    if writes:
        yield f"role taken by {', '.join(holders)} may {', '.join(writes)} on every resource: {fix}"
    for arn in res.get("Properties", {}).get("ManagedPolicyArns", []):
        name = _managed_name(arn)
        if name not in MANAGED_POLICY_WRITES:
            yield (
                f"role taken by {', '.join(holders)} attaches managed policy {name or arn}, whose writes the gate does "
                "not know: add what it may change on every resource, from its published document, to "
                "gates/templates.py MANAGED_POLICY_WRITES"
            )
            continue
        unjustified = [h for h in holders if (h, name) not in POD_ROLE_WRITES_ACKNOWLEDGED]
        if MANAGED_POLICY_WRITES[name] and unjustified:
            yield (
                f"role taken by {', '.join(unjustified)} attaches {name}, which may "
                f"{', '.join(MANAGED_POLICY_WRITES[name])} on every resource: {fix}"
            )


# What removes a log group's records or how long they are kept: on "*", the holder can erase the audit trail or any
# other group of the account (aws-cdk-lib's LogRetention handler held the first two before issue 38).
LOG_GROUP_LOSSES = ("logs:PutRetentionPolicy", "logs:DeleteRetentionPolicy", "logs:DeleteLogGroup")


def _changes_every_log_group(logical_id: str, res: dict[str, Any], template: dict[str, Any]) -> Iterator[str]:
    for statement in _policy_statements(res):
        if statement.get("Effect", "Allow") != "Allow" or "*" not in _listed(statement.get("Resource", [])):
            continue
        granted = [str(a) for a in _listed(statement.get("Action", []))]
        losses = [loss for loss in LOG_GROUP_LOSSES if any(fnmatch.fnmatchcase(loss, a) for a in granted)]
        if losses:
            yield (
                f"{res['Type']} grants {', '.join(losses)} on every log group (Resource '*', actions "
                f"{', '.join(granted)}): its holder may shorten or drop the retention of any group, the audit trail "
                "included; grant it on the groups it keeps (infra/cluster.py keep_log_retention_to_its_groups)"
            )


RULES: tuple[Rule, ...] = (
    _open_ingress,
    _imdsv2,
    _imds_hop_limit,
    _kms_rotation,
    _log_retention,
    _retained_fixed_name_log_group,
    _eks_cluster,
    _service_grant_without_source,
    _service_trust_without_source,
    _pod_reachable_writes_anywhere,
    _changes_every_log_group,
)


def check_template(name: str, template: dict[str, Any]) -> list[Finding]:
    return [
        Finding(GATE, f"{name}:{logical_id}", message)
        for logical_id, res in template.get("Resources", {}).items()
        for rule in RULES
        for message in rule(logical_id, res, template)
    ]
