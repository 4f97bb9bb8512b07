"""Rehearsals need Linux namespaces (root here and in CI); elsewhere they are skipped with the reason."""

from __future__ import annotations

import pytest

from trainctl.rehearse import RehearsalError, check_platform


@pytest.fixture(scope="session")
def namespaces() -> None:
    try:
        check_platform()
    except RehearsalError as exc:
        pytest.skip(f"no rehearsal on this machine: {exc}")
