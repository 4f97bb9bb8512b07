"""Strict input before anything runs (issue 27, findings 4, 5, 6): `trainctl rehearse` reads files as
`kubectl apply -f` does and refuses, with exit 2 naming the object, the field path and the fix, what
`kubectl apply --validate=strict` or the API server would refuse, and any kind or field the rehearsal
does not emulate. None of these tests starts a pod: every refusal happens before the platform check.

Fixtures are written here from the Kubernetes 1.36 documentation (concepts/workloads/controllers/job,
"Job API" reference: podFailurePolicy, restartPolicy, successPolicy) and the KubeRay v1.7.0 CRDs
(k8s/crds/kuberay-v1.7.0); the third-party kinds (PyTorchJob kubeflow.org/v1, JobSet jobset.x-k8s.io/v1alpha2,
batch/v1 CronJob, apps/v1 Deployment) only need a kind and a name to be refused.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from rehearse import load_manifests
from rehearse.manifests import NAME_ALPHABET, ManifestError, load, manifest_files
from rehearse.support import PENDING, fields_of, markdown_table, unsupported_fields
from trainctl.cli import main

ROOT = Path(__file__).resolve().parents[2]


def job(name: str = "pi", spec: str = "", pod: str = "restartPolicy: Never") -> str:
    """A batch/v1 Job after the docs' job.yaml shape (one container, a short command); `spec` and `pod` are
    YAML merged into the Job spec and its pod spec."""
    obj: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            **(yaml.safe_load(spec) or {}),
            "template": {
                "spec": {
                    **(yaml.safe_load(pod) or {}),
                    "containers": [{"name": "main", "image": "python:3.11", "command": ["python3", "-c", "print(1)"]}],
                }
            },
        },
    }
    return yaml.safe_dump(obj, sort_keys=False)


def write(tmp_path: Path, text: str, name: str = "manifests.yaml") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def rehearse(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str]:
    code = main(["rehearse", *map(str, argv)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


# Finding 4: a misspelled field ran as if there were no policy; kubectl refuses it.
def test_a_misspelled_field_is_refused_with_its_path_as_kubectl_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, job(spec="podFailurePolcy:\n  rules: []"))
    code, out = rehearse(capsys, path)
    assert code == 2, out
    assert 'unknown field "spec.podFailurePolcy"' in out
    assert "Job/pi" in out
    assert 'did you mean "podFailurePolicy"' in out
    assert "nothing was run" in out


def test_a_wrong_type_is_refused_with_its_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = rehearse(capsys, write(tmp_path, job(spec="backoffLimit: six")))
    assert code == 2, out
    assert "Job/pi: spec.backoffLimit:" in out
    assert "'six' is not of type 'integer'" in out


def test_a_job_template_without_restart_policy_is_refused_as_the_api_server_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = rehearse(capsys, write(tmp_path, job(pod="")))
    assert code == 2, out
    assert "spec.template.spec.restartPolicy: Required value" in out
    assert '"OnFailure", "Never"' in out


def test_api_server_rules_a_schema_cannot_express(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = job(spec="completionMode: Indexed\npodFailurePolicy:\n  rules: []", pod="restartPolicy: OnFailure")
    code, out = rehearse(capsys, write(tmp_path, text))
    assert code == 2, out
    assert "spec.completions: Required value: when completion mode is Indexed" in out
    assert 'only "Never" is supported when podFailurePolicy is specified' in out


def test_the_same_job_twice_is_refused_as_an_update_of_an_immutable_template(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = rehearse(capsys, write(tmp_path, job() + "---\n" + job()))
    assert code == 2, out
    assert "defined twice" in out
    assert "immutable" in out


def test_a_misspelled_rayjob_field_is_refused_against_the_kuberay_crd(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rayjob = """\
        apiVersion: ray.io/v1
        kind: RayJob
        metadata: {name: sample}
        spec:
          entrypoint: python -c "print(1)"
          shutdownAfterJobFinsihes: true
        """
    code, out = rehearse(capsys, write(tmp_path, textwrap.dedent(rayjob)))
    assert code == 2, out
    assert 'unknown field "spec.shutdownAfterJobFinsihes"' in out
    assert "KubeRay 1.7.0 CRD" in out


# Finding 5: kinds the rehearsal does not run were skipped with exit 0, or "nothing to rehearse" unnamed.
@pytest.mark.parametrize(
    ("api_version", "kind"),
    [
        ("kubeflow.org/v1", "PyTorchJob"),
        ("jobset.x-k8s.io/v1alpha2", "JobSet"),
        ("batch/v1", "CronJob"),
        ("apps/v1", "Deployment"),
        ("v1", "Pod"),
    ],
)
def test_a_kind_the_rehearsal_does_not_run_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], api_version: str, kind: str
) -> None:
    other = f"apiVersion: {api_version}\nkind: {kind}\nmetadata:\n  name: other\nspec: {{}}\n"
    code, out = rehearse(capsys, write(tmp_path, job() + "---\n" + other))
    assert code == 2, out
    assert f"{kind}/other: kind {kind} is not run by the rehearsal" in out
    assert "--skip-unsupported" in out


def test_a_file_of_only_unsupported_kinds_names_every_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = [
        f"apiVersion: {a}\nkind: {k}\nmetadata:\n  name: x{i}\n"
        for i, (a, k) in enumerate([("kubeflow.org/v1", "PyTorchJob"), ("batch/v1", "CronJob")])
    ]
    code, out = rehearse(capsys, write(tmp_path, "---\n".join(docs)))
    assert code == 2, out
    assert "kind PyTorchJob" in out
    assert "kind CronJob" in out


def test_skip_unsupported_with_nothing_left_to_run_exits_3_and_lists_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = "apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata:\n  name: ddp\n"
    code, out = rehearse(capsys, write(tmp_path, text), "--skip-unsupported")
    assert code == 3, out
    assert "SKIPPED PyTorchJob/ddp" in out


@pytest.mark.parametrize(
    ("spec", "pod", "field"),
    [
        ("suspend: true", "", "spec.suspend"),
        ("", "hostNetwork: true", "spec.template.spec.hostNetwork"),
        ("", "dnsPolicy: None\ndnsConfig: {nameservers: [1.1.1.1]}", "spec.template.spec.dnsPolicy"),
    ],
)
def test_a_workload_field_outside_the_support_table_is_refused_with_kind_and_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: str, pod: str, field: str
) -> None:
    code, out = rehearse(capsys, write(tmp_path, job(spec=spec, pod=f"restartPolicy: Never\n{pod}")))
    assert code == 2, out
    assert f"Job/pi: field {field}:" in out


def test_a_liveness_probe_is_refused_with_its_container_path(tmp_path: Path) -> None:
    obj = load_manifests([write(tmp_path, job())])[0]
    obj["spec"]["template"]["spec"]["containers"][0]["livenessProbe"] = {"exec": {"command": ["true"]}}
    assert [u.path for u in unsupported_fields(obj)] == ["spec.template.spec.containers[0].livenessProbe"]


def test_a_failindex_action_is_refused_until_the_controller_implements_it(tmp_path: Path) -> None:
    obj = load_manifests([write(tmp_path, job())])[0]
    obj["spec"]["podFailurePolicy"] = {
        "rules": [{"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [1]}}]
    }
    (found,) = unsupported_fields(obj)
    assert found.path == "spec.podFailurePolicy.rules[0].action"
    assert "'FailIndex' is not emulated" in found.reason


def test_the_support_table_names_a_source_for_every_entry() -> None:
    for kind in ("Job", "RayJob", "RayCluster"):
        for path, support in fields_of(kind).items():
            assert support.source, (kind, path)
            assert support.status != PENDING or "issue 27" in support.source


def test_docs_show_the_support_table_of_the_code() -> None:
    text = (ROOT / "docs" / "workloads.md").read_text()
    begin, end = "<!-- support-table: begin (rehearse/support.py) -->", "<!-- support-table: end -->"
    assert begin in text, "docs/workloads.md lacks the support table markers"
    assert end in text, "docs/workloads.md lacks the support table markers"
    shown = text.split(begin, 1)[1].split(end, 1)[0].strip()
    assert shown == markdown_table(), "docs/workloads.md's support table differs from rehearse/support.py"


# Finding 6: valid input kubectl accepts was refused or crashed.
def test_a_list_is_read_as_its_items(tmp_path: Path) -> None:
    items = textwrap.indent(job(name="a") + "---\n", "")
    listed = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            load_manifests([write(tmp_path, items, "a.yaml")])[0],
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}},
        ],
    }
    objects = load_manifests([write(tmp_path, yaml.safe_dump(listed), "list.yaml")])
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [("Job", "a"), ("ConfigMap", "c")]


def test_generate_name_is_named_as_the_api_server_names_it(tmp_path: Path) -> None:
    text = job().replace("  name: pi\n", "  generateName: pi-\n")
    loaded = load([write(tmp_path, text)])
    name = loaded.objects[0]["metadata"]["name"]
    assert name.startswith("pi-")
    assert len(name) == len("pi-") + 5
    assert set(name[3:]) <= set(NAME_ALPHABET)
    assert loaded.generated == [f"Job/{name} from generateName pi-"]


def test_a_directory_is_read_as_kubectl_reads_it(tmp_path: Path) -> None:
    write(tmp_path, job(name="b"), "d/b.yaml")
    write(tmp_path, job(name="a"), "d/a.yml")
    write(tmp_path, "not a manifest", "d/README.md")
    write(tmp_path, job(name="c"), "d/sub/c.json")
    assert [p.name for p in manifest_files([tmp_path / "d"])] == ["a.yml", "b.yaml"]
    names = [o["metadata"]["name"] for o in load_manifests([tmp_path / "d"], recursive=True)]
    assert names == ["a", "b", "c"]


def test_an_object_without_a_name_names_the_file_and_the_fix(tmp_path: Path) -> None:
    path = write(tmp_path, job().replace("  name: pi\n", "  labels: {a: b}\n"))
    with pytest.raises(ManifestError, match=r"Job has no metadata.name .*generateName"):
        load([path])
