"""`trainctl status`: the Ray jobs of an environment and their state.

    trainctl status --env dev            two tables: jobs of the RayCluster, RayJob objects
    trainctl status --env dev --json     the same as one JSON document

Below them, each GPU group's Kueue quota beside the nodes that can run its pods, with a warning and
the `trainctl scale` command that closes the gap when they differ (trainctl/queue_status.py).

Ray jobs are read in the head pod (ray.job_submission.JobSubmissionClient on localhost:8265,
through the exec API: nothing is port-forwarded); RayJob objects (KubeRay's ray.io/v1 rayjobs,
each with its own Ray cluster, named in RAY CLUSTER) from the Kubernetes API. Either part is
shown even when the other cannot be read.
"""

from __future__ import annotations

import argparse
import sys

from trainctl import flags
from trainctl.eks_auth import ConnectError, connect
from trainctl.exit_codes import ExitCode
from trainctl.output import emit
from trainctl.progress import Progress
from trainctl.status import collect


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "status",
        help="Ray jobs of the environment's RayCluster and the RayJob objects, with their state",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes: 0 listed, 2 could not list (part of) it: no head pod, API errors; "
        "a failed job is listed, not an error",
    )
    flags.add_connection(parser)
    flags.add_output(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        target = connect(flags.connection(args))
    except ConnectError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return int(ExitCode.ERROR)
    try:
        report = collect(target, Progress.for_args(args))
    finally:
        target.api.close()
    return emit(report, as_json=args.json)
