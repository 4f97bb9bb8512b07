"""Exit codes of every trainctl subcommand (the same convention as `python -m gates`)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    """The command did what was asked; every check passed."""
    CHECK_FAILED = 1
    """The command ran to the end and a check failed (e.g. `pin --check`: a digest is stale or missing)."""
    ERROR = 2
    """The command could not run: bad arguments, a bad lock file, an unreachable or refusing registry."""
    NO_EVIDENCE = 3
    """There was nothing to judge (`fabric-check`: no NCCL network-selection lines; set NCCL_DEBUG=INFO)."""
    INTERRUPTED = 130
    """Interrupted (Ctrl-C, SIGINT: 128 + 2, as a shell reports it): `rehearse` stopped every pod, printed what ran."""
