"""app.py: environment selection, account resolution, and bad input through the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app import create_app
from infra.spec import ENVIRONMENTS, ConfigError
from tests.conftest import ROOT, cdk_json_context

# The pinned CLI from package-lock.json (make install puts it there).
CDK = ROOT / "node_modules" / ".bin" / "cdk"


def cli_env() -> dict[str, str]:
    """The environment `make` gives the CLI: the virtualenv's Node first, no network calls."""
    return {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "CDK_DISABLE_VERSION_CHECK": "true",
        "CDK_DISABLE_CLI_TELEMETRY": "true",
    }


def test_no_env_flag_builds_every_environment() -> None:
    _, stages = create_app(context=cdk_json_context(), environ={})
    assert sorted(s.environment.name for s in stages) == sorted(ENVIRONMENTS)


def test_env_flag_selects_one() -> None:
    _, stages = create_app(context={**cdk_json_context(), "env": "prod"}, environ={})
    assert [s.environment.name for s in stages] == ["prod"]
    assert stages[0].platform.region == "us-east-2"


def test_unknown_env_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"env='qa'.*allowed: dev, prod"):
        create_app(context={**cdk_json_context(), "env": "qa"}, environ={})


def test_account_from_context_beats_environment_variable() -> None:
    _, stages = create_app(
        context={**cdk_json_context(), "env": "dev", "account": "111111111111"},
        environ={"CDK_DEFAULT_ACCOUNT": "222222222222"},
    )
    assert stages[0].account == "111111111111"


def test_account_from_cdk_default_account() -> None:
    _, stages = create_app(
        context={**cdk_json_context(), "env": "dev"}, environ={"CDK_DEFAULT_ACCOUNT": "222222222222"}
    )
    assert stages[0].account == "222222222222"


def test_no_account_keeps_the_stack_account_agnostic() -> None:
    _, stages = create_app(context={**cdk_json_context(), "env": "dev"}, environ={})
    assert stages[0].platform.account.startswith("${Token")


def test_bad_account_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"account='abc'"):
        create_app(context={**cdk_json_context(), "env": "dev", "account": "abc"}, environ={})


@pytest.mark.slow
def test_cdk_cli_reports_an_unknown_environment_and_writes_nothing(tmp_path: Path) -> None:
    """Through the real `cdk` CLI: a clear message, non-zero exit, no assembly written."""
    env = cli_env()
    env.pop("CDK_DEFAULT_ACCOUNT", None)
    out = tmp_path / "cdk.out"
    result = subprocess.run(
        [str(CDK), "synth", "--quiet", "-c", "env=staging", "-o", str(out), "--app", f"{sys.executable} app.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert "env='staging' is invalid; allowed: dev, prod" in result.stderr
    assert not list(out.glob("assembly-*"))


@pytest.mark.slow
def test_cdk_cli_synthesizes_one_environment(tmp_path: Path) -> None:
    env = cli_env()
    out = tmp_path / "cdk.out"
    result = subprocess.run(
        [str(CDK), "synth", "--quiet", "-c", "env=dev", "-o", str(out), "--app", f"{sys.executable} app.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert [name for name in manifest["artifacts"] if name.startswith("assembly-")] == ["assembly-dev"]
    assert list((out / "assembly-dev").glob("*.template.json"))
