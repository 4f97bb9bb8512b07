"""trainctl.helm_repo against a real HTTP server on 127.0.0.1 serving index.yaml files."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.trainctl.fake_chart_repo import FakeChartRepo, index_yaml
from trainctl.helm_repo import ChartRepoError, RepoErrorKind, fetch_index, index_url, newest

INDEX = index_yaml({"aws-efa-k8s-device-plugin": ["v0.5.14", "v0.5.13"], "aws-load-balancer-controller": ["1.13.0"]})


@pytest.fixture
def repo() -> Iterator[FakeChartRepo]:
    routes = {
        "/index.yaml": (200, INDEX),
        "/eks/index.yaml": (200, INDEX),
        "/broken/index.yaml": (200, b"entries: [unclosed\n  - : :\n"),
        "/html/index.yaml": (200, b"<html><body>Sign in to continue</body></html>"),
        "/busy/index.yaml": (503, b"Service Unavailable"),
    }
    server = FakeChartRepo(routes)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_index_is_fetched_and_parsed_with_or_without_a_trailing_slash(repo: FakeChartRepo) -> None:
    for repository in (f"{repo.url}/eks", f"{repo.url}/eks/"):
        index = fetch_index(repository, timeout=5)
        assert index.url == f"{repo.url}/eks/index.yaml"
        assert index.versions("aws-efa-k8s-device-plugin") == ("v0.5.14", "v0.5.13")
        assert index.versions("no-such-chart") is None
    assert repo.calls == ["/eks/index.yaml", "/eks/index.yaml"]
    assert index_url("https://aws.github.io/eks-charts") == "https://aws.github.io/eks-charts/index.yaml"


@pytest.mark.parametrize(
    ("path", "kind", "message"),
    [
        ("/missing", RepoErrorKind.NOT_FOUND, "HTTP 404"),
        ("/busy", RepoErrorKind.HTTP_ERROR, "HTTP 503"),
        ("/broken", RepoErrorKind.MALFORMED, "is not valid YAML"),
        ("/html", RepoErrorKind.MALFORMED, "is not a Helm repository index (got str, expected 'entries')"),
    ],
)
def test_answers_that_are_not_an_index_are_named(
    path: str, kind: RepoErrorKind, message: str, repo: FakeChartRepo
) -> None:
    with pytest.raises(ChartRepoError) as raised:
        fetch_index(f"{repo.url}{path}", timeout=5)
    assert raised.value.kind is kind
    assert message in str(raised.value)
    assert raised.value.url == f"{repo.url}{path}/index.yaml"


def test_a_dead_port_and_a_silent_server_are_unreachable(dead_host: str, silent_host: str) -> None:
    with pytest.raises(ChartRepoError) as refused:
        fetch_index(f"http://{dead_host}", timeout=5)
    assert refused.value.kind is RepoErrorKind.UNREACHABLE
    assert "Connection refused" in str(refused.value)
    with pytest.raises(ChartRepoError) as silent:
        fetch_index(f"http://{silent_host}", timeout=0.5)
    assert silent.value.kind is RepoErrorKind.UNREACHABLE
    assert "timed out" in str(silent.value)


def test_an_index_over_the_size_cap_is_refused(repo: FakeChartRepo) -> None:
    with pytest.raises(ChartRepoError) as raised:
        fetch_index(repo.url, timeout=5, max_bytes=100)
    assert raised.value.kind is RepoErrorKind.TOO_LARGE
    assert f"is {len(INDEX)} bytes, over the 100-byte cap" in str(raised.value)
    assert fetch_index(repo.url, timeout=5, max_bytes=len(INDEX)).versions("aws-load-balancer-controller") == (
        "1.13.0",
    )


def test_newest_orders_by_release_numbers_not_text() -> None:
    versions = ["v0.5.9", "v0.5.10", "v0.5.8-rc1", "v0.5.10-rc2", "v0.4.30", "v0.5.9"]
    assert newest(versions) == ["v0.5.10", "v0.5.10-rc2", "v0.5.9", "v0.5.8-rc1", "v0.4.30"]
    assert newest(versions, 2) == ["v0.5.10", "v0.5.10-rc2"]
