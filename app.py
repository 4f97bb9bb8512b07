#!/usr/bin/env python3
"""CDK app: one Stage per environment. The only reader of context and environment variables.

    cdk synth                 every environment (cdk.out/assembly-<env>/)
    cdk synth -c env=prod     one environment
    cdk deploy -c env=dev --all

Account: `-c account=123456789012`, else CDK_DEFAULT_ACCOUNT, else account-agnostic.
Region: the environment's own (infra/spec/environments.py). Its AZ names are committed
there so synth needs no lookups; CDK_DEFAULT_REGION from a profile does not move it.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from typing import Any

import aws_cdk as cdk

from infra.spec import ENVIRONMENTS, ConfigError, Environment, get_environment
from infra.stage import PlatformStage


def selected_environments(app: cdk.App, environ: Mapping[str, str]) -> list[Environment]:
    """`-c env=NAME` picks one environment, none picks all; the account is applied to each."""
    name = app.node.try_get_context("env")
    chosen = [get_environment(str(name))] if name else list(ENVIRONMENTS.values())
    account = app.node.try_get_context("account") or environ.get("CDK_DEFAULT_ACCOUNT")
    return [dataclasses.replace(env, account=str(account)) if account else env for env in chosen]


def create_app(
    *, context: Mapping[str, Any] | None = None, environ: Mapping[str, str], outdir: str | None = None
) -> tuple[cdk.App, list[PlatformStage]]:
    app = cdk.App(context=dict(context) if context else None, outdir=outdir)
    stages = [PlatformStage(app, env.name, environment=env) for env in selected_environments(app, environ)]
    return app, stages


def main() -> None:
    try:
        app, _ = create_app(environ=os.environ)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    app.synth()


if __name__ == "__main__":
    main()
