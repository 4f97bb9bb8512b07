"""Shared fixtures: the app is synthesized once per session and every test reads from it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Template

from app import create_app
from infra.stage import PlatformStage

ROOT = Path(__file__).resolve().parent.parent


def cdk_json_context() -> dict[str, Any]:
    """The feature flags of cdk.json, so tests synthesize exactly what `cdk synth` does."""
    context: dict[str, Any] = json.loads((ROOT / "cdk.json").read_text())["context"]
    return context


@pytest.fixture(scope="session")
def cdk_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cdk.out")


@pytest.fixture(scope="session")
def stages(cdk_out: Path) -> dict[str, PlatformStage]:
    app, built = create_app(context=cdk_json_context(), environ={}, outdir=str(cdk_out))
    app.synth()
    return {stage.environment.name: stage for stage in built}


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Manifests of every environment, synthesized once (as `cdk8s synth` writes them)."""
    from k8s.check_lock import check_lock
    from k8s.images import ImageLock
    from k8s.main import synth_all

    out = tmp_path_factory.mktemp("dist")
    synth_all(out, check_lock(ImageLock.load()))
    return out


@pytest.fixture(scope="session")
def stack_templates(stages: dict[str, PlatformStage]) -> dict[str, dict[str, dict[str, Any]]]:
    """Raw template JSON per environment and stack id (Platform, Storage, Gpu-<group>)."""
    return {
        name: {stack.node.id: dict(Template.from_stack(stack).to_json()) for stack in stage.stacks}
        for name, stage in stages.items()
    }


@pytest.fixture(scope="session")
def templates(stages: dict[str, PlatformStage]) -> dict[str, Template]:
    """The Platform stack of each environment (network, cluster, add-ons)."""
    return {name: Template.from_stack(stage.platform) for name, stage in stages.items()}


@pytest.fixture(scope="session")
def resources(stack_templates: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Every stack of an environment merged into one template JSON, for assertions that walk all of
    an environment's resources (logical ids are unique across its stacks; Outputs are Platform's)."""
    return {name: merged(stacks) for name, stacks in stack_templates.items()}


def merged(stacks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    for stack in stacks.values():
        clash = resources.keys() & stack["Resources"].keys()
        assert not clash, f"logical ids in two stacks: {sorted(clash)}"
        resources.update(stack["Resources"])
    return {**stacks["Platform"], "Resources": resources}


@pytest.fixture(params=["dev", "prod"])
def env_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name
