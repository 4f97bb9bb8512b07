"""The API server's name rules, per kind, before anything runs (issue 37 part D): a Job named `train-$ITEM` (a
template placeholder left in) ran and completed in the rehearsal while `kubectl apply` refuses it. No test here
starts a pod: every refusal happens before the platform check.

Fixtures are written from the rules as upstream has them (rehearse/names.py cites each file): Kubernetes 1.36
apimachinery pkg/util/validation/validation.go (IsDNS1123Subdomain 253, IsDNS1123Label and IsDNS1035Label 63),
pkg/apis/core/validation (Service: DNS-1035 label, Namespace: DNS-1123 label, ConfigMap: DNS-1123 subdomain),
pkg/apis/batch/validation ValidateJob (job-name label, Indexed pod hostnames), pkg/apis/rbac/validation
(ValidateRBACName: path segment only) and KubeRay v1.7.0 ray-operator/controllers/ray/utils/validation.go.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.spec.versions import KUBERAY_VERSION, KUBERNETES_VERSION
from rehearse import names
from rehearse.admission import InputError, admit
from rehearse.manifests import load
from tests.helpers import kubernetes_objects
from tests.rehearse.test_input import job, rehearse, write


def obj(kind: str, name: str, api_version: str = "v1", **meta: Any) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, **meta}}


def problems(*objects: dict[str, Any]) -> list[str]:
    return [str(p) for p in names.bad_names(list(objects), ["f.yaml"] * len(objects))]


def a_job(name: str, spec: str = "") -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(job(name=name, spec=spec))
    return loaded


def test_a_job_named_with_a_template_placeholder_is_refused_naming_the_rule_and_the_fix() -> None:
    [line] = problems(a_job("train-$ITEM"))
    assert line.startswith('f.yaml: Job/default/train-$ITEM: metadata.name: Invalid value: "train-$ITEM": ')
    assert "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters" in line
    assert "Job names are DNS-1123 subdomains" in line
    assert 'fix: rename it, e.g. "train-item"' in line
    assert "placeholder" in line


def test_a_job_name_is_at_most_63_characters_as_its_pods_job_name_label() -> None:
    assert problems(a_job("j" * 63)) == []
    [line] = problems(a_job("j" * 64))
    assert "must be no more than 63 characters" in line
    assert "job-name label" in line
    # The same 64 characters are a fine ConfigMap name (a DNS-1123 subdomain: 253).
    assert problems(obj("ConfigMap", "c" * 64)) == []


def test_an_indexed_job_leaves_room_for_its_pods_hostnames() -> None:
    # ValidateJob: "<name>-<completions-1>" must be a DNS-1123 label (no dots, 63 at most).
    assert problems(a_job("j" * 61, "completionMode: Indexed\ncompletions: 10")) == []
    [line] = problems(a_job("j" * 62, "completionMode: Indexed\ncompletions: 10"))
    assert f"will not able to create pod with invalid DNS label: {'j' * 62}-9" in line
    [dotted] = problems(a_job("a.b", "completionMode: Indexed\ncompletions: 2"))
    assert "a.b-1" in dotted


def test_a_service_name_is_a_dns_1035_label_while_a_configmap_may_hold_a_dot() -> None:
    [line] = problems(obj("Service", "api.v1"))
    assert "Service/default/api.v1: metadata.name" in line
    assert "a DNS-1035 label must consist of lower case alphanumeric characters" in line
    assert problems(obj("Service", "1api")) != []  # a DNS-1035 label starts with a letter
    assert problems(obj("ConfigMap", "api.v1")) == []


def test_a_namespace_name_is_a_dns_1123_label_and_so_is_every_object_namespace() -> None:
    [line] = problems(obj("Namespace", "team.a"))
    assert line.startswith("f.yaml: Namespace/team.a: metadata.name")  # cluster-scoped: no namespace shown
    assert "must not contain dots" in line
    [placeholder] = problems(obj("ConfigMap", "c", namespace="$NS"))
    assert "metadata.namespace" in placeholder
    assert "placeholder" in placeholder


def test_generate_name_is_validated_as_a_prefix() -> None:
    # The trailing dash of a prefix is masked (apimachinery maskTrailingDash): "train-" is fine, "Train_" is not.
    assert problems(a_job("train-x7k2q") | {"metadata": {"name": "train-x7k2q", "generateName": "train-"}}) == []
    bad = obj("ConfigMap", "c", generateName="Train_")
    [line] = problems(bad)
    assert 'metadata.generateName: Invalid value: "Train_"' in line


def test_a_name_with_a_slash_is_refused_for_every_kind_even_where_names_are_loose() -> None:
    assert problems(a_job("a/b")) != []
    # RBAC names are only path segments (pkg/apis/rbac/validation ValidateRBACName): colons are fine, "/" is not.
    rbac = "rbac.authorization.k8s.io/v1"
    assert problems(obj("ClusterRole", "system:aggregate-to-view", rbac)) == []
    [line] = problems(obj("ClusterRole", "team/admin", rbac))
    assert "may not contain '/'" in line
    [dots] = problems(obj("Role", "..", rbac))
    assert "may not be '..'" in dots
    # PodDisruptionBudget validates no name format (pkg/apis/policy/validation): only the path-segment rule.
    assert problems(obj("PodDisruptionBudget", "Keep_Up", "policy/v1")) == []
    assert problems(obj("PodDisruptionBudget", "50%", "policy/v1")) != []


def test_kuberay_names_are_dns_1035_labels_within_the_operators_limits() -> None:
    assert names.KUBERAY_CHECKED == KUBERAY_VERSION, "read KubeRay's utils/validation.go at the new tag, then update"
    assert names.KUBERNETES_CHECKED == KUBERNETES_VERSION, "read the API server's name rules at the new tag"
    assert problems(obj("RayJob", "r" * 47, "ray.io/v1")) == []
    [long] = problems(obj("RayJob", "r" * 48, "ray.io/v1"))
    assert "no more than 47 characters" in long
    assert "KubeRay v1.7.0" in long
    assert problems(obj("RayCluster", "c" * 53, "ray.io/v1")) == []
    assert problems(obj("RayCluster", "c" * 54, "ray.io/v1")) != []
    [dotted] = problems(obj("RayCluster", "ray.head", "ray.io/v1"))
    assert "DNS-1035 label" in dotted


def test_a_custom_resource_name_is_a_dns_1123_subdomain() -> None:
    assert problems(obj("LocalQueue", "team.a", "kueue.x-k8s.io/v1beta2", namespace="t")) == []
    assert problems(obj("Widget", "Widget_1", "example.com/v1")) != []


def test_admission_refuses_a_bad_name_with_every_other_problem_and_runs_nothing() -> None:
    with pytest.raises(InputError) as refused:
        admit([a_job("train-$ITEM")], ["f.yaml"])
    assert any("Job/default/train-$ITEM: metadata.name" in p for p in refused.value.problems)
    # A kind skipped with --skip-unsupported is still an object kubectl apply would refuse by its name.
    with pytest.raises(InputError):
        admit([a_job("ok"), obj("Widget", "Bad_Name", "example.com/v1")], ["f.yaml"] * 2, skip_unsupported=True)


def test_rehearse_exits_2_naming_the_object_the_rule_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, job(name="train-$ITEM"))
    code, out = rehearse(capsys, path)
    assert code == 2, out
    assert f"{path}: Job/default/train-$ITEM: metadata.name" in out
    assert "Job names are DNS-1123 subdomains" in out
    assert 'fix: rename it, e.g. "train-item"' in out
    assert "nothing was run" in out


def test_every_manifest_this_repo_emits_has_names_the_api_server_accepts(dist: Path) -> None:
    loaded = load([dist], recursive=True)
    assert len(loaded.objects) > 20
    assert [str(p) for p in names.bad_names(loaded.objects, loaded.sources)] == []


def test_every_object_cdk_applies_has_names_the_api_server_accepts(resources: dict[str, Any]) -> None:
    # The Platform stack's kubectl manifests (namespaces, RBAC, storage, admission policies), not only cdk8s's.
    found = [
        (o, f"{env} {logical_id}")
        for env, t in resources.items()
        for logical_id, objs in kubernetes_objects(t).items()
        for o in objs
    ]
    assert len(found) > 10
    assert [str(p) for p in names.bad_names([o for o, _ in found], [w for _, w in found])] == []
