"""Where training/emf.py writes its lines (issue 38): stdout, the copy the add-on's Fluent Bit ships from the workload
namespaces' container logs, and, in a process whose stdout is not the container's (a Ray worker's goes to Ray's log
files), also the container's own stdout. No socket: nothing listens for EMF on the nodes."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from training import emf


def _doc() -> dict[str, object]:
    identity = emf.JobIdentity(job_name="j", model="m", instance_type="p5.48xlarge", node_count=2)
    return emf.throughput(identity, step=1, step_time_s=0.5, tokens=100, world_size=16)


def test_each_document_is_one_line_on_stdout() -> None:
    out = io.StringIO()
    emf.Emitter(out=out, container_log=None).emit(_doc())
    (line,) = out.getvalue().splitlines()
    assert json.loads(line) == _doc() | {"_aws": json.loads(line)["_aws"]}
    assert emf.parse_lines(out.getvalue()) == [json.loads(line)]


def test_the_emitter_sends_nowhere_but_its_outputs() -> None:
    assert not hasattr(emf, "parse_endpoint")
    assert "AWS_EMF_AGENT_ENDPOINT" not in vars(emf).values()
    assert "socket" not in emf.__dict__


def test_a_process_outside_the_container_stdout_also_writes_the_containers_log(tmp_path: Path) -> None:
    container_stdout = tmp_path / "fd1"
    container_stdout.write_text("")
    out = io.StringIO()
    emitter = emf.Emitter(out=out, container_log=str(container_stdout))
    emitter.emit(_doc())
    emitter.emit(_doc())
    assert container_stdout.read_text().splitlines() == out.getvalue().splitlines()
    assert len(out.getvalue().splitlines()) == 2


def test_the_container_log_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(emf.CONTAINER_LOG_ENV, emf.CONTAINER_STDOUT)
    assert emf.Emitter().container_log == "/proc/1/fd/1"
    monkeypatch.delenv(emf.CONTAINER_LOG_ENV)
    assert emf.Emitter().container_log is None


def test_a_container_log_that_cannot_be_written_warns_once_and_training_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = io.StringIO()
    emitter = emf.Emitter(out=out, container_log=str(tmp_path / "missing" / "fd1"))
    emitter.emit(_doc())
    emitter.emit(_doc())
    assert len(out.getvalue().splitlines()) == 2
    assert capsys.readouterr().err.count("[emf]") == 1
