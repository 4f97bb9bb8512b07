"""The commands trainctl runs in a Ray head pod, answered as Ray and the pod's shell would, over
FakeKube's exec endpoint.

- the upload (`sh -c UPLOAD_SCRIPT trainctl-upload DEST SIZE`): reads exactly SIZE bytes of
  stdin, as `head -c` does, and unpacks them as `tar -xz` would (kept in `uploads[DEST]`);
- `rm -rf -- DEST`;
- `ray job submit --address ... --submission-id ID --entrypoint-num-cpus N [--working-dir D] [--runtime-env-json J]
  [--no-wait] -- ENTRYPOINT`: Ray's CLI, with its exit codes (1 when the job failed, 0 when it
  succeeded or was stopped, 1 when it could not be submitted);
- `ray job logs ID --address ... [--follow]`;
- `python -c QUERY_SCRIPT ADDRESS list|get ID`: the JSON line of the query, after some noise.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.trainctl.fake_kube import ExecSession, Failure, FakeKube
from trainctl.kube import UPLOAD_SCRIPT
from trainctl.ray_jobs import DASHBOARD, JSON_MARKER, QUERY_SCRIPT

HEAD_LABELS = {"ray.io/node-type": "head", "ray.io/cluster": "training", "ray.io/is-ray-node": "yes"}
WORKER_LABELS = {"ray.io/node-type": "worker", "ray.io/cluster": "training", "ray.io/group": "g6"}


@dataclass
class Job:
    submission_id: str
    status: str
    entrypoint: str
    logs: list[str] = field(default_factory=list)
    message: str | None = None
    runtime_env: dict[str, Any] | None = None
    start_time: int = 1_767_225_600_000
    end_time: int | None = None

    def details(self) -> dict[str, Any]:
        """JobDetails as the query script prints them."""
        return {
            "submission_id": self.submission_id,
            "job_id": "02000000",
            "type": "SUBMISSION",
            "status": self.status,
            "entrypoint": self.entrypoint,
            "message": self.message,
            "error_type": None,
            "start_time": self.start_time,
            "end_time": self.end_time,
            "driver_exit_code": None,
        }


@dataclass
class Submission:
    argv: list[str]
    options: dict[str, str | bool]
    entrypoint: list[str]


class FakeRayHead:
    """Scripts `kube` to answer as the head pod `pod` of RayCluster `training` does."""

    def __init__(
        self,
        kube: FakeKube,
        *,
        outcome: str = "SUCCEEDED",
        output: Sequence[str] = ("step 1/2 loss=2.31\n", "step 2/2 loss=1.87\n"),
        submit_fails: str | None = None,
    ) -> None:
        self.kube = kube
        self.outcome = outcome
        self.output = list(output)
        self.submit_fails = submit_fails
        """Ray cannot submit (an error message on stderr, exit 1), e.g. the dashboard is down."""
        self.between_lines: Callable[[int], None] | None = None
        """Called after each output line of a waited-for job (the streaming test holds the stream here)."""
        self.jobs: dict[str, Job] = {}
        self.uploads: dict[str, dict[str, bytes]] = {}
        self.upload_sizes: dict[str, int] = {}
        self.removed: list[str] = []
        self.submissions: list[Submission] = []
        kube.on_exec(["sh", "-c", UPLOAD_SCRIPT, "trainctl-upload"], self._upload)
        kube.on_exec(["rm", "-rf", "--"], self._remove)
        kube.on_exec(["ray", "job", "submit"], self._submit)
        kube.on_exec(["ray", "job", "logs"], self._logs)
        kube.on_exec(["python", "-c", QUERY_SCRIPT, DASHBOARD], self._query)

    # --- the commands ---

    def _upload(self, session: ExecSession) -> int:
        dest, size = session.command[4], int(session.command[5])
        data = session.read_stdin(size)
        self.upload_sizes[dest] = len(data)
        files: dict[str, bytes] = {}
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for member in tar.getmembers():
                extracted = tar.extractfile(member) if member.isfile() else None
                files[member.name + ("/" if member.isdir() else "")] = extracted.read() if extracted else b""
        self.uploads[dest] = files
        return 0

    def _remove(self, session: ExecSession) -> int:
        self.removed.extend(session.command[3:])
        return 0

    def _submit(self, session: ExecSession) -> int:
        argv = session.command
        split = argv.index("--")
        options: dict[str, str | bool] = {}
        rest = argv[3:split]
        while rest:
            name = rest.pop(0)
            if name == "--no-wait":
                options[name] = True
            else:
                options[name] = rest.pop(0)
        entrypoint = argv[split + 1 :]
        self.submissions.append(Submission(argv, options, entrypoint))
        if options.get("--address") != DASHBOARD:
            session.stderr(f"ConnectionError: Failed to connect to Ray at address: {options.get('--address')}.\n")
            return 1
        if self.submit_fails:
            session.stderr(self.submit_fails + "\n")
            return 1
        submission_id = str(options["--submission-id"])
        if submission_id in self.jobs:
            session.stderr(f"RuntimeError: Job with submission_id {submission_id} already exists.\n")
            return 1
        working_dir = options.get("--working-dir")
        if isinstance(working_dir, str) and working_dir not in self.uploads:
            session.stderr(f"ValueError: working_dir {working_dir} is not a valid path\n")
            return 1
        runtime_env = options.get("--runtime-env-json")
        job = Job(
            submission_id,
            "PENDING",
            " ".join(entrypoint),
            runtime_env=json.loads(runtime_env) if isinstance(runtime_env, str) else None,
        )
        self.jobs[submission_id] = job
        session.stdout(f"Job '{submission_id}' submitted successfully\n")
        if options.get("--no-wait"):
            return 0
        session.stdout("Tailing logs until the job exits (disable with --no-wait):\n")
        job.status = "RUNNING"
        for index, line in enumerate(self.output):
            session.stdout(line)
            job.logs.append(line)
            if self.between_lines is not None:
                self.between_lines(index)
        job.status = self.outcome
        job.end_time = job.start_time + 60_000
        if self.outcome == "FAILED":
            job.message = "Job entrypoint command failed with exit code 1"
            session.stdout(f"Job '{submission_id}' failed\n")
            return 1
        session.stdout(f"Job '{submission_id}' {self.outcome.lower()}\n")
        return 0

    def _logs(self, session: ExecSession) -> int:
        argv = session.command
        submission_id = argv[3]
        if argv[4:6] != ["--address", DASHBOARD]:
            return 2
        job = self.jobs.get(submission_id)
        if job is None:
            session.stderr(f"RuntimeError: Request failed with status code 404: Job {submission_id} does not exist.\n")
            return 1
        for line in job.logs:
            session.stdout(line)
        return 0

    def _query(self, session: ExecSession) -> int | Failure:
        arguments = session.command[4:]
        session.stderr("2026-01-01 00:00:00,000\tINFO worker.py:1 -- Using address localhost:8265\n")
        session.stdout("some import-time noise on stdout\n")
        if arguments == ["list"]:
            result: dict[str, Any] = {"jobs": [job.details() for job in self.jobs.values()]}
        elif len(arguments) == 2 and arguments[0] == "get":
            job = self.jobs.get(arguments[1])
            result = {"job": None if job is None else job.details()}
        else:
            return Failure(f"unexpected query {arguments}")
        session.stdout(JSON_MARKER + json.dumps(result) + "\n")
        return 0

    # --- state ---

    def add_job(self, submission_id: str, status: str, entrypoint: str = "python train.py", **kwargs: Any) -> Job:
        job = Job(submission_id, status, entrypoint, **kwargs)
        self.jobs[submission_id] = job
        return job
