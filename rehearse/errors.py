"""The one error of the rehearsal: it could not run (exit 2)."""

from __future__ import annotations


class RehearsalError(Exception):
    """The rehearsal could not run (exit 2): not Linux, no namespaces, bad YAML, an unusable manifest."""
