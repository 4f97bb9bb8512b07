"""The `<env>/Images` stack: the NVRx image built in the account by CodeBuild during `cdk deploy`."""

from __future__ import annotations

from typing import Any

from infra.spec.images import repository_name


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
