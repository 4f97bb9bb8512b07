"""python -m fabric_controller --config FILE: the remediation controller (fabric_controller/__init__.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fabric_controller.config import ConfigError, ControllerConfig
from fabric_controller.loop import Controller
from training.kube_api import KubeApi


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fabric_controller", description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="the chart's controller config (JSON)")
    args = parser.parse_args(argv)
    try:
        config = ControllerConfig.load(args.config)
    except (OSError, ValueError, ConfigError) as exc:
        print(f"fabric_controller: --config {args.config}: {exc}", file=sys.stderr)
        return 2
    api = KubeApi.in_cluster()
    if api is None:
        print("fabric_controller: no Kubernetes API: no service-account token in the pod", file=sys.stderr)
        return 2
    Controller(api, config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
