"""cdk8s app: one chart set per environment, written to dist/<env>/.

Run through `cdk8s synth` (cdk8s.yaml), which sets CDK8S_OUTDIR.
"""

from __future__ import annotations

import os
from pathlib import Path

import cdk8s

from infra.spec import ENVIRONMENTS, Environment
from infra.spec.namespaces import TRAINING_NAMESPACES
from k8s.charts.namespaces import NamespacesChart


def build(app: cdk8s.App, environment: Environment) -> None:
    """Every chart of one environment, added to `app`."""
    NamespacesChart(app, "namespaces", environment=environment.name, namespaces=TRAINING_NAMESPACES)


def synth_all(outdir: Path) -> list[Path]:
    written = []
    for environment in ENVIRONMENTS.values():
        app = cdk8s.App(outdir=str(outdir / environment.name))
        build(app, environment)
        app.synth()
        written.append(outdir / environment.name)
    return written


def main() -> None:
    synth_all(Path(os.environ.get("CDK8S_OUTDIR", "dist")))


if __name__ == "__main__":
    main()
