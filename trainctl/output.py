"""What a command prints: one report protocol and one `emit`, plain-text tables for humans and one JSON
document (--json) for machines.

A command gathers a report (its library module's job) and hands it to `emit`, which prints it: the
printers stay apart from the gathering, as kueuectl keeps each list's printer in its own file
(cmd/kueuectl/app/list/list_workload_printer.go beside list_workload.go). Every report says its exit
code, its JSON document and its text for stdout and stderr; with --json stdout is the document and stderr
the same as without.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any, Protocol, TextIO


class Report(Protocol):
    @property
    def exit_code(self) -> int: ...

    def to_json(self) -> dict[str, Any]: ...

    def render(self) -> tuple[str, str]:
        """(stdout, stderr) for humans: the tables and summary; warnings and errors."""
        ...


def emit(report: Report, *, as_json: bool, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Print the report (the JSON document or the text on stdout, its errors on stderr); its exit code."""
    text, errors = report.render()
    (out or sys.stdout).write(to_json(report.to_json()) + "\n" if as_json else text)
    (err or sys.stderr).write(errors)
    return int(report.exit_code)


# The STATUS of a check that could not run (no credentials, unreachable, access denied): no verdict,
# never FAIL. Every table of every subcommand uses this label.
NOT_RUN = "NOT RUN"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns, two spaces apart, no trailing blanks."""
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(headers)]
    lines = [headers, *rows]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def to_json(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=False)


def short_digest(digest: str | None) -> str:
    """sha256: and the first 12 hex digits (as `docker images` shows them); '-' for none."""
    if digest is None:
        return "-"
    algorithm, _, hexdigits = digest.partition(":")
    return f"{algorithm}:{hexdigits[:12]}"
