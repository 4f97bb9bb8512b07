"""`trainctl fabric-check`: did NCCL use EFA, or silently fall back to TCP sockets?

    trainctl fabric-check LOG [LOG ...]        analyze worker logs written with NCCL_DEBUG=INFO
    kubectl logs -n ray -l ray.io/node-type=worker --prefix --tail=-1 --max-log-requests=64 | trainctl fabric-check
                                               read stdin (no LOG, or '-'): every Ray worker of the cluster
    trainctl fabric-check --json LOG ...       the report as JSON, for machines

One verdict per rank (host + pid, and the NCCL rank when a line says it): `efa` (aws-ofi-nccl
with the efa provider), `degraded` (the plugin on another provider: tcp, sockets, ...),
`socket` (NCCL's internal TCP transport), `unknown` (no network-selection lines: run with
NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=INIT,NET, as k8s/fabric_env.py sets). The analysis is
training.fabric_analyzer, which also runs inside training containers as
`python -m training.fabric_analyzer`; both print the same report and exit with the same codes.
"""

from __future__ import annotations

import argparse

from trainctl.exit_codes import ExitCode
from training import fabric_analyzer


def run(args: argparse.Namespace) -> int:
    # The analyzer's statuses (0 efa, 1 fallback, 2 could not run, 3 no evidence) are the
    # trainctl exit codes one for one.
    return int(ExitCode(int(fabric_analyzer.check(args.files, as_json=args.json))))


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "fabric-check",
        help="read NCCL_DEBUG=INFO logs and tell, per rank, whether NCCL used EFA or fell back to sockets",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=fabric_analyzer.EPILOG,
    )
    fabric_analyzer.add_arguments(parser)
    parser.set_defaults(run=run)
