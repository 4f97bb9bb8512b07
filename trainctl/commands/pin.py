"""`trainctl pin`: pin every image of the lock (k8s/images.lock.json) by digest.

    trainctl pin                  resolve every tag (pinned ones too) and write all digests, or nothing
    trainctl pin --check          resolve and compare; exit 1 if a digest is missing or stale, write nothing
    trainctl pin --set NAME=REF@sha256:<64 hex> ...
                                  pin by hand (air-gapped sites): no network; REF must be the lock's reference
    trainctl pin --built ENV --account ACCOUNT
                                  pin the NVRx image built for ENV (nvrx-train-ENV): its digest from
                                  ecr:DescribeImages of <cluster>/nvrx-train at the Dockerfile's tag

The lock is written atomically (ImageLock.write) and only when every image resolved: one
failure (unreachable registry, unknown tag, refused token) leaves the file byte-for-byte as
it was. It is also left alone if someone else changed it while the tags were resolved.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from infra.spec import get_environment
from k8s.images import LOCK_PATH
from trainctl import flags
from trainctl.arguments import seconds
from trainctl.ecr import boto3_ecr_clients
from trainctl.output import emit
from trainctl.pin import SET_FORMAT, check, pin, pin_built, registry_credentials, set_digests
from trainctl.registry import DEFAULT_TIMEOUT, RegistryClient


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "pin",
        help="pin the images of the lock by digest (resolve, --check, or --set by hand)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes: 0 done / check passed, 1 check failed (missing or stale digest), "
        "2 could not run (registry or network error, bad arguments, bad lock); "
        "the lock is written only on 0, never by --check",
    )
    parser.add_argument("--lock", type=Path, default=LOCK_PATH, help="the lock file (default: %(default)s)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="resolve and compare only; exit 1 if missing or stale")
    mode.add_argument(
        "--missing-only",
        action="store_true",
        help="resolve only entries without a digest, never re-pin a pinned one (what `make synth` runs)",
    )
    mode.add_argument(
        "--set",
        action="append",
        metavar=SET_FORMAT,
        dest="assignments",
        help="pin NAME by hand, without network (repeatable); REF must equal the lock's reference for NAME",
    )
    flags.add_env(
        mode,
        flag="--built",
        required=False,
        help="the environment whose built NVRx image (nvrx-train-ENV) to pin from ecr:DescribeImages, in its "
        "region (needs --account)",
    )
    parser.add_argument("--account", help="the AWS account of the environment's ECR repository (with --built)")
    flags.add_output(parser, quiet=False)
    parser.add_argument(
        "--timeout",
        type=seconds(120),
        default=DEFAULT_TIMEOUT,
        help="seconds per registry request (default: %(default)g)",
    )
    parser.add_argument(
        "--allow-insecure-loopback",
        action="store_true",
        help="use plain http for registries on 127.0.0.0/8, localhost or [::1] (local test registries only)",
    )
    flags.add_profile(
        parser,
        help="AWS profile for private ECR registries in the lock (ecr:GetAuthorizationToken; default: the usual chain)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    lock_path: Path = args.lock
    if args.built:
        env = get_environment(args.built)  # flags.add_env checked the name
        report = pin_built(lock_path, env, args.account or "", boto3_ecr_clients(profile=args.profile)(env.region))
    elif args.assignments:
        report = set_digests(lock_path, args.assignments)
    else:
        client = RegistryClient(
            timeout=args.timeout,
            allow_insecure_loopback=args.allow_insecure_loopback,
            credentials=registry_credentials(lock_path, boto3_ecr_clients(profile=args.profile)),
        )
        missing_only: bool = args.missing_only
        report = check(lock_path, client) if args.check else pin(lock_path, client, missing_only=missing_only)
    return emit(report, as_json=args.json)
