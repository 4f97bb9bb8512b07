"""The custom resource that builds the NVRx image during `cdk deploy '<env>/Images'` (infra/images.py), through the
CDK Provider framework: `on_event` starts the CodeBuild build, `is_complete` is polled until it ends.

The repository's tags are immutable and the tag is the hash of the build context (infra/spec/images.py), so an
image already pushed under the tag is that build: no second build is started for it (a re-deploy, a rollback to
the previous Dockerfile, a changed property that is not the context). A new base reference is a new tag: the
Dockerfile's ARG BASE is the lock's reference (tests/k8s/test_nvrx_image.py); a digest pinned for the same frozen
tag reuses the image of that tag. Delete does nothing: the repository is emptied and deleted with the stack
(EmptyOnDelete).

Properties: ProjectName (the CodeBuild project, which holds BASE and IMAGE), RepositoryName, ImageTag, Base.
Standard library and boto3 only: the Lambda Python runtime provides both.
"""

from __future__ import annotations

from typing import Any

import boto3

FAILED_STATUSES = ("FAILED", "FAULT", "STOPPED", "TIMED_OUT")


def _existing_digest(repository: str, tag: str) -> str | None:
    ecr = boto3.client("ecr")
    try:
        answer = ecr.describe_images(repositoryName=repository, imageIds=[{"imageTag": tag}])
    except ecr.exceptions.ImageNotFoundException:
        return None
    details = answer.get("imageDetails") or []
    return str(details[0]["imageDigest"]) if details else None


def on_event(event: dict[str, Any], context: object = None) -> dict[str, Any]:
    props = event["ResourceProperties"]
    repository, tag = props["RepositoryName"], props["ImageTag"]
    if event["RequestType"] == "Delete":
        return {"PhysicalResourceId": event["PhysicalResourceId"]}
    physical_id = f"{repository}:{tag}"
    if _existing_digest(repository, tag) is not None:
        print(f"{physical_id} is already in the repository (immutable tag of this build context): no build")
        return {"PhysicalResourceId": physical_id}
    build = boto3.client("codebuild").start_build(projectName=props["ProjectName"])["build"]
    print(f"started CodeBuild build {build['id']} for {physical_id} FROM {props['Base']}")
    return {"PhysicalResourceId": physical_id, "BuildId": build["id"]}


def _failure(build: dict[str, Any]) -> str:
    failed = [p for p in build.get("phases", []) if p.get("phaseStatus") not in (None, "SUCCEEDED")]
    where = ""
    if failed:
        phase = failed[0]
        messages = "; ".join(c.get("message", "") for c in phase.get("contexts", []) if c.get("message"))
        where = f" in phase {phase['phaseType']}" + (f" ({messages})" if messages else "")
    logs = build.get("logs", {}).get("deepLink", "(no logs link: the build never started)")
    return f"CodeBuild build {build['id']} of the NVRx image ended {build['buildStatus']}{where}. Build logs: {logs}"


def is_complete(event: dict[str, Any], context: object = None) -> dict[str, Any]:
    if event["RequestType"] == "Delete":
        return {"IsComplete": True}
    props = event["ResourceProperties"]
    repository, tag = props["RepositoryName"], props["ImageTag"]
    build_id = event.get("BuildId")
    if build_id:
        (build,) = boto3.client("codebuild").batch_get_builds(ids=[build_id])["builds"]
        status = build["buildStatus"]
        if status == "IN_PROGRESS":
            return {"IsComplete": False}
        if status != "SUCCEEDED":
            raise RuntimeError(_failure(build))
    digest = _existing_digest(repository, tag)
    if digest is None:
        raise RuntimeError(
            f"{repository}:{tag} is not in the repository after "
            + (f"CodeBuild build {build_id} succeeded" if build_id else "a deploy that found it there")
            + ": the buildspec pushes that tag (infra/images.py); read the build's logs"
        )
    return {"IsComplete": True, "Data": {"ImageDigest": digest, "BuildId": build_id or "none: the tag was there"}}
