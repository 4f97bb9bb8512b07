"""The `<env>/Images` stack: the NVRx image built in the account by CodeBuild during `cdk deploy` (infra/images.py),
read from the session's synth (tests/conftest.py) except where another base needs a stack of its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infra.spec import ENVIRONMENTS
from infra.spec.errors import ConfigError
from infra.spec.images import (
    BUILD_TIMEOUT_MINUTES,
    CUSTOM_RESOURCE_TIMEOUT_MINUTES,
    KEEP_IMAGES,
    RegistryKind,
    base_registry,
    context_tag,
    repository_name,
)
from k8s.built_images import build_base

TOKEN_ACTIONS = {"ecr:GetAuthorizationToken", "ecr-public:GetAuthorizationToken", "sts:GetServiceBearerToken"}
PUSH = {
    "ecr:BatchCheckLayerAvailability",
    "ecr:BatchGetImage",
    "ecr:CompleteLayerUpload",
    "ecr:GetDownloadUrlForLayer",
    "ecr:InitiateLayerUpload",
    "ecr:PutImage",
    "ecr:UploadLayerPart",
}


def _of_type(template: dict[str, Any], cfn_type: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == cfn_type}


def _one(template: dict[str, Any], cfn_type: str) -> tuple[str, dict[str, Any]]:
    (found,) = _of_type(template, cfn_type).items()
    return found


@pytest.fixture
def images(stack_templates: dict[str, dict[str, dict[str, Any]]], env_name: str) -> dict[str, Any]:
    return stack_templates[env_name]["Images"]


def _statements(template: dict[str, Any], role_id: str) -> list[dict[str, Any]]:
    return [
        statement
        for policy in _of_type(template, "AWS::IAM::Policy").values()
        if {"Ref": role_id} in policy["Properties"]["Roles"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]


def _actions(statement: dict[str, Any]) -> set[str]:
    action = statement["Action"]
    return {action} if isinstance(action, str) else set(action)


def test_every_environment_has_an_images_stack_with_the_repository_and_the_build(
    stack_templates: dict[str, dict[str, dict[str, Any]]], env_name: str
) -> None:
    stacks = stack_templates[env_name]
    assert "Images" in stacks, f"{env_name} has no Images stack: stacks {sorted(stacks)}"
    resources = stacks["Images"]["Resources"].values()
    repositories = [r for r in resources if r["Type"] == "AWS::ECR::Repository"]
    assert [r["Properties"]["RepositoryName"] for r in repositories] == [repository_name(f"ml-{env_name}")]
    assert [r for r in resources if r["Type"] == "AWS::CodeBuild::Project"]
    assert [r for r in resources if r["Type"] == "Custom::NvrxImageBuild"]


def test_the_repository_is_immutable_scanned_expiring_and_goes_with_the_stack(images: dict[str, Any]) -> None:
    _, repository = _one(images, "AWS::ECR::Repository")
    props = repository["Properties"]
    assert props["ImageTagMutability"] == "IMMUTABLE"
    assert props["ImageScanningConfiguration"] == {"ScanOnPush": True}
    rules = json.loads(props["LifecyclePolicy"]["LifecyclePolicyText"])["rules"]
    assert [(r["selection"]["tagStatus"], r["selection"]["countType"]) for r in rules] == [
        ("untagged", "sinceImagePushed"),
        ("any", "imageCountMoreThan"),
    ]
    assert rules[1]["selection"]["countNumber"] == KEEP_IMAGES
    # A fixed name: a retained repository would fail the next create (after a destroy or a failed first deploy).
    assert (repository["DeletionPolicy"], repository["UpdateReplacePolicy"], props["EmptyOnDelete"]) == (
        "Delete",
        "Delete",
        True,
    )


def test_the_project_builds_the_context_from_the_locked_base_and_pushes_the_context_tag(
    images: dict[str, Any], env_name: str
) -> None:
    _, project = _one(images, "AWS::CodeBuild::Project")
    props = project["Properties"]
    assert props["Environment"]["PrivilegedMode"] is True
    assert props["Environment"]["Image"] == "aws/codebuild/standard:7.0"
    assert props["TimeoutInMinutes"] == BUILD_TIMEOUT_MINUTES
    assert props["ConcurrentBuildLimit"] == 1
    assert props["Source"]["Type"] == "S3"  # the asset of images/nvrx
    assert "cdk-hnb659fds-assets" in json.dumps(props["Source"]["Location"])
    variables = {v["Name"]: v["Value"] for v in props["Environment"]["EnvironmentVariables"]}
    assert variables["BASE"] == build_base()
    assert variables["IMAGE"]["Fn::Join"][1][-1] == f":{context_tag()}"
    region = ENVIRONMENTS[env_name].region
    assert variables["REGISTRY"] == {
        "Fn::Join": ["", [{"Ref": "AWS::AccountId"}, f".dkr.ecr.{region}.", {"Ref": "AWS::URLSuffix"}]]
    }
    spec = json.loads(props["Source"]["BuildSpec"])
    assert spec["phases"]["pre_build"]["commands"] == [
        "BUILD_START=$(date +%s)",  # the last build command says how long it took against the limit
        "aws ecr-public get-login-password --region us-east-1 | "
        "docker login --username AWS --password-stdin public.ecr.aws",
        'aws ecr get-login-password --region $AWS_REGION | docker login --username AWS --password-stdin "$REGISTRY"',
        # The lock's tag resolved to its digest here, or the build refused (a pinned digest the tag no longer names).
        'FROM_DIGEST=$(sh resolve_base.sh "$BASE")',
    ]
    assert spec["phases"]["build"]["commands"][1:] == [
        'docker build --build-arg "BASE=$FROM_DIGEST" --label "org.opencontainers.image.base.name=${BASE%@*}" '
        '--label "org.opencontainers.image.base.digest=${FROM_DIGEST##*@}" --tag "$IMAGE" .',
        'docker push "$IMAGE"',
        f'echo "pull, build and push took $(( ($(date +%s) - BUILD_START) / 60 )) min of the '
        f'{BUILD_TIMEOUT_MINUTES}-min limit"',
    ]
    assert "$FROM_DIGEST" in spec["phases"]["build"]["commands"][0]  # the build log names the digest
    assert "post_build" not in spec["phases"]  # it would run after a failed build too
    # A command's failure ends its phase and a failed pre_build runs no build (CodeBuild User Guide, build phase
    # transitions); variables set by one command stay for the next in buildspec 0.2.
    assert spec["version"] == "0.2"


def test_the_custom_resource_waits_for_the_build_within_cloudformations_hour(images: dict[str, Any]) -> None:
    _, build = _one(images, "Custom::NvrxImageBuild")
    props = build["Properties"]
    assert (props["ImageTag"], props["Base"]) == (context_tag(), build_base())
    assert props["ServiceTimeout"] == str(CUSTOM_RESOURCE_TIMEOUT_MINUTES * 60) == "3600"
    handlers = {f["Properties"]["Handler"]: f["Properties"] for f in _of_type(images, "AWS::Lambda::Function").values()}
    for handler in ("image_build.on_event", "image_build.is_complete"):
        assert handlers[handler]["Runtime"] == "python3.14"
        assert "S3Key" in handlers[handler]["Code"]  # the module as an asset, not inline code
    _, waiter = _one(images, "AWS::StepFunctions::StateMachine")
    definition = json.dumps(waiter["Properties"]["DefinitionString"])
    # Provider framework: maxAttempts = totalTimeout / queryInterval = 55 min / 30 s.
    assert '\\"IntervalSeconds\\":30' in definition
    assert '\\"MaxAttempts\\":110' in definition
    assert waiter["Properties"]["LoggingConfiguration"]["Level"] == "ALL"


def test_iam_is_scoped_to_the_project_and_the_repository(images: dict[str, Any]) -> None:
    (project_id, project) = _one(images, "AWS::CodeBuild::Project")
    (repository_id, _) = _one(images, "AWS::ECR::Repository")
    project_arn = {"Fn::GetAtt": [project_id, "Arn"]}
    repository_arn = {"Fn::GetAtt": [repository_id, "Arn"]}
    functions = {f["Properties"]["Handler"]: f for f in _of_type(images, "AWS::Lambda::Function").values()}
    for handler, action in (
        ("image_build.on_event", "codebuild:StartBuild"),
        ("image_build.is_complete", "codebuild:BatchGetBuilds"),
    ):
        role = functions[handler]["Properties"]["Role"]["Fn::GetAtt"][0]
        assert [(_actions(s), s["Resource"]) for s in _statements(images, role)] == [
            ({action}, project_arn),
            ({"ecr:DescribeImages"}, repository_arn),
        ]
    statements = _statements(images, project["Properties"]["ServiceRole"]["Fn::GetAtt"][0])
    assert [s["Resource"] for s in statements if _actions(s) == PUSH] == [repository_arn]
    assert [_actions(s) for s in statements if s["Resource"] == "*"] == [TOKEN_ACTIONS]
    assert all("ecr:PutImage" not in _actions(s) for s in statements if s["Resource"] != repository_arn)


# What a state machine needs to deliver its logs to CloudWatch Logs, none of which supports resource-level permissions
# (Step Functions developer guide, "IAM policies for logging to CloudWatch Logs"; aws-cdk-lib's own StateMachine
# grants exactly these).
LOG_DELIVERY = {
    "logs:CreateLogDelivery",
    "logs:GetLogDelivery",
    "logs:UpdateLogDelivery",
    "logs:DeleteLogDelivery",
    "logs:ListLogDeliveries",
    "logs:PutResourcePolicy",
    "logs:DescribeResourcePolicies",
    "logs:DescribeLogGroups",
}


def test_the_waiter_delivers_its_logs_and_writes_no_log_group(images: dict[str, Any]) -> None:
    """The Provider framework's waiter (aws-cdk-lib 2.275.0 waiter-state-machine.js) adds logs:CreateLogStream and
    logs:PutLogEvents on '*' to the delivery grants, which let its role write into any log group of the account; Step
    Functions delivers the logs itself (issue 38: the acknowledgment listed the delivery actions alone)."""
    (_, waiter) = _one(images, "AWS::StepFunctions::StateMachine")
    statements = _statements(images, waiter["Properties"]["RoleArn"]["Fn::GetAtt"][0])
    anywhere = [_actions(s) for s in statements if s["Resource"] == "*"]
    assert anywhere == [LOG_DELIVERY]
    assert all(a.startswith("lambda:") for s in statements if s["Resource"] != "*" for a in _actions(s))


def test_the_project_and_waiter_roles_are_this_projects_and_this_accounts_state_machines(
    images: dict[str, Any], env_name: str
) -> None:
    """CodeBuild User Guide, "Allow CodeBuild to interact with other AWS services"; Step Functions Developer Guide,
    "Creating an IAM role for your state machine" (issue 38: service roles without aws:SourceAccount/SourceArn)."""
    region = ENVIRONMENTS[env_name].region
    (_, project) = _one(images, "AWS::CodeBuild::Project")
    name = project["Properties"]["Name"]
    assert name == f"ml-{env_name}-nvrx-image"
    (_, waiter) = _one(images, "AWS::StepFunctions::StateMachine")
    for role_id, source in (
        (
            project["Properties"]["ServiceRole"]["Fn::GetAtt"][0],
            [f":project/{name}", f":build/{name}:*"],
        ),
        (waiter["Properties"]["RoleArn"]["Fn::GetAtt"][0], [":stateMachine:*"]),
    ):
        (trust,) = images["Resources"][role_id]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
        assert trust["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
        arns = trust["Condition"]["ArnLike"]["aws:SourceArn"]
        arns = arns if isinstance(arns, list) else [arns]
        assert [a["Fn::Join"][1][-1] for a in arns] == source
        assert all(a["Fn::Join"][1][1] == {"Ref": "AWS::AccountId"} and region in a["Fn::Join"][1][0] for a in arns)


def test_outputs_name_the_image_and_its_digest(images: dict[str, Any], env_name: str) -> None:
    outputs = images["Outputs"]
    (build_id, _) = _one(images, "Custom::NvrxImageBuild")
    assert outputs["NvrxImageDigest"]["Value"] == {"Fn::GetAtt": [build_id, "ImageDigest"]}
    assert outputs["NvrxImageUri"]["Value"]["Fn::Join"][1][-1] == f":{context_tag()}"
    assert outputs["PinCommand"]["Value"] == {
        "Fn::Join": ["", [f"trainctl pin --built {env_name} --account ", {"Ref": "AWS::AccountId"}]]
    }


def test_the_stack_reads_nothing_from_another_stack(
    images: dict[str, Any], assembly: dict[str, Any], env_name: str
) -> None:
    text = json.dumps(images)
    assert "Fn::ImportValue" not in text
    assert "Fn::GetStackOutput" not in text
    assert assembly[env_name]["Images"].dependencies == ()


def test_a_private_ecr_base_is_pulled_from_its_repository_only() -> None:
    import aws_cdk as cdk
    from aws_cdk.assertions import Template

    from infra.images import NvrxImageBuild

    base = "763104351884.dkr.ecr.us-east-2.amazonaws.com/pytorch-training:2.9.0-gpu-py312-cu130-ubuntu22.04-ec2-v1.11"
    stack = cdk.Stack(cdk.App(), "Images", env=cdk.Environment(region="us-east-2"))
    NvrxImageBuild(stack, "NvrxImage", environment=ENVIRONMENTS["prod"], base=base)
    template = dict(Template.from_stack(stack).to_json())
    _, project = _one(template, "AWS::CodeBuild::Project")
    spec = json.loads(project["Properties"]["Source"]["BuildSpec"])
    assert spec["phases"]["pre_build"]["commands"][1] == (
        "aws ecr get-login-password --region us-east-2 | docker login --username AWS --password-stdin "
        "763104351884.dkr.ecr.us-east-2.amazonaws.com"
    )
    statements = _statements(template, project["Properties"]["ServiceRole"]["Fn::GetAtt"][0])
    pulls = [
        s
        for s in statements
        if _actions(s) == {"ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"}
    ]
    assert [s["Resource"] for s in pulls] == [
        {
            "Fn::Join": [
                "",
                ["arn:", {"Ref": "AWS::Partition"}, ":ecr:us-east-2:763104351884:repository/pytorch-training"],
            ]
        }
    ]
    assert [_actions(s) for s in statements if s["Resource"] == "*"] == [{"ecr:GetAuthorizationToken"}]


def test_a_base_from_another_registry_is_refused_naming_the_field() -> None:
    assert base_registry(build_base()).kind is RegistryKind.ECR_PUBLIC
    with pytest.raises(ConfigError) as error:
        base_registry("docker.io/pytorch/pytorch:2.9.0-cuda13.0-cudnn9-runtime")
    assert str(error.value).startswith("images.nvrx-train.reference='docker.io/pytorch/pytorch:2.9.0-cuda13.0")
    assert "Fix: pin the PyTorch training DLC from ECR Public or from its in-region ECR registry" in str(error.value)


def test_the_assets_hold_the_build_context_and_the_handler_module_alone(images: dict[str, Any], cdk_out: Path) -> None:
    from infra.spec.images import NVRX_CONTEXT

    def files(s3_key: Any) -> list[str]:
        directory = cdk_out / f"asset.{str(s3_key).removesuffix('.zip')}"
        return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())

    handlers = {f["Properties"]["Handler"]: f for f in _of_type(images, "AWS::Lambda::Function").values()}
    code = handlers["image_build.on_event"]["Properties"]["Code"]
    assert files(code["S3Key"]) == ["image_build.py"]  # no __pycache__, no __init__.py: a deterministic asset
    _, project = _one(images, "AWS::CodeBuild::Project")
    location = project["Properties"]["Source"]["Location"]["Fn::Join"][1][-1]
    assert files(location.rpartition("/")[2]) == sorted(
        str(p.relative_to(NVRX_CONTEXT)) for p in NVRX_CONTEXT.rglob("*") if p.is_file()
    )
