"""Per-test servers on loopback (a registry, a fake Kubernetes API), refusing ports, lock files (moto and the fake AWS
keys: tests/conftest.py)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from k8s.images import ImageLock
from tests.trainctl.fake_kube import FakeKube
from tests.trainctl.fake_registry import FakeRegistry

TIMEOUT = 5.0
"""Seconds per registry request in these tests (the CLI's --timeout)."""


@pytest.fixture
def registry() -> Iterator[FakeRegistry]:
    server = FakeRegistry().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    """A loopback Kubernetes API server; a test fails if any request crashed its handler."""
    server = FakeKube().start()
    try:
        yield server
    finally:
        server.stop()
    assert server.handler_errors == []


@pytest.fixture
def dead_host() -> Iterator[str]:
    """127.0.0.1:<port> where a socket is bound but not listening: connections are refused, and the
    port cannot be taken by anything else while the test runs."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


@pytest.fixture
def silent_host() -> Iterator[str]:
    """127.0.0.1:<port> that accepts connections (the kernel's backlog) but never answers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def write_lock(path: Path, entries: dict[str, tuple[str, str | None]]) -> Path:
    """name -> (reference, digest), written with ImageLock.write as `trainctl pin` writes it."""
    images = {
        name: {"reference": ref, "digest": digest, "purpose": f"test {name}"} for name, (ref, digest) in entries.items()
    }
    ImageLock.from_dict({"version": 1, "images": images}).write(path)
    return path
