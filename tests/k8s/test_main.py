"""The cdk8s app: what it writes per environment, and how it refuses unpinned images."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.spec import ENVIRONMENTS
from k8s.check_lock import check_lock, placeholder_digest
from k8s.images import DIGEST, LOCK_PATH, ImageLock, UnpinnedImagesError
from k8s.main import synth_all
from rehearse.manifests import yaml_documents
from tests.conftest import ROOT

EXPECTED_FILES = {
    "namespaces.k8s.yaml",
    "training-code.k8s.yaml",
    "ray-cluster.k8s.yaml",
    "ray-finetune.k8s.yaml",
    "fabric-check.k8s.yaml",
    "fabric-ab.k8s.yaml",
    "nvrx-fsdp.k8s.yaml",
}


def _kinds(directory: Path) -> dict[str, list[str]]:
    return {p.name: [d["kind"] for d in yaml_documents(p.read_text()) if d] for p in sorted(directory.glob("*.yaml"))}


def test_every_environment_gets_namespaces_code_cluster_and_job(dist: Path) -> None:
    for env in ENVIRONMENTS:
        kinds = _kinds(dist / env)
        assert set(kinds) == EXPECTED_FILES
        # Each workload with its NetworkPolicies (infra/spec/network_policies.py): a Ray workload's two, a Job's one.
        assert kinds["ray-cluster.k8s.yaml"] == ["RayCluster", "NetworkPolicy", "NetworkPolicy"]
        assert kinds["ray-finetune.k8s.yaml"] == ["RayJob", "NetworkPolicy", "NetworkPolicy"]
        assert kinds["training-code.k8s.yaml"] == ["ConfigMap"] * 4  # two per namespace (the fabric tools apart)
        groups = len(ENVIRONMENTS[env].gpu_node_groups)
        # The check and the A/B job apart (issue 17 #5): each takes every node of a two-node group.
        for kind in ("check", "ab"):
            assert sorted(kinds[f"fabric-{kind}.k8s.yaml"]) == sorted(["Service", "Job", "NetworkPolicy"] * groups)
        assert kinds["nvrx-fsdp.k8s.yaml"] == ["Service", "Job", "NetworkPolicy"]
        # The namespaces with their NetworkPolicies and pod policy (k8s/charts/pod_security.py: Baseline plus
        # IPC_LOCK) and, with them, the fabric gate (k8s/charts/fabric_gate.py): the gated pods' identity in each
        # workload namespace, the controller's (a Role in each, one in default for the Nodes' Events, a
        # ClusterRole), its policy, code, config and Deployment.
        assert sorted(kinds["namespaces.k8s.yaml"]) == sorted(
            ["Namespace", "NetworkPolicy"] * 3
            + ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
            + ["ServiceAccount", "Role", "RoleBinding"] * 2
            + ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"]
            + ["Role", "RoleBinding"] * 3
            + ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ConfigMap", "ConfigMap", "Deployment"]
        )


def test_synth_is_deterministic(tmp_path: Path) -> None:
    lock = check_lock(ImageLock.load())
    synth_all(tmp_path / "a", lock)
    synth_all(tmp_path / "b", lock)
    for env in ENVIRONMENTS:
        for name in EXPECTED_FILES:
            assert (tmp_path / "a" / env / name).read_bytes() == (tmp_path / "b" / env / name).read_bytes()


def test_unpinned_lock_writes_what_it_can_then_fails(tmp_path: Path) -> None:
    with pytest.raises(UnpinnedImagesError) as err:
        synth_all(tmp_path, ImageLock.load())
    assert "ray-train" in str(err.value)
    for env in ENVIRONMENTS:
        assert set(_kinds(tmp_path / env)) == {"namespaces.k8s.yaml", "training-code.k8s.yaml"}


def test_module_entry_fails_loudly_with_both_remedies(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "k8s.main"],
        cwd=ROOT,
        env={**os.environ, "CDK8S_OUTDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1
    assert "workload manifests not written" in result.stderr
    assert "ray-train: public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1.0 has no digest" in result.stderr
    assert "`trainctl pin`" in result.stderr
    assert "--set NAME=REF@sha256:<digest>" in result.stderr


def test_check_lock_fills_only_missing_digests_with_placeholders() -> None:
    real = "sha256:" + hashlib.sha256(b"content made by this test").hexdigest()
    lock = ImageLock.load().with_digest("ray-train", real)
    assert check_lock(lock).get("ray-train").digest == real
    filled = check_lock(ImageLock.load()).get("ray-train")
    assert filled.digest == placeholder_digest(filled.reference)
    assert DIGEST.match(filled.digest or "")
    assert placeholder_digest("a:1") != placeholder_digest("a:2")


def test_check_lock_refuses_to_overwrite_the_committed_lock(tmp_path: Path) -> None:
    before = LOCK_PATH.read_bytes()
    result = subprocess.run(
        [sys.executable, "-m", "k8s.check_lock", str(LOCK_PATH)], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 2
    assert LOCK_PATH.read_bytes() == before
    out = tmp_path / "check" / "images.lock.json"
    assert subprocess.run([sys.executable, "-m", "k8s.check_lock", str(out)], cwd=ROOT).returncode == 0
    assert ImageLock.load(out).get("ray-train").digest is not None
