"""Run a Ray job on a RayCluster through its head pod: the request (entrypoint, submission id, working
directory, runtime env), the upload over the exec API, `ray job submit` streamed back and the outcome
(trainctl/commands/submit.py is the command, its docstring says how).
"""

from __future__ import annotations

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

from trainctl.eks_auth import Target
from trainctl.exit_codes import ExitCode
from trainctl.kube import (
    UPLOAD_ROOT,
    Archive,
    ExecResult,
    KubeError,
    Pod,
    exec_in_pod,
    find_head_pod,
    human_size,
    remove_command,
    upload,
)
from trainctl.progress import Progress, TextSink
from trainctl.ray_jobs import FAILED, STOPPED, SUCCEEDED, get_job, submit_command


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
