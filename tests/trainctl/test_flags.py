"""The command shell: every --env behaves the same (trainctl/flags.py), progress follows one rule
(trainctl/progress.py) and `emit` prints every report the same way (trainctl/output.py)."""

from __future__ import annotations

import argparse
import io
import json
from typing import Any

import pytest

from infra.spec import ENVIRONMENTS
from trainctl.arguments import environment_name
from trainctl.cli import build_parser
from trainctl.exit_codes import ExitCode
from trainctl.output import emit
from trainctl.progress import Progress

KNOWN = f"unknown environment 'staging'; known: {', '.join(ENVIRONMENTS)} (declared in infra/spec/environments.py)"


def subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def with_env() -> list[str]:
    return sorted(
        name for name, parser in subparsers().items() if any("--env" in a.option_strings for a in parser._actions)
    )


def test_the_commands_with_env_are_the_ones_that_name_an_environment() -> None:
    # Free text in capacity, preflight and plan before the shell: a typo went on into the library.
    assert with_env() == ["capacity", "drain", "goodput", "logs", "plan", "preflight", "rehearse", "scale", "status", "submit"]


@pytest.mark.parametrize("command", with_env())
def test_every_env_refuses_an_unknown_name_the_same_way(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([command, "--env", "staging"])
    assert exited.value.code == ExitCode.ERROR
    assert f"trainctl {command}: error: argument --env: {KNOWN}" in capsys.readouterr().err


@pytest.mark.parametrize("command", sorted(subparsers()))
def test_every_flag_that_names_an_environment_takes_the_env_type(command: str) -> None:
    for action in subparsers()[command]._actions:
        if action.metavar == "ENV":
            assert (action.type, action.choices) == (environment_name, sorted(ENVIRONMENTS)), (command, action.dest)


CONNECTION = ("kubeconfig", "context", "cluster", "profile", "endpoint_url", "request_timeout")


def connecting() -> list[str]:
    return sorted(name for name, parser in subparsers().items() if any(a.dest == "kubeconfig" for a in parser._actions))


def test_the_connection_flags_are_one_group_in_every_command_that_connects_to_eks() -> None:
    # Declared twice before, in commands/scale.py and eks_auth: the helps, timeouts and --endpoint-url differed.
    assert connecting() == ["drain", "logs", "scale", "status", "submit"]
    seen: dict[str, tuple[object, ...]] = {}
    for command in connecting():
        actions = {a.dest: a for a in subparsers()[command]._actions}
        groups = {a.dest: g.title for g in subparsers()[command]._action_groups for a in g._group_actions}
        for dest in CONNECTION:
            action = actions[dest]
            described = (groups[dest], action.option_strings, action.type, action.default, action.metavar, action.help)
            assert seen.setdefault(dest, described) == described, (command, dest)


@pytest.mark.parametrize("command", sorted(subparsers()))
def test_json_and_quiet_mean_the_same_where_they_exist(command: str) -> None:
    actions = {a.dest: a for a in subparsers()[command]._actions}
    for dest in ("json", "quiet"):
        if dest in actions:
            assert isinstance(actions[dest], argparse._StoreTrueAction), (command, dest)
    if "profile" in actions:
        assert actions["profile"].metavar == "NAME", command
    if "endpoint_url" in actions:
        assert (actions["endpoint_url"].metavar, actions["endpoint_url"].default) == ("[SERVICE=]URL", [])


def test_progress_lines_go_to_stderr_unless_quiet() -> None:
    stream = io.StringIO()
    Progress(stream).say("checking quota ...")
    Progress(stream, quiet=True).say("not shown")
    quiet = build_parser().parse_args(["scale", "--env", "dev", "--group", "g6", "--nodes", "0", "--quiet"])
    Progress.for_args(quiet, stream).say("not shown either")
    loud = build_parser().parse_args(["scale", "--env", "dev", "--group", "g6", "--nodes", "0"])
    Progress.for_args(loud, stream).say("shown")
    assert stream.getvalue() == "trainctl: checking quota ...\ntrainctl: shown\n"


class Sample:
    exit_code = ExitCode.CHECK_FAILED

    def to_json(self) -> dict[str, Any]:
        return {"command": "sample", "exit_code": int(self.exit_code)}

    def render(self) -> tuple[str, str]:
        return "TABLE\n", "error: one\n"


def test_emit_prints_the_document_or_the_text_and_the_errors_either_way() -> None:
    for as_json in (False, True):
        out, err = io.StringIO(), io.StringIO()
        assert emit(Sample(), as_json=as_json, out=out, err=err) == ExitCode.CHECK_FAILED
        assert err.getvalue() == "error: one\n"
        if as_json:
            assert json.loads(out.getvalue()) == {"command": "sample", "exit_code": 1}
        else:
            assert out.getvalue() == "TABLE\n"
