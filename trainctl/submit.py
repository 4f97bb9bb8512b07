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
import json
import re
import secrets
import shlex
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import yaml

from trainctl import flags
from trainctl.eks_auth import ConnectError, Target, add_connection_arguments, connect
from trainctl.exit_codes import ExitCode
from trainctl.kube import (
    DEFAULT_EXCLUDES,
    DEFAULT_UPLOAD_LIMIT_MIB,
    MIB,
    RAY_WORKING_DIR_LIMIT_MIB,
    UPLOAD_ROOT,
    Archive,
    ExecResult,
    KubeError,
    Pod,
    WorkingDirError,
    exec_in_pod,
    find_head_pod,
    human_size,
    pack_working_dir,
    remove_command,
    upload,
)
from trainctl.progress import Progress, TextSink
from trainctl.ray_jobs import FAILED, STOPPED, SUBMISSION_ID, SUCCEEDED, get_job, submit_command


class SubmitError(Exception):
    """The submission cannot go ahead: bad arguments, a bad runtime env file, a taken submission id."""


@dataclass(frozen=True)
class SubmitRequest:
    entrypoint: tuple[str, ...]
    submission_id: str
    id_given: bool
    working_dir: Path | None = None
    runtime_env: dict[str, Any] | None = None
    no_wait: bool = False


def new_submission_id() -> str:
    return f"trainctl-{datetime.now(tz=UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


_LOCAL_PATH = re.compile(r"^(?![a-z][a-z0-9+.-]*://)")


def load_runtime_env(path: Path) -> dict[str, Any]:
    """A Ray runtime_env from a YAML or JSON file, checked for what would fail late in the cluster."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise SubmitError(f"--runtime-env {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)  # JSON is YAML
    except yaml.YAMLError as exc:
        raise SubmitError(f"--runtime-env {path}: neither YAML nor JSON ({exc})") from None
    if not isinstance(data, dict):
        raise SubmitError(
            f"--runtime-env {path}: expected a mapping of runtime_env fields (pip, env_vars, ...), "
            f"found {type(data).__name__}"
        )
    if not all(isinstance(key, str) for key in data):
        raise SubmitError(f"--runtime-env {path}: every key must be a string")
    if "working_dir" in data:
        raise SubmitError(
            f"--runtime-env {path} sets working_dir: remove it and pass --working-dir DIR "
            "(trainctl copies the directory into the head pod; a path in the file would name the head's disk)"
        )
    modules = data.get("py_modules") or []
    local = [m for m in modules if isinstance(m, str) and _LOCAL_PATH.match(m)] if isinstance(modules, list) else []
    if local:
        raise SubmitError(
            f"--runtime-env {path}: py_modules {local} are local paths, which the head pod does not have; "
            "use URIs (s3://...) or put the modules in --working-dir"
        )
    env_vars = data.get("env_vars")
    if env_vars is not None and (
        not isinstance(env_vars, dict) or not all(isinstance(v, str) for v in env_vars.values())
    ):
        raise SubmitError(f'--runtime-env {path}: env_vars must map names to strings (quote numbers: "1")')
    try:
        json.dumps(data)
    except (TypeError, ValueError) as exc:
        raise SubmitError(f"--runtime-env {path}: not expressible as JSON ({exc}); quote dates and such") from None
    return data


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


def submit(
    target: Target,
    request: SubmitRequest,
    archive: Archive | None = None,
    *,
    progress: Progress | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> ExitCode:
    """Submit and, unless no_wait, stream the job's output and wait for its end; the exit code says how it ended."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    progress = progress or Progress(err)
    api, job_id = target.api, request.submission_id
    with progress.step(f"finding the Ray head pod ({target.where}, namespace {target.namespace})"):
        head = find_head_pod(api, target.namespace, target.ray_cluster, timeout=target.request_timeout)
    progress.say(f"head pod {head} on node {head.node or '-'}")
    if request.id_given:
        existing = get_job(api, head, job_id)
        if existing is not None:
            raise SubmitError(
                f"submission id {job_id} is taken on this Ray cluster (a job that is {existing.status}); "
                "choose another or leave --submission-id out"
            )
    dest = None if archive is None else f"{UPLOAD_ROOT}/{job_id}"
    stdout = TextSink(err if request.no_wait else out)  # --no-wait: stdout is the submission id only
    stderr = TextSink(err)
    try:
        if archive is not None and dest is not None:
            with progress.step(
                f"copying {request.working_dir} ({archive.files} files, {human_size(archive.size)} compressed) "
                f"to {head}:{dest}"
            ):
                upload(api, head, archive, dest)
        command = submit_command(
            job_id, request.entrypoint, working_dir=dest, runtime_env=request.runtime_env, no_wait=request.no_wait
        )
        progress.say(f"submitting job {job_id}: {shlex.join(request.entrypoint)}")
        try:
            result = exec_in_pod(
                api,
                head,
                command,
                on_stdout=stdout,
                on_stderr=stderr,
                capture=False,
                on_idle=None if request.no_wait else progress.idle(f"job {job_id}"),
            )
        except KeyboardInterrupt:
            progress.say(
                f"interrupted: if job {job_id} was submitted, it keeps running on the cluster "
                f"(`trainctl status {target.flags}`); follow it with "
                f"`trainctl logs {target.flags} --job {job_id} --follow`"
            )
            return ExitCode.ERROR
        finally:
            stdout.finish()
            stderr.finish()
    finally:
        if dest is not None:
            _remove_upload(target, head, dest, progress)
    return _outcome(target, request, head, result, stderr, progress, out)


def _remove_upload(target: Target, head: Pod, dest: str, progress: Progress) -> None:
    """Ray keeps its own copy of the working directory once the job is submitted; the upload goes."""
    try:
        removed = exec_in_pod(target.api, head, remove_command(dest))
    except KubeError as exc:
        progress.say(f"warning: could not remove {head}:{dest}: {exc}")
        return
    if not removed.ok:
        progress.say(f"warning: could not remove {head}:{dest}: {removed.why()}")


def _outcome(
    target: Target,
    request: SubmitRequest,
    head: Pod,
    result: ExecResult,
    stderr: TextSink,
    progress: Progress,
    out: TextIO | None,
) -> ExitCode:
    job_id = request.submission_id
    ran = "`ray job submit` " + (f"exited {result.exit_code}" if result.exit_code is not None else result.message)
    why = stderr.last_line() or result.message
    if request.no_wait:
        if not result.ok:
            raise SubmitError(f"job {job_id} was not submitted: {ran}" + (f" ({why})" if why else ""))
        (out if out is not None else sys.stdout).write(job_id + "\n")
        progress.say(f"job {job_id} submitted; follow it with `trainctl logs {target.flags} --job {job_id} --follow`")
        return ExitCode.OK
    job = get_job(target.api, head, job_id)
    if job is None:
        raise SubmitError(f"job {job_id} was not submitted: {ran}" + (f" ({why})" if why else ""))
    detail = f": {job.message}" if job.message else ""
    if job.status == SUCCEEDED:
        progress.say(f"job {job_id} {job.status}{detail}")
        return ExitCode.OK
    if job.status in (FAILED, STOPPED):
        progress.say(f"job {job_id} {job.status}{detail}")
        return ExitCode.CHECK_FAILED
    raise SubmitError(
        f"job {job_id} is {job.status} but the stream ended ({ran}); follow it with "
        f"`trainctl logs {target.flags} --job {job_id} --follow`"
    )


# --- command line -----------------------------------------------------------------------------


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
    add_connection_arguments(parser)
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
        target = connect(args)
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
