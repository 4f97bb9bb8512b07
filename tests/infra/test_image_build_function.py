"""infra/functions/image_build.py, the NVRx image build's custom-resource handlers, against moto in server mode
(CodeBuild and ECR on loopback) and, for what moto 5.2.5 cannot show, a CodeBuild endpoint on loopback.

moto's CodeBuild answers StartBuild and BatchGetBuilds, but its BatchGetBuilds marks every build SUCCEEDED on the
first call, even one StopBuild stopped (moto/codebuild/models.py `batch_get_builds`): a build still running and a
FAILED build with its failed phase are served by `CodeBuildBuilds` below, a JSON 1.1 server
speaking CodeBuild's protocol (X-Amz-Target CodeBuild_20161006.BatchGetBuilds). The build's push is moto's
ecr:PutImage, as `docker push` would leave it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import boto3
import pytest

from infra.functions import image_build
from tests.ecr_images import push_manifest
from tests.trainctl.fake_aws import LoopbackStub, MotoServer, Reply

REGION = "us-east-2"
REPOSITORY = "ml-prod/nvrx-train"
PROJECT = "NvrxImageProject"
TAG = "nvrx-0123456789ab"
BASE = (
    "public.ecr.aws/deep-learning-containers/pytorch-training:2.9.0-gpu-py312-cu130-ubuntu22.04-ec2-v1.11@sha256:"
    + "2" * 64
)
PROPERTIES = {"ProjectName": PROJECT, "RepositoryName": REPOSITORY, "ImageTag": TAG, "Base": BASE}


@pytest.fixture
def aws(moto: MotoServer, fake_aws_credentials: None, monkeypatch: pytest.MonkeyPatch) -> MotoServer:
    """boto3 in the handler reaches moto through the service endpoint variables."""
    moto.reset()
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ENDPOINT_URL_CODEBUILD", moto.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL_ECR", moto.url)
    _client("ecr", moto).create_repository(repositoryName=REPOSITORY, imageTagMutability="IMMUTABLE")
    _client("codebuild", moto).create_project(
        name=PROJECT,
        source={"type": "S3", "location": "assets/context.zip"},
        artifacts={"type": "NO_ARTIFACTS"},
        environment={
            "type": "LINUX_CONTAINER",
            "image": "aws/codebuild/standard:7.0",
            "computeType": "BUILD_GENERAL1_LARGE",
            "privilegedMode": True,
        },
        serviceRole="arn:aws:iam::123456789012:role/build",
    )
    return moto


def _client(service: str, moto: MotoServer) -> Any:
    return boto3.Session(region_name=REGION).client(service, endpoint_url=moto.url)


def _push(moto: MotoServer, tag: str = TAG) -> str:
    """What the build's `docker push` leaves in the repository: a manifest under the tag."""
    return push_manifest(_client("ecr", moto), REPOSITORY, tag)


def _event(request: str, *, old: dict[str, str] | None = None, physical: str | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {"RequestType": request, "ResourceProperties": dict(PROPERTIES)}
    if old is not None:
        event["OldResourceProperties"] = old
    if physical is not None:
        event["PhysicalResourceId"] = physical
    return event


def _builds(moto: MotoServer) -> list[str]:
    ids: list[str] = _client("codebuild", moto).list_builds_for_project(projectName=PROJECT)["ids"]
    return ids


def _waited(event: dict[str, Any], on_event_result: dict[str, Any]) -> dict[str, Any]:
    """What the Provider framework hands isComplete: the request merged with onEvent's answer
    (aws-cdk-lib 2.275.0 custom-resources/lib/provider-framework/runtime/framework.js createResponseEvent)."""
    return {**event, **on_event_result}


def test_create_starts_the_build_and_completes_with_the_pushed_digest(aws: MotoServer) -> None:
    event = _event("Create")
    started = image_build.on_event(event)
    assert started["PhysicalResourceId"] == f"{REPOSITORY}:{TAG}"
    assert _builds(aws) == [started["BuildId"]]
    digest = _push(aws)  # the build pushed the tag
    done = image_build.is_complete(_waited(event, started))
    assert done == {"IsComplete": True, "Data": {"ImageDigest": digest, "BuildId": started["BuildId"]}}


def test_a_tag_already_pushed_starts_no_build(aws: MotoServer) -> None:
    digest = _push(aws)
    for event in (
        _event("Create"),  # a re-deploy after a destroy that left the image (or a retried create)
        _event("Update", old={**PROPERTIES, "ImageTag": "nvrx-ba9876543210"}, physical=f"{REPOSITORY}:x"),  # rollback
        # The lock pinned the base's digest, same frozen tag, same Dockerfile: the image of this context is there.
        _event("Update", old={**PROPERTIES, "Base": BASE.partition("@")[0]}, physical=f"{REPOSITORY}:{TAG}"),
    ):
        started = image_build.on_event(event)
        assert "BuildId" not in started
        assert image_build.is_complete(_waited(event, started))["Data"]["ImageDigest"] == digest
    assert _builds(aws) == []


def test_an_update_to_a_new_tag_builds_it(aws: MotoServer) -> None:
    _push(aws, "nvrx-ba9876543210")  # the previous Dockerfile's image stays
    event = _event("Update", old={**PROPERTIES, "ImageTag": "nvrx-ba9876543210"}, physical=f"{REPOSITORY}:old")
    started = image_build.on_event(event)
    assert (started["PhysicalResourceId"], _builds(aws)) == (f"{REPOSITORY}:{TAG}", [started["BuildId"]])


def test_a_build_that_succeeded_without_the_tag_fails_the_deploy(aws: MotoServer) -> None:
    event = _event("Create")
    started = image_build.on_event(event)
    with pytest.raises(RuntimeError, match=f"{REPOSITORY}:{TAG} is not in the repository after CodeBuild build"):
        image_build.is_complete(_waited(event, started))


def test_delete_builds_nothing_and_keeps_the_physical_id(aws: MotoServer) -> None:
    event = _event("Delete", physical=f"{REPOSITORY}:{TAG}")
    assert image_build.on_event(event) == {"PhysicalResourceId": f"{REPOSITORY}:{TAG}"}
    assert image_build.is_complete(event) == {"IsComplete": True}
    assert _builds(aws) == []


class CodeBuildBuilds(LoopbackStub):
    """CodeBuild's BatchGetBuilds on loopback, answering each call with the next of `answers`."""

    def __init__(self, answers: list[dict[str, Any]]) -> None:
        super().__init__()
        self.answers = answers

    def handle(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Reply:
        target = headers.get("X-Amz-Target", "")
        self.calls.append(target.rpartition(".")[2])
        if target != "CodeBuild_20161006.BatchGetBuilds":
            return 400, {"Content-Type": "application/x-amz-json-1.1"}, b'{"__type":"InvalidInputException"}'
        (build_id,) = json.loads(body)["ids"]
        build = {"id": build_id, **self.answers.pop(0)}
        return 200, {"Content-Type": "application/x-amz-json-1.1"}, json.dumps({"builds": [build]}).encode()


@pytest.fixture
def codebuild_builds(aws: MotoServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[CodeBuildBuilds]:
    logs = "https://us-east-2.console.aws.amazon.com/cloudwatch/home?region=us-east-2#logsV2:log-groups/build"
    server = CodeBuildBuilds(
        [
            {"buildStatus": "IN_PROGRESS", "currentPhase": "BUILD"},
            {
                "buildStatus": "FAILED",
                "currentPhase": "COMPLETED",
                "phases": [
                    {"phaseType": "PRE_BUILD", "phaseStatus": "SUCCEEDED"},
                    {
                        "phaseType": "BUILD",
                        "phaseStatus": "FAILED",
                        "contexts": [
                            {
                                "statusCode": "COMMAND_EXECUTION_ERROR",
                                "message": 'Error while executing command: docker push "$IMAGE". Reason: exit status 1',
                            }
                        ],
                    },
                ],
                "logs": {"deepLink": logs},
            },
        ]
    )
    server.start()
    monkeypatch.setenv("AWS_ENDPOINT_URL_CODEBUILD", server.url)
    try:
        yield server
    finally:
        server.stop()


def test_a_running_build_is_polled_and_a_failed_one_names_its_phase_and_logs(codebuild_builds: CodeBuildBuilds) -> None:
    event = {**_event("Create"), "BuildId": f"{PROJECT}:0b8c"}
    assert image_build.is_complete(event) == {"IsComplete": False}  # no Data: the framework refuses Data then
    with pytest.raises(RuntimeError) as error:
        image_build.is_complete(event)
    assert str(error.value) == (
        f"CodeBuild build {PROJECT}:0b8c of the NVRx image ended FAILED in phase BUILD (Error while executing "
        'command: docker push "$IMAGE". Reason: exit status 1). Build logs: '
        "https://us-east-2.console.aws.amazon.com/cloudwatch/home?region=us-east-2#logsV2:log-groups/build"
    )
    assert codebuild_builds.calls == ["BatchGetBuilds", "BatchGetBuilds"]
