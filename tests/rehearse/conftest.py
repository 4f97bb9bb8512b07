"""Rehearsals need Linux namespaces (root here and in CI); elsewhere they are skipped with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from k8s.check_lock import check_lock
from k8s.images import ImageLock
from rehearse import RehearsalError, check_platform
from tests.training.tiny import corpus_lines, save_tiny_model


@pytest.fixture(scope="session")
def namespaces() -> None:
    try:
        check_platform()
    except RehearsalError as exc:
        pytest.skip(f"no rehearsal on this machine: {exc}")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2 and its tokenizer, which pods see read-only at the same path (Options.host_paths)."""
    return save_tiny_model(tmp_path_factory.mktemp("rehearsal-model") / "tiny", corpus_lines())


@pytest.fixture(scope="session")
def lock() -> ImageLock:
    """The check lock, as the `dist` fixture and `make synth` in tests use it."""
    return check_lock(ImageLock.load())
