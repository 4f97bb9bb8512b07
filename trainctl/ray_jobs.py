"""Ray's job API, used from inside the head pod: the `ray job` command lines trainctl runs there,
and a small Python query (ray.job_submission.JobSubmissionClient) that prints JSON, so states
are read from data, not from the CLI's human output. Port 8265 is only ever reached as
localhost from the head pod itself.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from k8s.ray_spec import DRIVER_NUM_CPUS
from trainctl.kube import KubeError, Pod, exec_in_pod

DASHBOARD = "http://localhost:8265"
JSON_MARKER = "TRAINCTL-JSON "
SUCCEEDED, FAILED, STOPPED = "SUCCEEDED", "FAILED", "STOPPED"
TERMINAL = frozenset({SUCCEEDED, FAILED, STOPPED})
SUBMISSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
"""Ray accepts more; trainctl also uses the id as a directory name in the pod."""

# Runs in the head pod (its Python has Ray): `python -c QUERY_SCRIPT ADDRESS list|get ID`.
QUERY_SCRIPT = (
    """\
import json, sys
from ray.job_submission import JobSubmissionClient
FIELDS = ("submission_id", "job_id", "type", "status", "entrypoint", "message", "error_type",
          "start_time", "end_time", "driver_exit_code")
def plain(job):
    out = {}
    for name in FIELDS:
        value = getattr(job, name, None)
        value = getattr(value, "value", value)
        out[name] = value if value is None or isinstance(value, (str, int, float, bool)) else str(value)
    return out
client = JobSubmissionClient(sys.argv[1])
if sys.argv[2] == "list":
    result = {"jobs": [plain(job) for job in client.list_jobs()]}
else:
    try:
        result = {"job": plain(client.get_job_info(sys.argv[3]))}
    except RuntimeError as exc:
        if "status code 404" not in str(exc):
            raise
        result = {"job": None}
print("""
    + repr(JSON_MARKER)
    + """ + json.dumps(result), flush=True)
"""
)


class RayQueryError(KubeError):
    """The job query in the head pod failed or printed no result."""


@dataclass(frozen=True)
class RayJob:
    submission_id: str | None
    job_id: str | None
    type: str | None
    status: str
    entrypoint: str
    message: str | None
    error_type: str | None
    start_time: int | None
    """Milliseconds since the epoch (Ray's unit)."""
    end_time: int | None
    driver_exit_code: int | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RayJob:
        def text(key: str) -> str | None:
            value = data.get(key)
            return None if value is None else str(value)

        def number(key: str) -> int | None:
            value = data.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        return cls(
            submission_id=text("submission_id"),
            job_id=text("job_id"),
            type=text("type"),
            status=text("status") or "UNKNOWN",
            entrypoint=text("entrypoint") or "",
            message=text("message"),
            error_type=text("error_type"),
            start_time=number("start_time"),
            end_time=number("end_time"),
            driver_exit_code=number("driver_exit_code"),
        )

    @property
    def name(self) -> str:
        return self.submission_id or self.job_id or "-"

    def to_json(self) -> dict[str, Any]:
        return {
            "submission_id": self.submission_id,
            "job_id": self.job_id,
            "type": self.type,
            "status": self.status,
            "entrypoint": self.entrypoint,
            "message": self.message,
            "error_type": self.error_type,
            "start_time": iso_time(self.start_time),
            "end_time": iso_time(self.end_time),
            "driver_exit_code": self.driver_exit_code,
        }


def iso_time(millis: int | None) -> str | None:
    if millis is None:
        return None
    return datetime.fromtimestamp(millis / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- command lines run in the head pod --------------------------------------------------------


def runtime_env_json(runtime_env: dict[str, Any]) -> str:
    return json.dumps(runtime_env, sort_keys=True, separators=(",", ":"))


def submit_command(
    submission_id: str,
    entrypoint: Sequence[str],
    *,
    working_dir: str | None = None,
    runtime_env: dict[str, Any] | None = None,
    no_wait: bool = False,
) -> list[str]:
    # The driver on a worker, which mounts the checkpoint claim, not on the head (k8s/ray_spec.py head_group).
    argv = ["ray", "job", "submit", "--address", DASHBOARD, "--submission-id", submission_id]
    argv += ["--entrypoint-num-cpus", str(DRIVER_NUM_CPUS)]
    if working_dir is not None:
        argv += ["--working-dir", working_dir]
    if runtime_env is not None:
        argv += ["--runtime-env-json", runtime_env_json(runtime_env)]
    if no_wait:
        argv.append("--no-wait")
    return [*argv, "--", *entrypoint]


def logs_command(submission_id: str, *, follow: bool = False) -> list[str]:
    return ["ray", "job", "logs", submission_id, "--address", DASHBOARD, *(["--follow"] if follow else [])]


def query_command(*arguments: str) -> list[str]:
    return ["python", "-c", QUERY_SCRIPT, DASHBOARD, *arguments]


def parse_query_output(stdout: bytes) -> dict[str, Any]:
    """The JSON the query printed (the last marked line; Ray may print warnings around it)."""
    for line in reversed(stdout.decode(errors="replace").splitlines()):
        if line.startswith(JSON_MARKER):
            try:
                document = json.loads(line.removeprefix(JSON_MARKER))
            except ValueError:
                break
            if isinstance(document, dict):
                return document
            break
    raise RayQueryError("the job query in the head pod printed no result")


def _query(api: Any, pod: Pod, *arguments: str) -> dict[str, Any]:
    result = exec_in_pod(api, pod, query_command(*arguments))
    if not result.ok:
        raise RayQueryError(f"querying Ray jobs in {pod} failed: {result.why()}")
    return parse_query_output(result.stdout)


def list_jobs(api: Any, pod: Pod) -> list[RayJob]:
    """Every job the Ray cluster knows (`ray job list`), oldest first."""
    jobs = _query(api, pod, "list").get("jobs")
    if not isinstance(jobs, list):
        raise RayQueryError("the job query in the head pod returned no job list")
    parsed = [RayJob.from_json(job) for job in jobs if isinstance(job, dict)]
    return sorted(parsed, key=lambda job: (job.start_time is None, job.start_time or 0, job.name))


def get_job(api: Any, pod: Pod, submission_id: str) -> RayJob | None:
    """The job with this submission id, or None if Ray does not know it."""
    job = _query(api, pod, "get", submission_id).get("job")
    return RayJob.from_json(job) if isinstance(job, dict) else None
