"""The registry client against a real HTTP registry on 127.0.0.1 (tests/trainctl/fake_registry.py)."""

from __future__ import annotations

import hashlib
import time
import urllib.request
from collections.abc import Mapping

import pytest

from tests.trainctl.conftest import TIMEOUT
from tests.trainctl.fake_registry import FakeRegistry, make_image
from trainctl.registry import (
    ACCEPT,
    DOCKER_MANIFEST,
    DOCKER_MANIFEST_LIST,
    OCI_INDEX,
    OCI_MANIFEST,
    CredentialProvider,
    ImageReference,
    InsecureURLError,
    InvalidReferenceError,
    MalformedDigestError,
    NotFoundError,
    RegistryClient,
    RegistryError,
    RegistryNetworkError,
    RegistryResponseError,
    UnauthorizedError,
    is_loopback,
    parse_challenges,
    parse_reference,
    resolve_digest,
)


def client(credentials: Mapping[str, CredentialProvider] | None = None) -> RegistryClient:
    return RegistryClient(timeout=TIMEOUT, allow_insecure_loopback=True, credentials=credentials)


# --- content negotiation ----------------------------------------------------------------------


def test_accept_header_prefers_index_then_manifest_list_then_manifests(registry: FakeRegistry) -> None:
    registry.push("ray", "v1", make_image("ray"))
    client().resolve(registry.ref("ray", "v1"))
    (head,) = registry.requests("/v2/")
    assert head.method == "HEAD"
    assert head.path == "/v2/ray/manifests/v1"
    assert [part.strip() for part in head.headers["accept"].split(",")] == [
        OCI_INDEX,
        DOCKER_MANIFEST_LIST,
        OCI_MANIFEST,
        DOCKER_MANIFEST,
    ]
    assert head.headers["accept"] == ACCEPT


def test_multi_arch_tag_resolves_to_the_index_digest(registry: FakeRegistry) -> None:
    image = registry.push("team/ray", "v1", make_image("ray"))
    resolved = client().resolve(registry.ref("team/ray", "v1"))
    assert resolved.digest == image.index_digest == "sha256:" + hashlib.sha256(image.index or b"").hexdigest()
    assert resolved.digest != image.manifest_digest
    assert resolved.media_type == OCI_INDEX
    assert resolved.method == "HEAD"
    # The server negotiates: a client that accepts only single manifests gets the manifest's digest.
    request = urllib.request.Request(
        f"http://{registry.host}/v2/team/ray/manifests/v1", method="HEAD", headers={"Accept": OCI_MANIFEST}
    )
    with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
        assert response.headers["Docker-Content-Digest"] == image.manifest_digest
        assert response.headers["Content-Type"] == OCI_MANIFEST


def test_single_platform_tag_resolves_to_its_manifest_digest(registry: FakeRegistry) -> None:
    image = registry.push("nccl-tests", "2.23", make_image("nccl", multi_arch=False))
    resolved = client().resolve(registry.ref("nccl-tests", "2.23"))
    assert resolved.digest == image.manifest_digest
    assert resolved.media_type == OCI_MANIFEST


def test_module_level_resolve_digest(registry: FakeRegistry) -> None:
    image = registry.push("ray", "v1", make_image("ray"))
    assert resolve_digest(registry.ref("ray", "v1"), timeout=TIMEOUT, allow_insecure_loopback=True) == image.digest


def test_without_digest_header_the_body_of_a_get_is_hashed(registry: FakeRegistry) -> None:
    registry.digest_header = "absent"
    image = registry.push("ray", "v1", make_image("ray"))
    resolved = client().resolve(registry.ref("ray", "v1"))
    assert resolved.digest == image.index_digest
    assert resolved.method == "GET"
    assert [s.method for s in registry.requests("/v2/")] == ["HEAD", "GET"]


def test_get_fallback_checks_a_digest_header_against_the_body(registry: FakeRegistry) -> None:
    registry.digest_header = "absent-on-head"
    image = registry.push("ray", "v1", make_image("ray"))
    assert client().resolve(registry.ref("ray", "v1")).digest == image.index_digest
    registry.digest_header = "wrong-on-get"
    with pytest.raises(MalformedDigestError, match=r"claims Docker-Content-Digest .* hashes to"):
        client().resolve(registry.ref("ray", "v1"))


def test_malformed_digest_header_is_an_error_naming_the_reference(registry: FakeRegistry) -> None:
    registry.digest_header = "malformed"
    registry.push("ray", "v1", make_image("ray"))
    ref = registry.ref("ray", "v1")
    with pytest.raises(MalformedDigestError) as err:
        client().resolve(ref)
    assert str(err.value).startswith(f"{ref}: ")
    assert "'sha256:not-a-digest'" in str(err.value)
    assert err.value.kind == "malformed_digest"


def test_redirects_are_followed(registry: FakeRegistry) -> None:
    image = registry.push("ray", "v1", make_image("ray"))
    registry.redirects["old/ray"] = "ray"
    assert client().resolve_digest(registry.ref("old/ray", "v1")) == image.index_digest


# --- the anonymous bearer-token flow ------------------------------------------------------------


def test_bearer_challenge_then_token_then_success(registry: FakeRegistry) -> None:
    registry.auth = "bearer"
    image = registry.push("team/ray", "v1", make_image("ray"))
    assert client().resolve_digest(registry.ref("team/ray", "v1")) == image.index_digest
    first, token, retry = registry.requests()
    assert (first.method, first.path, "authorization" in first.headers) == ("HEAD", "/v2/team/ray/manifests/v1", False)
    assert (token.method, token.path) == ("GET", "/token")
    assert token.query == {"service": ["fake-registry"], "scope": ["repository:team/ray:pull"]}
    assert retry.headers["authorization"].startswith("Bearer ")


def test_pull_tokens_are_reused_within_a_client(registry: FakeRegistry) -> None:
    registry.auth = "bearer"
    registry.push("ray", "v1", make_image("ray"))
    registry.push("ray", "v2", make_image("ray2"))
    resolver = client()
    resolver.resolve(registry.ref("ray", "v1"))
    resolver.resolve(registry.ref("ray", "v2"))
    assert len(registry.requests("/token")) == 1


def test_access_token_field_is_accepted(registry: FakeRegistry) -> None:
    registry.auth = "bearer"
    registry.token_field = "access_token"
    image = registry.push("ray", "v1", make_image("ray"))
    assert client().resolve_digest(registry.ref("ray", "v1")) == image.index_digest


def test_token_endpoint_refusing_is_unauthorized(registry: FakeRegistry) -> None:
    registry.auth = "bearer"
    registry.token_policy = "refuse"
    registry.push("ray", "v1", make_image("ray"))
    ref = registry.ref("ray", "v1")
    with pytest.raises(UnauthorizedError) as err:
        client().resolve(ref)
    text = str(err.value)
    assert text.startswith(f"{ref}: the token endpoint http://{registry.host}/token refused")
    assert "repository:ray:pull" in text
    assert "HTTP 401" in text
    assert "DENIED" in text


def test_token_endpoint_only_serves_its_own_service(registry: FakeRegistry) -> None:
    registry.auth = "bearer"
    registry.challenge_service = "someone-else"
    registry.push("ray", "v1", make_image("ray"))
    with pytest.raises(UnauthorizedError, match=r"refused a pull token .*service someone-else"):
        client().resolve(registry.ref("ray", "v1"))


def test_a_second_401_after_the_token_is_unauthorized(registry: FakeRegistry) -> None:
    registry.auth = "bearer"
    registry.token_policy = "worthless"
    registry.push("ray", "v1", make_image("ray"))
    with pytest.raises(UnauthorizedError, match=r"answered 401 again with the pull token"):
        client().resolve(registry.ref("ray", "v1"))
    assert [s.path for s in registry.requests()] == ["/v2/ray/manifests/v1", "/token", "/v2/ray/manifests/v1"]


def test_basic_challenge_without_credentials_is_unauthorized(registry: FakeRegistry) -> None:
    registry.auth = "basic"
    registry.push("ray", "v1", make_image("ray"))
    with pytest.raises(
        UnauthorizedError, match=rf"asks for Basic credentials.*provider is configured for {registry.host}"
    ):
        client().resolve(registry.ref("ray", "v1"))


def test_credential_provider_per_registry_host_is_the_seam_for_private_registries(registry: FakeRegistry) -> None:
    registry.auth = "basic"
    image = registry.push("ray", "v1", make_image("ray"))
    asked: list[ImageReference] = []

    def provider(ref: ImageReference) -> str:
        asked.append(ref)
        return registry.basic_credential

    assert client(credentials={registry.host: provider}).resolve_digest(registry.ref("ray", "v1")) == image.digest
    assert [r.repository for r in asked] == ["ray"]
    with pytest.raises(UnauthorizedError, match=r"rejected the credentials"):
        client(credentials={registry.host: lambda ref: "Basic d3Jvbmc="}).resolve(registry.ref("ray", "v1"))


def test_token_realm_must_be_https_unless_loopback(registry: FakeRegistry) -> None:
    registry.auth = "bearer"
    registry.realm = "http://auth.example.com/token"
    registry.push("ray", "v1", make_image("ray"))
    with pytest.raises(InsecureURLError, match=r"token realm http://auth.example.com/token is not an https URL"):
        client().resolve(registry.ref("ray", "v1"))
    assert registry.requests("/token") == []


# --- registry and network errors ----------------------------------------------------------------


def test_unknown_tag_is_not_found(registry: FakeRegistry) -> None:
    registry.push("ray", "v1", make_image("ray"))
    ref = registry.ref("ray", "v9")
    with pytest.raises(NotFoundError) as err:
        client().resolve(ref)
    assert str(err.value).startswith(f"{ref}: HEAD http://{registry.host}/v2/ray/manifests/v9 answered 404")
    assert "no manifest for tag 'v9' in ray" in str(err.value)


@pytest.mark.parametrize(("status", "match"), [(500, r"answered HTTP 500"), (429, r"429: rate limited")])
def test_server_errors_are_registry_errors(registry: FakeRegistry, status: int, match: str) -> None:
    registry.fail_with = status
    registry.push("ray", "v1", make_image("ray"))
    with pytest.raises(RegistryResponseError, match=match):
        client().resolve(registry.ref("ray", "v1"))


def test_connection_refused_is_a_network_error(dead_host: str) -> None:
    ref = f"{dead_host}/ray:v1"
    with pytest.raises(RegistryNetworkError) as err:
        client().resolve(ref)
    assert str(err.value).startswith(f"{ref}: HEAD http://{dead_host}/v2/ray/manifests/v1 failed")
    assert err.value.kind == "network"


def test_a_registry_that_never_answers_times_out(silent_host: str) -> None:
    started = time.monotonic()
    with pytest.raises(RegistryNetworkError, match=r"timed out after 0.5s"):
        RegistryClient(timeout=0.5, allow_insecure_loopback=True).resolve(f"{silent_host}/ray:v1")
    assert time.monotonic() - started < 5


def test_a_registry_that_drips_the_body_times_out(registry: FakeRegistry) -> None:
    registry.digest_header = "absent"  # forces the GET, whose body arrives 16 bytes every 0.1 s
    registry.drip_seconds = 0.1
    registry.push("ray", "v1", make_image("ray"))
    started = time.monotonic()
    with pytest.raises(RegistryNetworkError, match=r"GET .* timed out after 0.5s"):
        RegistryClient(timeout=0.5, allow_insecure_loopback=True).resolve(registry.ref("ray", "v1"))
    assert time.monotonic() - started < 2


def test_https_is_used_unless_loopback_is_explicitly_allowed(registry: FakeRegistry) -> None:
    registry.push("ray", "v1", make_image("ray"))
    ref = parse_reference(registry.ref("ray", "v1"))
    assert RegistryClient().manifest_url(ref).startswith(f"https://{registry.host}/")
    assert client().manifest_url(ref).startswith(f"http://{registry.host}/")
    remote = parse_reference("registry.example.com/ray:v1")
    assert client().manifest_url(remote) == "https://registry.example.com/v2/ray/manifests/v1"
    # Against the plain-http test registry, https fails (TLS) instead of quietly downgrading.
    with pytest.raises(RegistryNetworkError, match=rf"HEAD https://{registry.host}/"):
        RegistryClient(timeout=TIMEOUT).resolve(registry.ref("ray", "v1"))
    assert registry.requests("/v2/") == []


def test_every_error_is_a_registry_error() -> None:
    for error in (
        InvalidReferenceError,
        NotFoundError,
        UnauthorizedError,
        RegistryNetworkError,
        MalformedDigestError,
        InsecureURLError,
        RegistryResponseError,
    ):
        assert issubclass(error, RegistryError)
    assert len({e.kind for e in RegistryError.__subclasses__()}) == len(RegistryError.__subclasses__())


# --- references and challenges ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reference", "endpoint", "repository"),
    [
        ("docker.io/library/ubuntu:22.04", "registry-1.docker.io", "library/ubuntu"),
        ("docker.io/ubuntu:22.04", "registry-1.docker.io", "library/ubuntu"),
        ("index.docker.io/rayproject/ray:2.9.0", "registry-1.docker.io", "rayproject/ray"),
        (
            "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1.0",
            "public.ecr.aws",
            "deep-learning-containers/ray",
        ),
        ("localhost:5000/ray:v1", "localhost:5000", "ray"),
        ("127.0.0.1:5000/a/b/c:v1", "127.0.0.1:5000", "a/b/c"),
        ("[::1]:5000/ray:v1", "[::1]:5000", "ray"),
    ],
)
def test_references_map_to_endpoint_and_repository(reference: str, endpoint: str, repository: str) -> None:
    ref = parse_reference(reference)
    assert (ref.endpoint, ref.repository) == (endpoint, repository)


@pytest.mark.parametrize(
    ("reference", "match"),
    [
        ("library/ubuntu:22.04", r"has no registry host .*docker.io/library/ubuntu:22.04"),
        ("rayproject/ray:2.9.0", r"has no registry host"),
        ("ubuntu:22.04", r"is not a tag reference"),
        ("docker.io/library/ubuntu", r"is not a tag reference"),
        ("docker.io/library/ubuntu@sha256:" + "a" * 64, r"is a digest reference"),
    ],
)
def test_references_without_registry_host_or_tag_are_refused(reference: str, match: str) -> None:
    with pytest.raises(InvalidReferenceError, match=match):
        parse_reference(reference)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("localhost", True),
        ("[::1]", True),
        ("::1", True),
        ("128.0.0.1", False),
        ("10.0.0.1", False),
        ("localhost.example.com", False),
        ("registry.example.com", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_non_loopback_hosts_never_get_plain_http() -> None:
    ref = parse_reference("10.0.0.1:5000/ray:v1")
    assert client().manifest_url(ref).startswith("https://")


def test_challenges_are_parsed_with_quoted_commas_and_several_schemes() -> None:
    (bearer, basic) = parse_challenges(
        [
            'Bearer realm="https://auth.example.com/token",service="reg, istry",'
            'scope="repository:a/b:pull", Basic realm="x"'
        ]
    )
    assert bearer.scheme == "bearer"
    assert dict(bearer.params) == {
        "realm": "https://auth.example.com/token",
        "service": "reg, istry",
        "scope": "repository:a/b:pull",
    }
    assert (basic.scheme, dict(basic.params)) == ("basic", {"realm": "x"})
