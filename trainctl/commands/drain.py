"""`trainctl drain --env E`: remove the workloads of an environment so that `cdk destroy` (or a zone move)
does not stop on finalizers.

    trainctl drain --env prod                     RayJobs, RayClusters and Jobs deleted, then waited for
    trainctl drain --env prod --release-claims    and the checkpoint claims deleted (before a zone move)

In every workload namespace (infra/spec/namespaces.py TRAINING_NAMESPACES), in this order: RayJobs (KubeRay
deletes their RayClusters), RayClusters, batch Jobs (propagationPolicy Background, so their pods go). Then
it waits until none of them is left, no Kueue Workload is left (Kueue removes its finalizer
kueue.x-k8s.io/resource-in-use once the job is gone; Kueue v0.19.2), and no pod mounts a claim (the claim's
kubernetes.io/pvc-protection finalizer holds it while a pod uses it). Why: the kubectl handler of
aws-cdk-lib 2.275.0 deletes CDK's manifests with `kubectl delete` (which waits) inside a Lambda with a
900 s timeout; a claim in use, a ClusterQueue with admitted workloads or a Workload whose controller is
already gone keeps its finalizer past it and fails the stack delete. Run it while Kueue and KubeRay still
run (before destroying Platform).

Exit 0: nothing is left that would hold a finalizer, safe to destroy. Exit 1: something is still there
when --timeout ends (each named, with its finalizers). Exit 2: could not connect.
"""

from __future__ import annotations

import argparse
import sys

from infra.spec.namespaces import RAY, TRAINING_NAMESPACES
from trainctl import flags
from trainctl.arguments import seconds
from trainctl.drain import drain
from trainctl.eks_auth import RAY_CLUSTER, ConnectError, connect
from trainctl.exit_codes import ExitCode
from trainctl.output import emit
from trainctl.progress import Progress


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "drain",
        help="delete the workloads (RayJobs, RayClusters, Jobs) and wait until nothing holds a finalizer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes: 0 safe to destroy, 1 something is still there, 2 could not run",
    )
    flags.add_connection(parser)
    parser.add_argument(
        "--release-claims",
        action="store_true",
        help="also delete the checkpoint claims once no pod uses them (the Storage deploy creates them again)",
    )
    parser.add_argument(
        "--timeout", type=seconds(3600), default=600.0, metavar="S", help="wait this long (default: %(default)g)"
    )
    parser.add_argument(
        "--poll-interval", type=seconds(60), default=5.0, metavar="S", help="between surveys (default: %(default)g)"
    )
    flags.add_output(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.namespace != RAY.name or args.ray_cluster != RAY_CLUSTER:
        print(
            "error: drain covers every workload namespace "
            f"({', '.join(ns.name for ns in TRAINING_NAMESPACES)}): --namespace and --ray-cluster do not apply",
            file=sys.stderr,
        )
        return ExitCode.ERROR
    try:
        target = connect(flags.connection(args))
    except ConnectError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    namespaces = tuple(ns.name for ns in TRAINING_NAMESPACES)
    report = drain(
        target.api,
        namespaces,
        where=target.where,
        release_claims=args.release_claims,
        timeout_s=args.timeout,
        poll_s=args.poll_interval,
        request_timeout=target.request_timeout,
        say=Progress.for_args(args).say,
    )
    return emit(report, as_json=args.json)
