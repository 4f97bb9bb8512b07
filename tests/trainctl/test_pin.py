"""`trainctl pin` against a real registry on 127.0.0.1: resolve and write, --check, --set, JSON, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from k8s.images import ImageLock
from tests.conftest import ROOT
from tests.trainctl.conftest import TIMEOUT, write_lock
from tests.trainctl.fake_registry import FakeRegistry, make_image, sha256
from trainctl.cli import main
from trainctl.exit_codes import ExitCode
from trainctl.pin import Status, pin
from trainctl.registry import HttpRequest, HttpResponse, RegistryClient, http_transport

OTHER = sha256(b"an image built elsewhere")


def run_pin(capsys: pytest.CaptureFixture[str], lock: Path, *args: str) -> tuple[int, str, str]:
    code = main(["pin", "--lock", str(lock), "--timeout", str(TIMEOUT), "--allow-insecure-loopback", *args])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], lock: Path, *args: str) -> tuple[int, dict[str, Any]]:
    code, out, err = run_pin(capsys, lock, "--json", *args)
    document: dict[str, Any] = json.loads(out)
    assert document["exit_code"] == code
    # stderr as without --json (trainctl.output.emit): an error line per error of the document
    named = [*document["errors"], *(f"{i['name']}: {i['error']['message']}" for i in document["images"] if i["error"])]
    assert err.splitlines() == [f"error: {message}" for message in named]
    return code, document


def by_name(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {image["name"]: image for image in document["images"]}


# --- default: resolve everything, write all or nothing -------------------------------------


def test_pin_writes_every_digest_index_for_multi_arch_manifest_otherwise(
    registry: FakeRegistry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ray = registry.push("dlc/ray", "train-v1", make_image("ray"))
    nccl = registry.push("hpc/nccl-tests", "2.23", make_image("nccl", multi_arch=False))
    lock = write_lock(
        tmp_path / "images.lock.json",
        {
            "ray-train": (registry.ref("dlc/ray", "train-v1"), None),
            "nccl-tests": (registry.ref("hpc/nccl-tests", "2.23"), None),
        },
    )
    code, out, err = run_pin(capsys, lock)
    assert (code, err) == (ExitCode.OK, "")
    written = ImageLock.load(lock)
    assert written.get("ray-train").digest == ray.index_digest
    assert written.get("nccl-tests").digest == nccl.manifest_digest
    assert written.get("ray-train").purpose == "test ray-train"  # everything but the digest is kept
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "STATUS", "REFERENCE", "OLD", "DIGEST", "NEW", "DIGEST", "MANIFEST"]
    assert lines[1].split()[:2] == ["nccl-tests", "pinned"]
    assert lines[1].split()[-1] == "manifest"
    assert lines[2].split()[:2] == ["ray-train", "pinned"]
    assert lines[2].split()[-2:] == [ray.index_digest[:19], "index"]
    assert lines[-1] == f"wrote {lock}: 2 pinned, 0 updated, 0 unchanged"


def test_pin_again_is_unchanged_and_a_moved_tag_is_updated(
    registry: FakeRegistry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = registry.push("ray", "v1", make_image("ray"))
    registry.push("nccl", "2.23", make_image("nccl"))
    lock = write_lock(
        tmp_path / "lock.json",
        {"ray-train": (registry.ref("ray", "v1"), None), "nccl": (registry.ref("nccl", "2.23"), None)},
    )
    assert run_json(capsys, lock)[0] == ExitCode.OK
    before = lock.read_bytes()
    code, document = run_json(capsys, lock)
    assert code == ExitCode.OK
    assert {i["status"] for i in document["images"]} == {"unchanged"}
    assert document["written"] is False
    assert lock.read_bytes() == before

    moved = registry.push("ray", "v1", make_image("ray, rebuilt"))
    code, document = run_json(capsys, lock)
    assert code == ExitCode.OK
    ray = by_name(document)["ray-train"]
    assert (ray["status"], ray["old_digest"], ray["new_digest"]) == ("updated", first.digest, moved.digest)
    assert by_name(document)["nccl"]["status"] == "unchanged"
    assert document["written"] is True
    assert ImageLock.load(lock).get("ray-train").digest == moved.digest


def test_missing_only_fills_gaps_and_never_moves_a_pin(
    registry: FakeRegistry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What `make synth` runs: a pinned digest stays, even when its tag has moved since."""
    registry.push("ray", "v1", make_image("ray, rebuilt after the pin"))
    nccl = registry.push("nccl", "2.23", make_image("nccl"))
    lock = write_lock(
        tmp_path / "lock.json",
        {"ray-train": (registry.ref("ray", "v1"), OTHER), "nccl": (registry.ref("nccl", "2.23"), None)},
    )
    code, document = run_json(capsys, lock, "--missing-only")
    assert code == ExitCode.OK
    assert by_name(document)["ray-train"]["status"] == "unchanged"
    assert by_name(document)["nccl"]["status"] == "pinned"
    written = ImageLock.load(lock)
    assert written.get("ray-train").digest == OTHER
    assert written.get("nccl").digest == nccl.digest


def test_any_failure_writes_nothing_and_reports_each_image(
    registry: FakeRegistry, dead_host: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    registry.push("ray", "v1", make_image("ray rebuilt"))
    lock = write_lock(
        tmp_path / "lock.json",
        {
            "ray-train": (registry.ref("ray", "v1"), OTHER),  # would be updated, but must not be
            "gone": (registry.ref("ray", "no-such-tag"), None),
            "offline": (f"{dead_host}/hpc/nccl-tests:2.23", None),
        },
    )
    before = lock.read_bytes()
    code, out, err = run_pin(capsys, lock)
    assert code == ExitCode.ERROR
    assert lock.read_bytes() == before
    assert out.splitlines()[-1] == f"nothing written: 2 of 3 image(s) could not be resolved; {lock} is unchanged"
    errors = err.splitlines()
    assert errors[0].startswith(f"error: gone: {registry.ref('ray', 'no-such-tag')}: HEAD ")
    assert "answered 404" in errors[0]
    assert errors[1].startswith(f"error: offline: {dead_host}/hpc/nccl-tests:2.23: HEAD http://{dead_host}/")
    assert len(errors) == 2

    code, document = run_json(capsys, lock)
    assert code == ExitCode.ERROR
    images = by_name(document)
    assert images["ray-train"]["status"] == "updated"
    assert (images["gone"]["status"], images["gone"]["error"]["kind"]) == ("error", "not_found")
    assert (images["offline"]["status"], images["offline"]["error"]["kind"]) == ("error", "network")
    assert document["written"] is False
    assert lock.read_bytes() == before


def test_refused_token_is_an_unauthorized_error_and_nothing_is_written(
    registry: FakeRegistry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    registry.auth = "bearer"
    registry.token_policy = "refuse"
    registry.push("ray", "v1", make_image("ray"))
    lock = write_lock(tmp_path / "lock.json", {"ray-train": (registry.ref("ray", "v1"), None)})
    before = lock.read_bytes()
    code, document = run_json(capsys, lock)
    assert code == ExitCode.ERROR
    (image,) = document["images"]
    assert image["error"]["kind"] == "unauthorized"
    assert "refused a pull token for repository:ray:pull" in image["error"]["message"]
    assert lock.read_bytes() == before


def test_bearer_protected_registry_is_pinned(
    registry: FakeRegistry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    registry.auth = "bearer"
    image = registry.push("ray", "v1", make_image("ray"))
    lock = write_lock(tmp_path / "lock.json", {"ray-train": (registry.ref("ray", "v1"), None)})
    assert run_json(capsys, lock)[0] == ExitCode.OK
    assert ImageLock.load(lock).get("ray-train").digest == image.digest


def test_a_lock_changed_while_resolving_is_not_overwritten(registry: FakeRegistry, tmp_path: Path) -> None:
    registry.push("ray", "v1", make_image("ray"))
    lock = write_lock(tmp_path / "lock.json", {"ray-train": (registry.ref("ray", "v1"), None)})
    edited = write_lock(tmp_path / "edited.json", {"ray-train": (registry.ref("ray", "v1"), OTHER)}).read_bytes()

    def transport_with_a_concurrent_edit(request: HttpRequest) -> HttpResponse:
        lock.write_bytes(edited)  # another operator pins by hand meanwhile
        return http_transport(request)

    client = RegistryClient(timeout=TIMEOUT, allow_insecure_loopback=True, transport=transport_with_a_concurrent_edit)
    report = pin(lock, client)
    assert report.exit_code is ExitCode.ERROR
    assert report.written is False
    assert "changed while trainctl pin ran; nothing written" in report.errors[0]
    assert lock.read_bytes() == edited


# --- --check ------------------------------------------------------------------------------------


def test_check_passes_when_every_digest_is_current(
    registry: FakeRegistry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = registry.push("ray", "v1", make_image("ray"))
    lock = write_lock(tmp_path / "lock.json", {"ray-train": (registry.ref("ray", "v1"), image.digest)})
    code, out, err = run_pin(capsys, lock, "--check")
    assert (code, err) == (ExitCode.OK, "")
    assert out.splitlines()[1].split()[:2] == ["ray-train", "ok"]
    assert out.splitlines()[-1] == f"check passed: all 1 image(s) in {lock} are pinned and current"


def test_check_fails_on_a_stale_digest_naming_the_image(
    registry: FakeRegistry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = registry.push("ray", "v1", make_image("ray"))
    registry.push("nccl", "2.23", make_image("nccl"))
    lock = write_lock(
        tmp_path / "lock.json",
        {"ray-train": (registry.ref("ray", "v1"), old.digest), "nccl": (registry.ref("nccl", "2.23"), None)},
    )
    assert run_pin(capsys, lock)[0] == ExitCode.OK  # nccl pinned too: only the stale entry is left to find
    before = lock.read_bytes()
    new = registry.push("ray", "v1", make_image("ray, the tag moved"))
    code, out, err = run_pin(capsys, lock, "--check")
    assert code == ExitCode.CHECK_FAILED
    assert err == ""
    assert f"check failed: ray-train stale ({registry.ref('ray', 'v1')} now resolves to {new.digest})" in out
    assert lock.read_bytes() == before

    code, document = run_json(capsys, lock, "--check")
    assert code == ExitCode.CHECK_FAILED
    ray = by_name(document)["ray-train"]
    assert (ray["status"], ray["old_digest"], ray["new_digest"]) == ("stale", old.digest, new.digest)
    assert by_name(document)["nccl"]["status"] == "ok"
    assert document["written"] is False


def test_check_fails_on_a_missing_digest(
    registry: FakeRegistry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = registry.push("ray", "v1", make_image("ray"))
    lock = write_lock(tmp_path / "lock.json", {"ray-train": (registry.ref("ray", "v1"), None)})
    before = lock.read_bytes()
    code, out, _ = run_pin(capsys, lock, "--check")
    assert code == ExitCode.CHECK_FAILED
    assert "check failed: ray-train missing (no digest)" in out
    code, document = run_json(capsys, lock, "--check")
    (ray,) = document["images"]
    assert (ray["status"], ray["old_digest"], ray["new_digest"]) == ("missing", None, image.digest)
    assert lock.read_bytes() == before


def test_check_cannot_run_when_a_pinned_image_cannot_be_resolved(
    dead_host: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = write_lock(
        tmp_path / "lock.json", {"ray-train": (f"{dead_host}/ray:v1", OTHER), "new": (f"{dead_host}/new:v1", None)}
    )
    code, document = run_json(capsys, lock, "--check")
    assert code == ExitCode.ERROR
    images = by_name(document)
    assert (images["ray-train"]["status"], images["ray-train"]["error"]["kind"]) == ("error", "network")
    # An unpinned entry is missing whatever the network says; the failure to resolve it is still shown.
    assert (images["new"]["status"], images["new"]["error"]["kind"]) == ("missing", "network")


# --- --set --------------------------------------------------------------------------------------


def test_set_pins_by_hand_without_network(dead_host: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ref = f"{dead_host}/ray:v1"  # nothing listens there: --set must not try
    lock = write_lock(tmp_path / "lock.json", {"ray-train": (ref, None), "nccl": (f"{dead_host}/nccl:2.23", OTHER)})
    digest = sha256(b"the manifest an air-gapped site mirrored")
    code, out, err = run_pin(capsys, lock, "--set", f"ray-train={ref}@{digest}")
    assert (code, err) == (ExitCode.OK, "")
    assert ImageLock.load(lock).get("ray-train").digest == digest
    assert ImageLock.load(lock).get("nccl").digest == OTHER
    assert out.splitlines()[-1] == f"wrote {lock}: 1 pinned, 0 updated, 0 unchanged"

    code, document = run_json(
        capsys, lock, "--set", f"ray-train={ref}@{digest}", "--set", f"nccl={dead_host}/nccl:2.23@{digest}"
    )
    assert code == ExitCode.OK
    assert [(i["name"], i["status"]) for i in document["images"]] == [("ray-train", "unchanged"), ("nccl", "updated")]
    assert ImageLock.load(lock).get("nccl").digest == digest


@pytest.mark.parametrize(
    ("assignment", "expected"),
    [
        ("pytorch=REF@DIGEST", "image 'pytorch' is not in"),
        ("ray-train={other}@{digest}", "REF '{other}' does not match images.ray-train.reference='{ref}'"),
        (
            "ray-train={ref}@sha256:abc",
            "digest 'sha256:abc' is malformed; expected sha256: followed by 64 lower-case hex",
        ),
        ("ray-train={ref}@{upper}", "is malformed"),
        ("ray-train={ref}@md5:" + "a" * 64, "is malformed"),
        ("ray-train={ref}", "no '@' before the digest; expected ray-train={ref}@sha256:<64 hex>"),
        ("ray-train", "expected NAME=REF@sha256:<64 hex>"),
        ("={ref}@{digest}", "expected NAME=REF@sha256:<64 hex>"),
    ],
)
def test_set_refuses_bad_input_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], assignment: str, expected: str
) -> None:
    ref, other = "registry.example.com/ray:v1", "registry.example.com/ray:v2"
    digest = sha256(b"x")
    lock = write_lock(tmp_path / "lock.json", {"ray-train": (ref, None)})
    before = lock.read_bytes()
    fields = {"ref": ref, "other": other, "digest": digest, "upper": digest.upper().replace("SHA256", "sha256")}
    code, out, err = run_pin(capsys, lock, "--set", assignment.format(**fields))
    assert code == ExitCode.ERROR
    assert expected.format(**fields) in err
    assert out.splitlines()[-1] == f"nothing written: see the errors; {lock} is unchanged"
    assert lock.read_bytes() == before


def test_set_reference_mismatch_names_field_value_and_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ref, digest = "registry.example.com/ray:v1", sha256(b"x")
    lock = write_lock(tmp_path / "lock.json", {"ray-train": (ref, None)})
    code, document = run_json(capsys, lock, "--set", f"ray-train=registry.example.com/ray:latest@{digest}")
    assert code == ExitCode.ERROR
    (error,) = document["errors"]
    assert "images.ray-train.reference='registry.example.com/ray:v1'" in error
    assert "'registry.example.com/ray:latest'" in error
    assert f"use --set ray-train={ref}@<digest>" in error
    assert document["images"] == []


def test_set_conflicting_digests_for_one_image(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ref = "registry.example.com/ray:v1"
    lock = write_lock(tmp_path / "lock.json", {"ray-train": (ref, None)})
    before = lock.read_bytes()
    a, b = sha256(b"a"), sha256(b"b")
    code, _, err = run_pin(capsys, lock, "--set", f"ray-train={ref}@{a}", "--set", f"ray-train={ref}@{b}")
    assert code == ExitCode.ERROR
    assert "given twice with different digests" in err
    assert lock.read_bytes() == before


def test_set_and_check_are_exclusive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lock = write_lock(tmp_path / "lock.json", {"ray-train": ("registry.example.com/ray:v1", None)})
    with pytest.raises(SystemExit) as exit_:
        main(["pin", "--lock", str(lock), "--check", "--set", "x=y"])
    assert exit_.value.code == ExitCode.ERROR
    assert "not allowed with argument" in capsys.readouterr().err


# --- the lock file and the output ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "cannot read the lock"),
        ("{not json", "not valid JSON"),
        ('{"version": 2, "images": {}}', "version=2; expected 1"),
        ('{"version": 1, "images": {"x": "y"}}', "expected {'version': 1"),
        ('{"version": 1, "images": {"x": {"reference": "nohost:v1"}}}', "is not a tag reference"),
    ],
)
def test_a_bad_lock_cannot_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, expected: str
) -> None:
    lock = tmp_path / "lock.json"
    if content is not None:
        lock.write_text(content)
    for args in ([], ["--check"], ["--set", "x=y"]):
        code, document = run_json(capsys, lock, *args)
        assert code == ExitCode.ERROR
        assert document["images"] == []
        assert expected in document["errors"][0]
    if content is None:
        assert not lock.exists()
    else:
        assert lock.read_text() == content


def test_json_output_shape(registry: FakeRegistry, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    image = registry.push("ray", "v1", make_image("ray"))
    lock = write_lock(tmp_path / "lock.json", {"ray-train": (registry.ref("ray", "v1"), None)})
    code, document = run_json(capsys, lock)
    assert code == ExitCode.OK
    assert document == {
        "command": "pin",
        "mode": "resolve",
        "lock": str(lock),
        "exit_code": 0,
        "written": True,
        "images": [
            {
                "name": "ray-train",
                "reference": registry.ref("ray", "v1"),
                "status": "pinned",
                "old_digest": None,
                "new_digest": image.index_digest,
                "media_type": "application/vnd.oci.image.index.v1+json",
                "error": None,
            }
        ],
        "errors": [],
    }
    assert {s.value for s in Status} == {"pinned", "unchanged", "updated", "ok", "missing", "stale", "error"}


# --- as a real process --------------------------------------------------------------------------


def _trainctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainctl", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.timeout(120)
def test_cli_as_a_subprocess(registry: FakeRegistry, dead_host: str, tmp_path: Path) -> None:
    registry.auth = "bearer"
    image = registry.push("dlc/ray", "train-v1", make_image("ray"))
    lock = write_lock(tmp_path / "lock.json", {"ray-train": (registry.ref("dlc/ray", "train-v1"), None)})
    done = _trainctl("pin", "--lock", str(lock), "--json", "--allow-insecure-loopback", "--timeout", str(TIMEOUT))
    assert done.returncode == ExitCode.OK, done.stderr
    assert json.loads(done.stdout)["images"][0]["new_digest"] == image.index_digest
    assert ImageLock.load(lock).get("ray-train").digest == image.index_digest

    done = _trainctl("pin", "--lock", str(lock), "--check", "--allow-insecure-loopback")
    assert done.returncode == ExitCode.OK, done.stderr
    assert "check passed" in done.stdout

    offline = write_lock(tmp_path / "offline.json", {"ray-train": (f"{dead_host}/ray:v1", None)})
    before = offline.read_bytes()
    done = _trainctl("pin", "--lock", str(offline), "--allow-insecure-loopback")
    assert done.returncode == ExitCode.ERROR
    assert f"error: ray-train: {dead_host}/ray:v1: HEAD http://{dead_host}/v2/ray/manifests/v1 failed" in done.stderr
    assert offline.read_bytes() == before


@pytest.mark.timeout(120)
def test_cli_help_and_usage_errors_as_a_subprocess() -> None:
    top = _trainctl("--help")
    assert top.returncode == 0
    assert "pin" in top.stdout
    sub = _trainctl("pin", "--help")
    assert sub.returncode == 0
    for flag in ("--lock", "--check", "--set", "--json", "--timeout", "--allow-insecure-loopback"):
        assert flag in sub.stdout
    assert "exit codes: 0" in sub.stdout
    assert _trainctl().returncode == ExitCode.ERROR
    assert _trainctl("pin", "--timeout", "0").returncode == ExitCode.ERROR
