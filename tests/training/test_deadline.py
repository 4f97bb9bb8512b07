"""The Capacity Block deadline's arithmetic and environment (training/deadline.py), pure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training import deadline
from training.deadline import EXIT_REFUSED, EXIT_STOPPED, Deadline
from training.fabric_gate import EXIT_FAILED, POD_DIR_ENV, read_pod_verdict, stops_the_pod, write_stop_verdict

END = "2026-12-10T11:30:00+00:00"
END_S = 1796902200.0  # END in seconds since the epoch
ENV = {
    deadline.DEADLINE_ENV: END,
    deadline.MARGIN_ENV: "2400",
    deadline.STEP_SECONDS_ENV: "10",
}


def test_stop_point_is_the_end_less_the_margin() -> None:
    block = deadline.from_env(ENV)
    assert block == Deadline(END_S - 2400, 10.0)
    assert deadline.from_env({}) is None


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({**ENV, deadline.DEADLINE_ENV: "2026-12-10T11:30:00"}, "UTC offset"),
        ({**ENV, deadline.STEP_SECONDS_ENV: "0"}, "CAPACITY_STEP_SECONDS"),
        ({deadline.DEADLINE_ENV: END}, "CAPACITY_STOP_MARGIN_SECONDS"),
    ],
)
def test_bad_environment_is_named(env: dict[str, str], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        deadline.from_env(env)


def test_injection_is_honoured_only_in_a_cpu_rehearsal(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {**ENV, deadline.INJECT_ENV: "step:3"}
    monkeypatch.delenv("PLATFORM_REHEARSAL", raising=False)
    assert deadline.from_env(env) == Deadline(END_S - 2400, 10.0)
    monkeypatch.setenv("PLATFORM_REHEARSAL", "cpu")
    block = deadline.from_env(env)
    assert block is not None
    assert block.clock(2, now=lambda: 0.0) == 0.0
    assert block.clock(3, now=lambda: 0.0) == block.stop_at


def test_a_step_that_would_end_past_the_stop_point_is_not_started() -> None:
    block = Deadline(1000.0, 10.0)
    assert not block.must_stop(990.0)
    assert block.must_stop(990.5)


@pytest.mark.parametrize(
    ("now", "start", "refused"),
    [
        (900.0, 0, False),  # 100 s left: steps 1..10, the first checkpoint at 10
        (900.5, 0, True),  # 9 steps fit
        (970.0, 7, False),  # resumed at 7: the checkpoint at 10 needs 3 steps, 3 fit
        (970.0, 10, True),  # resumed at 10: the next one is at 20
        (990.0, 49, False),  # the last step (50) is saved too: one step fits
    ],
)
def test_refuses_a_start_that_cannot_reach_its_first_checkpoint(now: float, start: int, refused: bool) -> None:
    why = Deadline(1000.0, 10.0).refusal(now, start=start, every=10, last=50)
    assert (why is not None) == refused
    if why is not None:
        assert f"exit {EXIT_REFUSED}" in why


def test_the_deadline_verdict_stops_the_pod_and_the_first_one_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(POD_DIR_ENV, str(tmp_path))
    path = write_stop_verdict(EXIT_STOPPED, "stopped at 3")
    write_stop_verdict(EXIT_REFUSED, "refused at 3")  # the launcher's restarted workers, a moment later
    verdict = read_pod_verdict(path)
    assert verdict is not None
    assert (verdict["exit_code"], verdict["summary"]) == (EXIT_STOPPED, "stopped at 3")
    assert stops_the_pod(verdict)
    assert stops_the_pod({"exit_code": EXIT_REFUSED})
    path.write_text(json.dumps({"exit_code": EXIT_FAILED}))
    write_stop_verdict(EXIT_STOPPED, "after the gate")
    assert json.loads(path.read_text())["exit_code"] == EXIT_FAILED


def test_a_bad_deadline_variable_fails_the_argument_check(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from training.nvrx_config import parse_command

    monkeypatch.setenv(deadline.DEADLINE_ENV, "2026-12-10T11:30:00")
    with pytest.raises(SystemExit) as exited:
        parse_command(["--ckpt-dir", "/tmp/x", "--check-args"])
    assert exited.value.code == 2
    assert "CAPACITY_DEADLINE" in capsys.readouterr().err
