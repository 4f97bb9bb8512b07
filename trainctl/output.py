"""Plain-text tables for humans; every subcommand also offers --json for machines."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

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
