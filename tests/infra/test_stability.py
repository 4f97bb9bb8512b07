"""Stateful resources keep their logical IDs; templates are snapshotted and deterministic."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from syrupy.assertion import SnapshotAssertion
from syrupy.extensions.json import JSONSnapshotExtension

from app import create_app
from tests.conftest import cdk_json_context

# Renaming any of these replaces the resource on the next deploy: the VPC and
# everything in it, the cluster, or the key that encrypts its secrets.
STATEFUL_LOGICAL_IDS = {
    "NetworkVpc7FB7348F": "AWS::EC2::VPC",
    "EksClusterB2BDED5B": "AWS::EKS::Cluster",
    "EksSecretsKey89C78FFD": "AWS::KMS::Key",
    "NetworkFlowLogGroup4F8CEEEF": "AWS::Logs::LogGroup",
    "EksControlPlaneLogsDB7AEF19": "AWS::Logs::LogGroup",
    "SystemNodesNodegroup3B4985D9": "AWS::EKS::Nodegroup",
}

# prod only: the checkpoint file system holds every saved training state.
STATEFUL_PROD_ONLY = {"AddOnsCheckpointStorageFileSystemA70D8405": "AWS::FSx::FileSystem"}

_ASSET_HASH = re.compile(r"[0-9a-f]{64}")


def test_stateful_logical_ids_are_pinned(resources: dict[str, Any], env_name: str) -> None:
    found = {k: v["Type"] for k, v in resources[env_name]["Resources"].items()}
    expected = {**STATEFUL_LOGICAL_IDS, **(STATEFUL_PROD_ONLY if env_name == "prod" else {})}
    for logical_id, cfn_type in expected.items():
        assert found.get(logical_id) == cfn_type, f"{logical_id} ({cfn_type}) moved or vanished"


def _masked(template_json: dict[str, Any]) -> dict[str, Any]:
    """Asset hashes change with every aws-cdk-lib release; the rest of the template must not."""
    masked: dict[str, Any] = json.loads(_ASSET_HASH.sub("<asset-hash>", json.dumps(template_json, sort_keys=True)))
    return masked


@pytest.fixture
def snapshot_json(snapshot: SnapshotAssertion) -> SnapshotAssertion:
    return snapshot.use_extension(JSONSnapshotExtension)


def test_template_snapshot(resources: dict[str, Any], env_name: str, snapshot_json: SnapshotAssertion) -> None:
    assert _masked(resources[env_name]) == snapshot_json


def test_synthesis_is_deterministic(resources: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> None:
    app, stages = create_app(context=cdk_json_context(), environ={}, outdir=str(tmp_path_factory.mktemp("again")))
    app.synth()
    from aws_cdk.assertions import Template

    for stage in stages:
        again = Template.from_stack(stage.stack).to_json()
        assert json.dumps(again, sort_keys=True) == json.dumps(resources[stage.environment.name], sort_keys=True)
