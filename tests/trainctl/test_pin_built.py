"""`trainctl pin --built ENV`: the environment's built NVRx image pinned with the digest ECR reports for the
Dockerfile's tag (moto in server mode on loopback)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import boto3
import pytest

from infra.spec import ENVIRONMENTS
from infra.spec.images import context_tag
from k8s.images import LOCK_PATH, ImageLock
from tests.ecr_images import push_manifest
from tests.trainctl.fake_aws import MotoServer
from tests.trainctl.test_flags import KNOWN
from trainctl.cli import main
from trainctl.exit_codes import ExitCode
from trainctl.pin import Status, pin_built

ACCOUNT = "123456789012"
PROD = ENVIRONMENTS["prod"]
pytestmark = pytest.mark.usefixtures("fake_aws_credentials")


def _ecr(moto: MotoServer) -> object:
    return boto3.Session().client("ecr", region_name="us-east-2", endpoint_url=moto.url)


def moto_reset(ecr: object) -> None:
    # The moto server lives for the module; the repository may be left from the test before.
    with contextlib.suppress(Exception):
        ecr.delete_repository(repositoryName="ml-prod/nvrx-train", force=True)  # type: ignore[attr-defined]


def _push(ecr: object, tag: str) -> str:
    moto_reset(ecr)
    ecr.create_repository(repositoryName="ml-prod/nvrx-train")  # type: ignore[attr-defined]
    return push_manifest(ecr, "ml-prod/nvrx-train", tag)


def test_the_built_image_is_pinned_from_describe_images(moto: MotoServer, tmp_path: Path) -> None:
    lock_path = tmp_path / "images.lock.json"
    lock_path.write_bytes(LOCK_PATH.read_bytes())
    digest = _push(_ecr(moto), context_tag())
    report = pin_built(lock_path, PROD, ACCOUNT, _ecr(moto))
    assert report.exit_code is ExitCode.OK, report.render()
    (result,) = report.images
    assert (result.name, result.status, result.new_digest) == ("nvrx-train-prod", Status.PINNED, digest)
    entry = ImageLock.load(lock_path).get("nvrx-train-prod")
    assert entry.pinned == f"{ACCOUNT}.dkr.ecr.us-east-2.amazonaws.com/ml-prod/nvrx-train:{context_tag()}@{digest}"
    assert entry.runtime is not None
    # The built image's packages are the job's pins (k8s/nvrx_spec.py NvrxFsdpJob.pip), recorded with it.
    assert entry.runtime.packages["nvidia-resiliency-ext"] == "0.7.0"
    again = pin_built(lock_path, PROD, ACCOUNT, _ecr(moto))
    assert (again.images[0].status, again.written) == (Status.UNCHANGED, False)


def test_a_tag_not_pushed_yet_writes_nothing_and_says_how_to_build(moto: MotoServer, tmp_path: Path) -> None:
    lock_path = tmp_path / "images.lock.json"
    lock_path.write_bytes(LOCK_PATH.read_bytes())
    _push(_ecr(moto), "nvrx-000000000000")  # another Dockerfile's tag
    report = pin_built(lock_path, PROD, ACCOUNT, _ecr(moto))
    assert report.exit_code is ExitCode.ERROR
    assert "`cdk deploy 'prod/Images'`" in str(report.images[0].error)
    assert "scripts/build_nvrx_image.sh prod 123456789012" in str(report.images[0].error)
    assert lock_path.read_bytes() == LOCK_PATH.read_bytes()


def test_an_account_that_is_not_12_digits_is_refused(tmp_path: Path) -> None:
    report = pin_built(tmp_path / "none.json", PROD, "42", object())
    assert report.exit_code is ExitCode.ERROR
    assert report.errors == ["--built prod --account '42': expected a 12-digit account"]


def test_an_unknown_environment_is_refused_by_the_parser_as_every_env(capsys: pytest.CaptureFixture[str]) -> None:
    # Free text before, with a us-east-1 client for a name no environment has: the library refused it later.
    with pytest.raises(SystemExit) as exited:
        main(["pin", "--built", "staging", "--account", ACCOUNT])
    assert exited.value.code == ExitCode.ERROR
    assert f"trainctl pin: error: argument --built: {KNOWN}" in capsys.readouterr().err


def test_the_command_asks_ecr_in_the_environments_region(
    moto: MotoServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lock_path = tmp_path / "images.lock.json"
    lock_path.write_bytes(LOCK_PATH.read_bytes())
    digest = _push(_ecr(moto), context_tag())  # in us-east-2, prod's region; moto keeps repositories per region
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.url)
    assert main(["pin", "--built", "prod", "--account", ACCOUNT, "--lock", str(lock_path), "--json"]) == ExitCode.OK
    (image,) = json.loads(capsys.readouterr().out)["images"]
    assert (image["name"], image["new_digest"]) == ("nvrx-train-prod", digest)
