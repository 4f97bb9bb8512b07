"""Stateful resources keep their logical IDs; templates are snapshotted and deterministic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from syrupy.assertion import SnapshotAssertion
from syrupy.extensions.json import JSONSnapshotExtension

from app import create_app
from infra.spec import ENVIRONMENTS
from infra.spec.replacement_names import gpu_nodegroup_name, system_nodegroup_name
from tests.conftest import cdk_json_context
from trainctl.template_plan import masked

# Renaming any of these, or moving it to another stack, replaces the resource on the next deploy:
# the VPC and everything in it, the cluster, or the key that encrypts its secrets. Per stack id.
STATEFUL_LOGICAL_IDS = {
    "Platform": {
        "NetworkVpc7FB7348F": "AWS::EC2::VPC",
        "EksClusterB2BDED5B": "AWS::EKS::Cluster",
        "EksSecretsKey89C78FFD": "AWS::KMS::Key",
        "NetworkFlowLogGroup4F8CEEEF": "AWS::Logs::LogGroup",
        # Not the group itself (EKS owns that): the custom resource that sets its retention.
        "EksControlPlaneLogRetentionE2184B05": "Custom::LogRetention",
        "SystemNodesNodegroup3B4985D9": "AWS::EKS::Nodegroup",
    },
    # prod only: the checkpoint file system holds every saved training state.
    "Storage": {"CheckpointStorageFileSystemED3CAA15": "AWS::FSx::FileSystem"},
}

# Stacks per environment (construct id -> stack name): what `cdk deploy '<env>/<id>'` names.
STACKS = {
    # dev has checkpoint storage too (issue 17: every multi-pod job needs a directory all its pods see).
    "dev": {
        "Images": "ml-dev-images",
        "Platform": "ml-dev-platform",
        "Storage": "ml-dev-storage",
        "Gpu-g6": "ml-dev-gpu-g6",
    },
    "prod": {
        "Images": "ml-prod-images",
        "Platform": "ml-prod-platform",
        "Storage": "ml-prod-storage",
        "Gpu-p5": "ml-prod-gpu-p5",
        "Gpu-g6": "ml-prod-gpu-g6",
    },
}


def test_stacks_per_environment(assembly: dict[str, Any], env_name: str) -> None:
    stacks = {stack.id: stack.name for stack in assembly[env_name].values()}
    assert stacks == STACKS[env_name]


def test_each_stack_but_platform_depends_on_platform_alone(assembly: dict[str, Any], env_name: str) -> None:
    # Storage and every Gpu-<group> deploy alone after Platform; a GPU stack never waits for
    # (or rolls back with) Storage or another GPU group. Images depends on nothing (it deploys first, or alone).
    stacks = assembly[env_name]
    assert stacks["Platform"].dependencies == ()
    assert stacks["Images"].dependencies == ()
    for stack in stacks.values():
        if stack.id not in ("Images", "Platform"):
            assert stack.dependencies == ("Platform",), stack.id


def test_stateful_logical_ids_are_pinned(stack_templates: dict[str, dict[str, Any]], env_name: str) -> None:
    for stack, expected in STATEFUL_LOGICAL_IDS.items():
        if stack not in stack_templates[env_name]:
            assert env_name == "dev"
            assert stack == "Storage"
            continue
        found = {k: v["Type"] for k, v in stack_templates[env_name][stack]["Resources"].items()}
        for logical_id, cfn_type in expected.items():
            assert found.get(logical_id) == cfn_type, f"{stack}/{logical_id} ({cfn_type}) moved or vanished"


def test_gpu_node_groups_are_only_in_their_own_stacks(
    stack_templates: dict[str, dict[str, Any]], env_name: str
) -> None:
    for stack, template in stack_templates[env_name].items():
        names = {
            r["Properties"]["NodegroupName"]
            for r in template["Resources"].values()
            if r["Type"] == "AWS::EKS::Nodegroup"
        }
        env = ENVIRONMENTS[env_name]
        if stack.startswith("Gpu-"):
            (group,) = [g for g in env.gpu_node_groups if g.name == stack.removeprefix("Gpu-")]
            assert names == {gpu_nodegroup_name(env, group)}
        elif stack == "Platform":
            assert names == {system_nodegroup_name(env)}
        else:
            assert names == set()


@pytest.fixture
def snapshot_json(snapshot: SnapshotAssertion) -> SnapshotAssertion:
    return snapshot.use_extension(JSONSnapshotExtension)


def test_template_snapshot(
    stack_templates: dict[str, dict[str, Any]], env_name: str, snapshot_json: SnapshotAssertion
) -> None:
    assert {name: masked(t) for name, t in stack_templates[env_name].items()} == snapshot_json


def test_synthesis_is_deterministic(cdk_out: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    # A second synth, plain (make test's shared one has cdk-nag attached, which must change no template), byte for
    # byte the same in every template of every stage.
    again = tmp_path_factory.mktemp("again")
    app, _ = create_app(context=cdk_json_context(), environ={}, outdir=str(again))
    app.synth()
    first = sorted(p.relative_to(cdk_out) for p in cdk_out.glob("assembly-*/*.template.json"))
    second = sorted(p.relative_to(again) for p in again.glob("assembly-*/*.template.json"))
    assert first == second
    assert len(first) == 9  # dev: Images, Platform, Storage, Gpu-g6; prod: the same and Gpu-p5
    for path in first:
        assert (again / path).read_bytes() == (cdk_out / path).read_bytes(), path
