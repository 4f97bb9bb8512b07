"""A Helm chart repository on 127.0.0.1: `GET <prefix>/index.yaml` as GitHub Pages serves one.

`FakeChartRepo(routes)` answers each path in `routes` with (status, body) and 404 otherwise;
`index_yaml` writes an index the way `helm repo index` does (apiVersion v1, entries: chart ->
versions newest first, each with name, version, appVersion, urls, created, digest).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from tests.trainctl.fake_aws import LoopbackStub, Reply


def index_yaml(charts: Mapping[str, Sequence[str]], *, base_url: str = "https://example.invalid/charts") -> bytes:
    """chart name -> its versions (as listed, newest first) -> index.yaml bytes."""
    entries: dict[str, list[dict[str, Any]]] = {}
    for chart, versions in charts.items():
        entries[chart] = [
            {
                "apiVersion": "v2",
                "name": chart,
                "version": version,
                "appVersion": version,
                "description": f"test chart {chart}",
                "created": "2026-01-05T12:00:00.000000000Z",
                "digest": hashlib.sha256(f"{chart}-{version}".encode()).hexdigest(),
                "urls": [f"{base_url}/{chart}-{version}.tgz"],
            }
            for version in versions
        ]
    document = {"apiVersion": "v1", "entries": entries, "generated": "2026-01-05T12:00:00.000000000Z"}
    return yaml.safe_dump(document, sort_keys=False).encode()


class FakeChartRepo(LoopbackStub):
    """`routes`: path -> (HTTP status, body). Every GET is recorded in `calls`."""

    def __init__(self, routes: Mapping[str, tuple[int, bytes]]) -> None:
        super().__init__()
        self.routes = dict(routes)

    def handle(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Reply:
        assert method == "GET", (method, path)
        self.calls.append(path)
        status, payload = self.routes.get(path, (404, b"<html><body>404 Not Found</body></html>"))
        content_type = "application/x-yaml" if status == 200 else "text/html"
        return status, {"Content-Type": content_type}, payload

    def repository(self, prefix: str = "") -> str:
        """The repository URL whose index.yaml is routes[prefix + '/index.yaml']."""
        return f"{self.url}{prefix}"
