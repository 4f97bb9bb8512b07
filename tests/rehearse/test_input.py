"""Strict input before anything runs (issue 27, findings 4, 5, 6): `trainctl rehearse` reads files as
`kubectl apply -f` does and refuses, with exit 2 naming the object, the field path and the fix, what
`kubectl apply --validate=strict` or the API server would refuse, and any kind or field the rehearsal
does not emulate. None of these tests starts a pod: every refusal happens before the platform check.

Fixtures are written here from the Kubernetes 1.36 documentation (concepts/workloads/controllers/job,
"Job API" reference: podFailurePolicy, restartPolicy, successPolicy) and the KubeRay v1.7.0 CRDs
(k8s/crds/kuberay-v1.7.0); the third-party kinds (PyTorchJob kubeflow.org/v1, JobSet jobset.x-k8s.io/v1alpha2,
batch/v1 CronJob, apps/v1 StatefulSet) only need a kind and a name to be refused. A Deployment (apps/v1, Kubernetes
1.36 docs concepts/workloads/controllers/deployment) runs; what of it the rehearsal does not emulate is refused per
field.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from rehearse import load_manifests
from rehearse.manifests import NAME_ALPHABET, ManifestError, load, manifest_files
from rehearse.support import (
    PENDING,
    SUPPORT_DOC,
    TABLE_BEGIN,
    TABLE_END,
    fields_of,
    markdown_table,
    unsupported_fields,
)
from rehearse.support import main as support_main
from trainctl.cli import main

ROOT = Path(__file__).resolve().parents[2]


def job(name: str = "pi", spec: str = "", pod: str = "restartPolicy: Never", command: list[str] | None = None) -> str:
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
                    "containers": [
                        {"name": "main", "image": "python:3.11", "command": command or ["python3", "-c", "print(1)"]}
                    ],
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
        ("apps/v1", "StatefulSet"),
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


def deployment(spec: str = "", pod: str = "") -> str:
    """An apps/v1 Deployment after the docs' nginx-deployment.yaml shape, with `spec` and `pod` merged in."""
    labels = {"app": "svc"}
    obj: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "svc"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            **(yaml.safe_load(spec) or {}),
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    **(yaml.safe_load(pod) or {}),
                    "containers": [{"name": "main", "image": "python:3.11", "command": ["python3", "-c", "1"]}],
                },
            },
        },
    }
    return yaml.safe_dump(obj, sort_keys=False)


@pytest.mark.parametrize(
    ("spec", "field", "why"),
    [
        ("strategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 1}}", "spec.strategy.type", "value 'Rolling"),
        ("strategy: {type: Recreate}\nminReadySeconds: 10", "spec.minReadySeconds", "not emulated"),
        ("progressDeadlineSeconds: 60", "spec.progressDeadlineSeconds", "not emulated"),
        ("paused: true", "spec.paused", "value True"),
    ],
)
def test_a_deployment_field_the_rehearsal_does_not_emulate_is_refused_with_its_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: str, field: str, why: str
) -> None:
    code, out = rehearse(capsys, write(tmp_path, job() + "---\n" + deployment(spec)))
    assert code == 2, out
    assert f"Deployment/svc: field {field}: {why}" in out


def test_a_deployment_whose_pods_would_not_restart_always_is_refused_as_the_api_server_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = rehearse(capsys, write(tmp_path, job() + "---\n" + deployment(pod="restartPolicy: Never")))
    assert code == 2, out
    assert 'spec.template.spec.restartPolicy: Unsupported value: "Never": supported values: "Always"' in out


def test_a_supported_deployment_passes_the_input_checks(tmp_path: Path) -> None:
    (obj,) = load_manifests([write(tmp_path, deployment("strategy: {type: Recreate}\nrevisionHistoryLimit: 2"))])
    assert unsupported_fields(obj) == []


def test_a_liveness_probe_is_refused_with_its_container_path(tmp_path: Path) -> None:
    obj = load_manifests([write(tmp_path, job())])[0]
    obj["spec"]["template"]["spec"]["containers"][0]["livenessProbe"] = {"exec": {"command": ["true"]}}
    assert [u.path for u in unsupported_fields(obj)] == ["spec.template.spec.containers[0].livenessProbe"]


def test_a_value_the_rehearsal_does_not_emulate_is_refused_naming_the_values_it_does(tmp_path: Path) -> None:
    obj = load_manifests([write(tmp_path, job(spec="suspend: true"))])[0]
    (found,) = unsupported_fields(obj)
    assert found.path == "spec.suspend"
    assert "value True is not emulated (the rehearsal honours False" in found.reason


def test_the_support_table_names_a_source_for_every_entry() -> None:
    for kind in ("Job", "RayJob", "RayCluster", "Deployment"):
        for path, support in fields_of(kind).items():
            assert support.source, (kind, path)
            assert support.status != PENDING or "issue 27" in support.source


def test_docs_show_the_support_table_of_the_code() -> None:
    guide = ROOT / SUPPORT_DOC
    text = guide.read_text()
    assert TABLE_BEGIN in text, f"{SUPPORT_DOC} lacks the support table markers"
    assert TABLE_END in text, f"{SUPPORT_DOC} lacks the support table markers"
    shown = text.split(TABLE_BEGIN, 1)[1].split(TABLE_END, 1)[0].strip()
    assert shown == markdown_table(), (
        f"{SUPPORT_DOC}'s support table differs from rehearse/support.py: run "
        f"`python -m rehearse.support --write {SUPPORT_DOC}`"
    )


def test_the_support_table_is_written_between_the_markers(tmp_path: Path) -> None:
    guide = tmp_path / "guide.md"
    guide.write_text(f"# Guide\n\n{TABLE_BEGIN}\nstale\n{TABLE_END}\n\nAfter.\n")
    support_main(["--write", str(guide)])
    assert guide.read_text() == f"# Guide\n\n{TABLE_BEGIN}\n{markdown_table()}\n{TABLE_END}\n\nAfter.\n"


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


# Finding 8: what only the image has ended as exit 1 BackoffLimitExceeded, the cause in pod-init.log.
def test_an_absolute_command_only_the_image_has_is_refused_naming_container_and_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = rehearse(capsys, write(tmp_path, job(command=["/submitter", "--wait"])))
    assert code == 2, out
    assert "container 'main'" in out
    assert "command /submitter does not exist on this machine" in out
    assert "--command-path /submitter=LOCAL_PATH" in out


def test_command_path_runs_a_local_program_in_place_of_the_image_one(tmp_path: Path) -> None:
    from rehearse.admission import admit

    loaded = load([write(tmp_path, job(command=["/submitter", "--wait"]))])
    admission = admit(loaded.objects, loaded.sources, command_paths={"/submitter": "/usr/bin/env"})
    container = admission.objects[0]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][0] == "/usr/bin/env"
    assert any("runs /usr/bin/env for /submitter" in n for n in admission.notes)


def test_a_container_without_a_command_is_refused_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    obj = yaml.safe_load(job())
    del obj["spec"]["template"]["spec"]["containers"][0]["command"]
    code, out = rehearse(capsys, write(tmp_path, yaml.safe_dump(obj)))
    assert code == 2, out
    assert "container 'main'" in out
    assert "has no command" in out


RAYJOB_PIP = """\
apiVersion: ray.io/v1
kind: RayJob
metadata: {name: pip-job}
spec:
  entrypoint: python -c "import requests"
  # KubeRay v1.7.0 passes runtimeEnvYAML to `ray job submit --runtime-env-json` (common/job.go).
  runtimeEnvYAML: |
    pip: ["requests==0.0.1", "torch"]
  rayClusterSpec:
    headGroupSpec:
      rayStartParams: {}
      template:
        spec:
          containers:
            - name: ray-head
              image: rayproject/ray:2.58.0
"""


def test_a_runtime_env_pin_this_environment_does_not_satisfy_is_refused_naming_the_package(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = rehearse(capsys, write(tmp_path, RAYJOB_PIP))
    assert code == 2, out
    assert "RayJob/pip-job: spec.runtimeEnvYAML pip 'requests==0.0.1' is not satisfied here" in out
    assert "pip install 'requests==0.0.1'" in out
    # torch is installed (any version satisfies it): not named.
    assert "pip 'torch'" not in out


# Finding 9: the README's rehearsal fetched Qwen/Qwen2.5-1.5B from the hub on 8 ranks.
def test_a_hub_model_is_refused_up_front_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = job(command=["python3", "-m", "train", "--model=Qwen/Qwen2.5-1.5B"])
    code, out = rehearse(capsys, write(tmp_path, text))
    assert code == 2, out
    assert "would download Qwen/Qwen2.5-1.5B" in out
    assert "--substitute Qwen/Qwen2.5-1.5B=LOCAL_DIR" in out


def test_a_url_outside_the_cluster_is_refused_and_cluster_addresses_are_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = job(command=["curl", "-O", "https://example.com/data.tar", "http://head-svc.ray.svc:8265"])
    code, out = rehearse(capsys, write(tmp_path, text))
    assert code == 2, out
    assert "https://example.com/data.tar would be downloaded" in out
    assert "head-svc" not in out


def test_scale_small_rewrites_the_projects_own_flags_and_says_so(dist: Path, tmp_path: Path) -> None:
    from rehearse.admission import admit

    loaded = load([dist / "dev" / "training-code.k8s.yaml", dist / "dev" / "nvrx-fsdp.k8s.yaml"])
    with pytest.raises(Exception, match=r"would download Qwen/Qwen2\.5-1\.5B"):
        admit(loaded.objects, loaded.sources)
    admission = admit(loaded.objects, loaded.sources, small_model=tmp_path / "tiny")
    (job_obj,) = [o for o in admission.objects if o["kind"] == "Job"]
    script = job_obj["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert "Qwen" not in script
    assert f"--model={tmp_path / 'tiny'}" in script
    assert "--steps=6" in script
    assert "--seq-len=32" in script
    # Paced to the rehearsal's tick, in the pre-check and ft_launcher's command both, among the script's arguments.
    assert script.count("-m training.nvrx_fsdp --min-step-s 1 ") == 2, script
    assert any("--scale small set --model" in n and n.endswith("--min-step-s 1") for n in admission.notes)


def test_scale_small_shrinks_the_fabric_jobs_sweep(dist: Path, tmp_path: Path) -> None:
    # Seen at full size in `trainctl rehearse --env dev --scale small dist/dev/*.yaml`: the 1 GiB gloo sweep on 8 CPU
    # ranks ran for minutes and a rank was SIGKILLed before the (correct) verdict that NCCL is not on EFA.
    from rehearse.admission import admit

    loaded = load([dist / "dev" / "training-code.k8s.yaml", dist / "dev" / "fabric-check.k8s.yaml"])
    admission = admit(loaded.objects, loaded.sources, small_model=tmp_path / "tiny")
    (job_obj,) = [o for o in admission.objects if o["kind"] == "Job"]
    script = " ".join(job_obj["spec"]["template"]["spec"]["containers"][0]["command"])
    assert "--max-bytes 16777216" in script
    assert "--iters 5" in script
    assert "--floor-gbps 2.5" in script  # the verdict's floor stays the chart's
    assert any("--scale small set --max-bytes 16777216, --iters 5" in n for n in admission.notes), admission.notes


def test_skip_unsupported_skips_a_workload_with_a_field_it_does_not_emulate(tmp_path: Path) -> None:
    from rehearse.admission import admit

    loaded = load([write(tmp_path, job(name="probed") + "---\n" + job(name="plain"))])
    probed = loaded.objects[0]["spec"]["template"]["spec"]["containers"][0]
    probed["livenessProbe"] = {"exec": {"command": ["true"]}}
    admission = admit(loaded.objects, loaded.sources, skip_unsupported=True)
    assert [o["metadata"]["name"] for o in admission.objects] == ["plain"]
    (skipped,) = admission.skipped
    assert str(skipped).startswith("SKIPPED Job/probed: spec.template.spec.containers[0].livenessProbe")


def test_image_python_names_an_image_of_the_lock_and_a_python_that_exists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from k8s.images import ImageLock
    from trainctl.commands.rehearse import image_pythons

    lock = ImageLock.load()
    venv_python = tmp_path / ".venv-nvrx-train/bin/python"
    # A virtualenv's python is a symlink to its base interpreter: kept as given, or the venv's packages are lost.
    assert image_pythons([f"nvrx-train={venv_python}", "example.invalid/x:1=py"], lock) == {
        lock.get("nvrx-train").reference: venv_python,
        "example.invalid/x:1": Path("py").absolute(),
    }
    path = write(tmp_path, job())
    code, out = rehearse(capsys, path, "--image-python", "nvrx-train")
    assert code == 2, out
    assert "--image-python 'nvrx-train': write it as IMAGE=PYTHON, IMAGE a name in k8s/images.lock.json" in out
    code, out = rehearse(capsys, path, "--image-python", f"nvrx-train={venv_python}")
    assert code == 2, out
    assert "is not an executable Python; build the image's environment first (make image-envs)" in out
    assert not list(tmp_path.glob("rehearsal-*"))
