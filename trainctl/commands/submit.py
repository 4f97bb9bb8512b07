"""`trainctl submit`: run a Ray job on an environment's RayCluster, from your machine.

    trainctl submit --env dev -- python -m training.ray_finetune --num-workers 8 --use-gpu --steps 50
    trainctl submit --env dev --working-dir ./experiment --runtime-env env.yaml -- python train.py --lr 3e-4
    ID=$(trainctl submit --env dev --no-wait -- python train.py)     returns once the job is accepted

How: the Kubernetes API only. trainctl finds the RayCluster's head pod (labels ray.io/node-type=head,
ray.io/cluster=NAME; exactly one Running), copies --working-dir into it as a tar stream over the exec
API (to /tmp/trainctl/<submission id>, skipping .git, __pycache__ and .venv, as `kubectl cp` would),
and runs `ray job submit --address http://localhost:8265 ...` there, streaming the job's output
here as it comes. The Ray dashboard port never leaves the cluster: no port-forward, no Service.
Without --working-dir the job runs with the head's code (training/ is mounted at /opt/ml-platform).

--runtime-env FILE is a Ray runtime_env as YAML or JSON (pip, env_vars, ...); it must be a mapping
and must not set working_dir (that is --working-dir's job). Interrupting trainctl (Ctrl-C) does not
stop the job: follow it again with `trainctl logs --job ID --follow`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainctl import flags
from trainctl.eks_auth import ConnectError, Target, connect
from trainctl.exit_codes import ExitCode
from trainctl.kube import (
    DEFAULT_EXCLUDES,
    DEFAULT_UPLOAD_LIMIT_MIB,
    MIB,
    RAY_WORKING_DIR_LIMIT_MIB,
    Archive,
    KubeError,
    WorkingDirError,
    pack_working_dir,
)
from trainctl.progress import Progress
from trainctl.ray_jobs import SUBMISSION_ID
from trainctl.submit import SubmitError, SubmitRequest, load_runtime_env, new_submission_id, submit


def build_request(args: argparse.Namespace) -> SubmitRequest:
    entrypoint = tuple(args.entrypoint)
    if not entrypoint:
        raise SubmitError("no entrypoint: put the command after --, e.g. trainctl submit --env dev -- python train.py")
    submission_id: str | None = args.submission_id
    if submission_id is not None and not SUBMISSION_ID.match(submission_id):
        raise SubmitError(
            f"--submission-id {submission_id!r}: use letters, digits, '.', '_' and '-' (at most 100, "
            "starting with a letter or digit)"
        )
    return SubmitRequest(
        entrypoint=entrypoint,
        submission_id=submission_id or new_submission_id(),
        id_given=submission_id is not None,
        working_dir=args.working_dir,
        runtime_env=None if args.runtime_env is None else load_runtime_env(args.runtime_env),
        no_wait=args.no_wait,
    )


def _mib(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of MiB") from None
    if not 1 <= value <= RAY_WORKING_DIR_LIMIT_MIB:
        raise argparse.ArgumentTypeError(f"{text!r}: expected 1 to {RAY_WORKING_DIR_LIMIT_MIB} MiB (Ray's limit)")
    return value


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "submit",
        help="run a Ray job on the environment's RayCluster (through the head pod; streams its output)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes: 0 the job succeeded (--no-wait: it was accepted), 1 it failed or was stopped, "
        "2 could not run (no head pod, copy or submission failed, bad arguments, interrupted)",
    )
    flags.add_connection(parser)
    job = parser.add_argument_group("job")
    job.add_argument(
        "--working-dir",
        type=Path,
        metavar="DIR",
        help="local directory the job runs in, copied to the head pod (default: none, the head's code)",
    )
    job.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="NAME",
        help=f"file or directory name (glob) to leave out of --working-dir, repeatable; always: "
        f"{', '.join(DEFAULT_EXCLUDES)}",
    )
    job.add_argument(
        "--max-upload-mib",
        type=_mib,
        default=DEFAULT_UPLOAD_LIMIT_MIB,
        metavar="MIB",
        help="refuse a --working-dir with more file bytes than this (default: %(default)s)",
    )
    job.add_argument("--runtime-env", type=Path, metavar="FILE", help="Ray runtime_env (YAML or JSON mapping)")
    job.add_argument(
        "--submission-id", metavar="ID", help="the job's id (default: trainctl-<UTC time>-<random>); must be new"
    )
    job.add_argument(
        "--no-wait", action="store_true", help="return once Ray accepted the job; print only its id on stdout"
    )
    job.add_argument("entrypoint", nargs="*", metavar="ENTRYPOINT", help="the command to run, after --")
    flags.add_output(parser, json=False)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    progress = Progress.for_args(args)
    archive: Archive | None = None
    target: Target | None = None
    try:
        request = build_request(args)
        if request.working_dir is not None:
            with progress.step(f"packing {request.working_dir}"):
                archive = pack_working_dir(
                    request.working_dir,
                    excludes=(*DEFAULT_EXCLUDES, *args.exclude),
                    limit_bytes=args.max_upload_mib * MIB,
                )
        target = connect(flags.connection(args))
        return int(submit(target, request, archive, progress=progress))
    except (SubmitError, ConnectError, KubeError, WorkingDirError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return int(ExitCode.ERROR)
    except KeyboardInterrupt:
        sys.stderr.write("trainctl: interrupted\n")
        return int(ExitCode.ERROR)
    finally:
        if archive is not None:
            archive.close()
        if target is not None:
            target.api.close()
