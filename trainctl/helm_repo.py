"""A Helm chart repository's index, read over HTTP(S): what `helm repo add` fetches, and nothing else.

A classic Helm repository serves `<repository>/index.yaml`: `apiVersion: v1` and `entries`, a
map from chart name to a list of chart versions, each with at least `version` (Helm docs, "The
Chart Repository Guide", index file). `helm install --repo URL --version V` resolves exactly
that string against `entries[chart][*].version` (a leading "v" is part of the version string
when the chart's Chart.yaml has it, as aws/eks-charts' charts do).

A chart published as an OCI artifact has no index: its "repository" is the chart's full reference
`oci://<registry>/<path>/<chart>` and each version is a tag of it (Helm docs, "Use OCI-based
registries": `helm push` stores version V as tag V, with "+" written "_"; `helm pull
oci://... --version V`). `check_oci_chart` asks the registry for that tag's manifest through the OCI
distribution API (trainctl/registry.py), which is what `helm pull` resolves first.

Every failure is a ChartRepoError whose `kind` says what went wrong; nothing here raises
urllib's, PyYAML's or the registry client's exceptions.
"""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import yaml

from trainctl import registry

DEFAULT_TIMEOUT = 20.0
# The biggest public indexes (aws/eks-charts: every version of every chart) are a few MB.
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
_CHUNK = 1024 * 1024


class RepoErrorKind(StrEnum):
    UNREACHABLE = "unreachable"
    """No HTTP answer: refused, timed out, DNS, TLS."""
    NOT_FOUND = "not-found"
    """The server answered 404 or 410 for index.yaml: no Helm repository at that URL (for an OCI
    chart: the registry has no such tag)."""
    HTTP_ERROR = "http-error"
    """Any other non-2xx answer (5xx, 403 from a proxy...)."""
    TOO_LARGE = "too-large"
    MALFORMED = "malformed"
    """Not YAML, or YAML that is not a repository index (e.g. a proxy's HTML page)."""


class ChartRepoError(Exception):
    def __init__(self, kind: RepoErrorKind, url: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.url = url


def index_url(repository: str) -> str:
    """`<repository>/index.yaml`, with or without the repository's trailing slash (as Helm joins them)."""
    return repository.rstrip("/") + "/index.yaml"


@dataclass(frozen=True)
class ChartIndex:
    url: str
    entries: Mapping[str, tuple[str, ...]]
    """Chart name -> its version strings, in the order the index lists them (Helm writes newest first)."""

    def versions(self, chart: str) -> tuple[str, ...] | None:
        """The chart's versions; None when the index has no such chart."""
        return self.entries.get(chart)


def parse_index(text: bytes, url: str) -> ChartIndex:
    loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        document = yaml.load(text, Loader=loader)
    except yaml.YAMLError as exc:
        raise ChartRepoError(RepoErrorKind.MALFORMED, url, f"{url} is not valid YAML: {exc}") from None
    if not isinstance(document, dict) or not isinstance(document.get("entries"), dict):
        shown = type(document).__name__ if not isinstance(document, dict) else "a map without 'entries'"
        raise ChartRepoError(
            RepoErrorKind.MALFORMED, url, f"{url} is not a Helm repository index (got {shown}, expected 'entries')"
        )
    entries: dict[str, tuple[str, ...]] = {}
    for name, versions in document["entries"].items():
        if not isinstance(versions, list):
            raise ChartRepoError(
                RepoErrorKind.MALFORMED, url, f"{url}: entries.{name} is a {type(versions).__name__}, not a list"
            )
        entries[str(name)] = tuple(
            str(item["version"]) for item in versions if isinstance(item, dict) and "version" in item
        )
    return ChartIndex(url=url, entries=entries)


def fetch_index(repository: str, *, timeout: float = DEFAULT_TIMEOUT, max_bytes: int = DEFAULT_MAX_BYTES) -> ChartIndex:
    """GET and parse `<repository>/index.yaml`; `timeout` bounds the connect and each read."""
    url = index_url(repository)
    if not url.startswith(("https://", "http://")):
        raise ChartRepoError(RepoErrorKind.UNREACHABLE, url, f"{repository!r} is not an http(s) URL")
    request = urllib.request.Request(url, headers={"User-Agent": "trainctl-preflight", "Accept": "*/*"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            declared = response.headers.get("Content-Length")
            if declared is not None and declared.isdigit() and int(declared) > max_bytes:
                raise ChartRepoError(
                    RepoErrorKind.TOO_LARGE, url, f"{url} is {int(declared)} bytes, over the {max_bytes}-byte cap"
                )
            chunks: list[bytes] = []
            size = 0
            while chunk := response.read(_CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise ChartRepoError(RepoErrorKind.TOO_LARGE, url, f"{url} is over the {max_bytes}-byte cap")
                chunks.append(chunk)
    except urllib.error.HTTPError as exc:
        kind = RepoErrorKind.NOT_FOUND if exc.code in (404, 410) else RepoErrorKind.HTTP_ERROR
        raise ChartRepoError(kind, url, f"GET {url}: HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise ChartRepoError(RepoErrorKind.UNREACHABLE, url, f"GET {url}: {exc.reason}") from None
    except TimeoutError as exc:
        message = f"GET {url}: timed out after {timeout:g} s ({exc})"
        raise ChartRepoError(RepoErrorKind.UNREACHABLE, url, message) from None
    except (OSError, http.client.HTTPException) as exc:
        raise ChartRepoError(RepoErrorKind.UNREACHABLE, url, f"GET {url}: {exc}") from None
    return parse_index(b"".join(chunks), url)


def newest(versions: Sequence[str], count: int = 5) -> list[str]:
    """The `count` newest of `versions` by release numbers (a leading 'v' ignored; 1.0.0-rc1 before 1.0.0)."""

    def key(version: str) -> tuple[tuple[int, ...], int, str]:
        core, _, pre = version.split("+")[0].lstrip("vV").partition("-")
        numbers = tuple(int(p) if p.isdigit() else -1 for p in core.split("."))
        return (numbers, 0 if pre else 1, version)

    return sorted(dict.fromkeys(versions), key=key, reverse=True)[:count]


OCI_SCHEME = "oci://"


def is_oci(repository: str) -> bool:
    return repository.startswith(OCI_SCHEME)


def oci_reference(repository: str, version: str) -> str:
    """`oci://host/path/chart` and a chart version -> `host/path/chart:<tag>` (Helm writes "+" as "_")."""
    if not is_oci(repository):
        raise ChartRepoError(RepoErrorKind.MALFORMED, repository, f"{repository!r} is not an oci:// chart reference")
    return f"{repository.removeprefix(OCI_SCHEME).rstrip('/')}:{version.replace('+', '_')}"


def check_oci_chart(repository: str, version: str, *, timeout: float = DEFAULT_TIMEOUT) -> str:
    """The digest the registry serves for the chart version's tag; ChartRepoError(NOT_FOUND) when the
    tag does not exist. Plain http only for a loopback registry (tests)."""
    reference = oci_reference(repository, version)
    client = registry.RegistryClient(timeout=min(timeout, 300.0), allow_insecure_loopback=True)
    try:
        return client.resolve_digest(reference)
    except registry.NotFoundError as exc:
        raise ChartRepoError(RepoErrorKind.NOT_FOUND, repository, str(exc)) from None
    except registry.RegistryNetworkError as exc:
        raise ChartRepoError(RepoErrorKind.UNREACHABLE, repository, str(exc)) from None
    except (registry.UnauthorizedError, registry.RegistryResponseError) as exc:
        raise ChartRepoError(RepoErrorKind.HTTP_ERROR, repository, str(exc)) from None
    except registry.RegistryError as exc:  # invalid reference, malformed digest, insecure URL
        raise ChartRepoError(RepoErrorKind.MALFORMED, repository, str(exc)) from None
