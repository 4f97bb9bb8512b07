"""python -m capacity_hold --config FILE: the Capacity Block hold controller (capacity_hold/__init__.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from capacity_hold.config import ConfigError, HoldConfig
from capacity_hold.loop import Controller
from training.kube_api import KubeApi


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="capacity_hold", description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="the chart's controller config (JSON)")
    args = parser.parse_args(argv)
    try:
        config = HoldConfig.load(args.config)
    except (OSError, ValueError, ConfigError) as exc:
        print(f"capacity_hold: --config {args.config}: {exc}", file=sys.stderr)
        return 2
    api = KubeApi.in_cluster()
    if api is None:
        print("capacity_hold: no Kubernetes API: no service-account token in the pod", file=sys.stderr)
        return 2
    Controller(api, config).run(lambda: HoldConfig.load(args.config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
