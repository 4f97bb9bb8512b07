"""The cdk8s app: what it writes per environment, and how it refuses unpinned images."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from infra.spec import ENVIRONMENTS
from k8s.check_lock import check_lock, placeholder_digest
from k8s.images import DIGEST, LOCK_PATH, ImageLock
from k8s.main import main, synth_all
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
        # ClusterRole), its two policies (nodes, ClusterQueues), code, config and Deployment. No Capacity Block group:
        # no hold controller.
        assert sorted(kinds["namespaces.k8s.yaml"]) == sorted(
            ["Namespace", "NetworkPolicy"] * 3
            + ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
            + ["ServiceAccount", "Role", "RoleBinding"] * 2
            + ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"]
            + ["Role", "RoleBinding"] * 3
            + ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"] * 2
            + ["ConfigMap", "ConfigMap", "Deployment"]
        )


def test_synth_is_deterministic(tmp_path: Path) -> None:
    lock = check_lock(ImageLock.load())
    synth_all(tmp_path / "a", lock)
    synth_all(tmp_path / "b", lock)
    for env in ENVIRONMENTS:
        for name in EXPECTED_FILES:
            assert (tmp_path / "a" / env / name).read_bytes() == (tmp_path / "b" / env / name).read_bytes()


def _lock_without(tmp_path: Path, *names: str) -> Path:
    """The check lock (every image pinned) with `names` unpinned again, written where IMAGE_LOCK can name it."""
    lock = check_lock(ImageLock.load())
    for name in names:
        lock = lock.with_image(replace(lock.get(name), digest=None))
    path = tmp_path / "images.lock.json"
    lock.write(path)
    return path


def _main(
    lock: Path, out: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    monkeypatch.setenv("IMAGE_LOCK", str(lock))
    code = main(["--output", str(out)])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("unpinned", "written", "not_written"),
    [
        # Without the Ray image: every Ray chart and fabric job; the gate and the NVRx job are written.
        (
            "ray-train",
            {"namespaces.k8s.yaml", "training-code.k8s.yaml", "nvrx-fsdp.k8s.yaml"},
            ["ray-cluster", "ray-finetune", "fabric-check", "fabric-ab"],
        ),
        # Without the controller: the gate, and the gated workloads that need its identity.
        (
            "fabric-gate-controller",
            EXPECTED_FILES - {"ray-finetune.k8s.yaml", "nvrx-fsdp.k8s.yaml"},
            ["fabric-gate (in namespaces.k8s.yaml)", "ray-finetune", "nvrx-fsdp"],
        ),
    ],
)
def test_main_writes_every_chart_whose_images_are_pinned_and_lists_the_rest(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    unpinned: str,
    written: set[str],
    not_written: list[str],
) -> None:
    lock = _lock_without(tmp_path, unpinned)
    reference = ImageLock.load(lock).get(unpinned).reference
    code, err = _main(lock, tmp_path / "dist", monkeypatch, capsys)
    assert code == 1
    fix = f"`trainctl pin` (no registry reachable: `trainctl pin --set {unpinned}={reference}@sha256:<digest>`)"
    charts = ", ".join(f"{env}/{chart}" for env in ENVIRONMENTS for chart in not_written)
    # One entry per missing image: what, the fix, and every chart it holds back.
    assert err.splitlines()[:2] == [f"image {unpinned} has no digest: {fix}", f"  not written: {charts}"]
    for env in ENVIRONMENTS:
        assert set(_kinds(tmp_path / "dist" / env)) == written
    if unpinned == "fabric-gate-controller":
        assert "Deployment" not in _kinds(tmp_path / "dist" / "dev")["namespaces.k8s.yaml"]


def test_main_with_every_image_pinned_writes_what_synth_all_writes(
    tmp_path: Path, dist: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "dist"
    (out / "dev").mkdir(parents=True)
    (out / "dev" / "stale.k8s.yaml").write_text("kind: Left\n")  # from an earlier run: removed
    code, err = _main(_lock_without(tmp_path), out, monkeypatch, capsys)
    assert (code, err) == (0, "")
    for env in ENVIRONMENTS:
        assert {p.name: p.read_bytes() for p in (out / env).iterdir()} == {
            p.name: p.read_bytes() for p in (dist / env).iterdir()
        }


def test_module_entry_on_a_fresh_lock_lists_every_fix_without_a_traceback(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "k8s.main", "--output", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    ray = lines.index(
        "image ray-train has no digest: `trainctl pin` (no registry reachable: `trainctl pin --set "
        "ray-train=public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1.0@sha256:<digest>`)"
    )
    assert lines[ray + 1].startswith("  not written: dev/ray-cluster, dev/ray-finetune, dev/fabric-check, ")
    assert (
        "image nvrx-train-prod is not built yet: `cdk deploy 'prod/Images'`, then "
        "`trainctl pin --built prod --account ACCOUNT`"
    ) in result.stderr
    assert len([line for line in lines if line.startswith("  not written: ")]) == 4, "one entry per missing image"
    assert f"  - {tmp_path}/dev/namespaces.k8s.yaml" in result.stdout.splitlines()
    for env in ENVIRONMENTS:
        assert set(_kinds(tmp_path / env)) == {"namespaces.k8s.yaml", "training-code.k8s.yaml"}


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
