"""The `trainctl` command line: one argparse parser, one module per subcommand.

A subcommand module provides `add_parser(subparsers)`, which registers its parser and sets
`run` (args -> exit code, see trainctl.exit_codes) as a default. To add one, write the module
(a thin command under trainctl/commands/ over a library module, like commands/scale.py: its flags from
trainctl.flags, its report printed with trainctl.output.emit, its progress through
trainctl.progress.Progress.for_args) and list it in SUBCOMMANDS; a command never imports another, and
the library never imports a command (tests/test_layers.py).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from trainctl.commands import (
    baseline,
    capacity,
    drain,
    fabric_check,
    goodput,
    logs,
    pin,
    plan,
    preflight,
    rehearse,
    scale,
    status,
    submit,
)
from trainctl.exit_codes import ExitCode

SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None], ...] = (
    pin.add_parser,
    fabric_check.add_parser,
    preflight.add_parser,
    submit.add_parser,
    status.add_parser,
    logs.add_parser,
    capacity.add_parser,
    scale.add_parser,
    rehearse.add_parser,
    goodput.add_parser,
    baseline.add_parser,
    plan.add_parser,
    drain.add_parser,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainctl",
        description="Operator CLI of the training platform. Run it from the repository root: python -m trainctl.",
        epilog="exit codes (every subcommand): 0 ok, 1 a check failed, 2 could not run, 3 nothing to judge",
    )
    subparsers = parser.add_subparsers(title="subcommands", metavar="COMMAND", required=True)
    for add_parser in SUBCOMMANDS:
        add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # argparse exits 2 (ExitCode.ERROR) on bad arguments
    run: Callable[[argparse.Namespace], int] = args.run
    return int(ExitCode(run(args)))
