"""A minimal OCI distribution API client: which digest does a registry serve for a tag?

Standard library only. `resolve_digest("registry/repository:tag")` asks the registry with
`HEAD /v2/<repository>/manifests/<tag>`, accepting (in order of preference) an OCI image
index, a Docker manifest list, an OCI image manifest and a Docker v2 manifest, so a
multi-arch image resolves to the digest of its index; that is what a node pulls with
`reference@digest` on any architecture. Without a `Docker-Content-Digest` header the
client falls back to GET and hashes the exact bytes of the body.

Authentication: anonymous pulls through the bearer-token flow (a 401 with
`WWW-Authenticate: Bearer realm=...`, a token for `repository:<repo>:pull`, one retry).
Private registries plug in through `credentials`: a provider per registry host that
returns an `Authorization` header value (e.g. an ECR provider built on boto3's
`get_authorization_token` would return `Basic <token>`). It is sent with the first
request and to a bearer realm. No provider ships here.

Transport: `http_transport` (http.client) by default; anything with its call signature
can replace it. Plain http is used only for loopback registries (127.0.0.0/8, localhost,
[::1]) and only with `allow_insecure_loopback=True`; every other URL, including token
realms and redirects, must be https.
"""

from __future__ import annotations

import hashlib
import http.client
import ipaddress
import json
import re
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Protocol
from urllib.parse import quote, urlencode, urljoin, urlsplit

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
# Order of preference: a multi-arch index (its digest covers every platform) before a single manifest.
MANIFEST_MEDIA_TYPES = (OCI_INDEX, DOCKER_MANIFEST_LIST, OCI_MANIFEST, DOCKER_MANIFEST)
ACCEPT = ", ".join(MANIFEST_MEDIA_TYPES)
INDEX_MEDIA_TYPES = frozenset({OCI_INDEX, DOCKER_MANIFEST_LIST})

DEFAULT_TIMEOUT = 10.0
MAX_MANIFEST_BYTES = 4 * 1024 * 1024  # the limit containerd applies to manifests
MAX_TOKEN_BYTES = 1024 * 1024
MAX_ERROR_BYTES = 64 * 1024
MAX_REDIRECTS = 5
USER_AGENT = "trainctl"

DOCKER_HUB_ALIASES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})
DOCKER_HUB_ENDPOINT = "registry-1.docker.io"

_SHA256_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# registry/path:tag. The registry is a host name, an IPv4 address or a bracketed IPv6 address, with an optional port.
_REFERENCE = re.compile(
    r"^(?P<registry>\[[0-9A-Fa-f:.]+\](?::\d+)?|[A-Za-z0-9.-]+(?::\d+)?)"
    r"/(?P<repository>[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)"
    r":(?P<tag>[A-Za-z0-9_][A-Za-z0-9._-]{0,127})$"
)


# --- errors ---------------------------------------------------------------------------------


class RegistryError(Exception):
    """A tag could not be resolved. `str()` names the reference and what happened."""

    kind: ClassVar[str] = "registry"

    def __init__(self, reference: str, detail: str) -> None:
        super().__init__(f"{reference}: {detail}")
        self.reference = reference
        self.detail = detail


class InvalidReferenceError(RegistryError):
    kind = "invalid_reference"


class NotFoundError(RegistryError):
    kind = "not_found"


class UnauthorizedError(RegistryError):
    kind = "unauthorized"


class RegistryNetworkError(RegistryError):
    """Connection refused or reset, DNS, TLS, or a timeout."""

    kind = "network"


class MalformedDigestError(RegistryError):
    """The registry's digest is not sha256:<64 hex>, or does not match the content it served."""

    kind = "malformed_digest"


class InsecureURLError(RegistryError):
    """A plain-http URL (registry, redirect or token realm) that the policy does not allow."""

    kind = "insecure_url"


class RegistryResponseError(RegistryError):
    """A response the protocol does not allow here: an unexpected status, a bad token document, a wrong media type."""

    kind = "bad_response"


# --- references -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageReference:
    reference: str
    """As written: registry/repository:tag."""
    registry: str
    """The registry as written in the reference (credential providers are keyed by it)."""
    endpoint: str
    """host[:port] the API is served on (Docker Hub's docker.io becomes registry-1.docker.io)."""
    repository: str
    """The repository inside the registry (Docker Hub's official images gain `library/`)."""
    tag: str

    @property
    def hostname(self) -> str:
        return urlsplit(f"//{self.endpoint}").hostname or ""


def parse_reference(reference: str) -> ImageReference:
    """Split a fully qualified tag reference; refuse digests, bare names and references without a registry host."""
    if "@" in reference:
        raise InvalidReferenceError(
            reference, "is a digest reference; expected registry/repository:tag (the tag is what gets resolved)"
        )
    match = _REFERENCE.match(reference)
    if match is None:
        raise InvalidReferenceError(reference, "is not a tag reference; expected registry/repository:tag")
    registry, repository, tag = match["registry"], match["repository"], match["tag"]
    host = registry.rsplit(":", 1)[0] if not registry.startswith("[") else registry.split("]")[0] + "]"
    if not ("." in host or ":" in registry or host.startswith("[") or host.lower() == "localhost"):
        raise InvalidReferenceError(
            reference,
            f"has no registry host ({registry!r} reads as a Docker Hub namespace); "
            f"write it fully qualified, e.g. docker.io/{registry}/{repository}:{tag}",
        )
    endpoint = registry.lower()
    if endpoint in DOCKER_HUB_ALIASES:
        endpoint = DOCKER_HUB_ENDPOINT
        if "/" not in repository:
            repository = f"library/{repository}"
    return ImageReference(reference, registry.lower(), endpoint, repository, tag)


def is_loopback(hostname: str) -> bool:
    """127.0.0.0/8, ::1 and `localhost`; nothing that merely resolves to them."""
    host = hostname.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --- transport ------------------------------------------------------------------------------


@dataclass(frozen=True)
class HttpRequest:
    method: str
    url: str
    headers: Mapping[str, str]
    timeout: float
    """Bounds the exchange: connect, request, response head and body (see http_transport)."""
    max_body: int = MAX_MANIFEST_BYTES
    """Read at most max_body + 1 bytes of the body (one more tells the caller it was too long)."""


@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes = b""

    def header(self, name: str) -> str | None:
        values = self.header_all(name)
        return values[0] if values else None

    def header_all(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key.lower() == name.lower()]


class Transport(Protocol):
    """Send one request (no redirects followed). Network failures raise OSError (TimeoutError for
    timeouts) or http.client.HTTPException; any HTTP status is a response, not an error."""

    def __call__(self, request: HttpRequest) -> HttpResponse: ...


def http_transport(request: HttpRequest) -> HttpResponse:
    """The default transport: http.client, TLS verified against the system trust store. One deadline
    (request.timeout) covers connect, TLS, sending and the response head; the body is read in chunks,
    each bounded by what was left of it, and no chunk starts after it: at most about twice the timeout."""
    parts = urlsplit(request.url)
    deadline = time.monotonic() + request.timeout

    def remaining() -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"timed out after {request.timeout:g}s")
        return left

    connection: http.client.HTTPConnection
    if parts.scheme == "https":
        connection = http.client.HTTPSConnection(
            parts.hostname or "", parts.port, timeout=request.timeout, context=ssl.create_default_context()
        )
    elif parts.scheme == "http":
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=request.timeout)
    else:
        raise http.client.InvalidURL(f"unsupported scheme in {request.url}")
    try:
        connection.connect()
        sock = connection.sock
        sock.settimeout(remaining())
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        connection.request(request.method, target, headers=dict(request.headers))
        sock.settimeout(remaining())
        response = connection.getresponse()
        chunks: list[bytes] = []
        size = 0
        if request.method != "HEAD":
            while size <= request.max_body:
                remaining()  # the socket may already be handed to the response: no settimeout here
                chunk = response.read1(min(65536, request.max_body + 1 - size))  # one recv, not a loop
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        return HttpResponse(response.status, tuple(response.getheaders()), b"".join(chunks))
    finally:
        connection.close()


# --- authentication -------------------------------------------------------------------------

CredentialProvider = Callable[[ImageReference], str | None]
"""Given the reference being resolved, an `Authorization` header value (e.g. `Basic <base64>`), or None."""

_TOKEN_CHARS = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_CHALLENGE_SCHEME = re.compile(rf"[\s,]*({_TOKEN_CHARS})(?=\s|$)")
_CHALLENGE_PARAM = re.compile(rf'\s*({_TOKEN_CHARS})\s*=\s*("(?:[^"\\]|\\.)*"|[^\s,]*)\s*(?:,|$)')


@dataclass(frozen=True)
class Challenge:
    scheme: str
    """Lower-case: bearer, basic, ..."""
    params: Mapping[str, str] = field(default_factory=dict)


def parse_challenges(values: list[str]) -> list[Challenge]:
    """Every challenge of the WWW-Authenticate header(s) (RFC 9110 auth-param syntax; token68 is not needed here)."""
    challenges = []
    for value in values:
        position = 0
        while True:
            scheme = _CHALLENGE_SCHEME.match(value, position)
            if scheme is None:
                break
            position = scheme.end()
            params: dict[str, str] = {}
            while (param := _CHALLENGE_PARAM.match(value, position)) is not None and param.end() > position:
                raw = param[2]
                if raw.startswith('"'):
                    raw = re.sub(r"\\(.)", r"\1", raw[1:-1])
                params[param[1].lower()] = raw
                position = param.end()
            challenges.append(Challenge(scheme[1].lower(), params))
    return challenges


# --- the client -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Resolved:
    reference: str
    digest: str
    media_type: str | None
    """The manifest's media type as the registry reported it (an index for multi-arch images)."""
    method: str
    """HEAD, or GET when the registry gave no digest header and the body was hashed."""


def _registry_error_detail(response: HttpResponse) -> str:
    """`CODE: message` from a registry's JSON error body, if it sent one."""
    try:
        errors = json.loads(response.body.decode("utf-8", "replace"))["errors"]
        return "; ".join(f"{e.get('code', '?')}: {e.get('message', '')}".rstrip(": ") for e in errors)
    except (ValueError, KeyError, TypeError, AttributeError):
        return ""


def _media_type(response: HttpResponse) -> str | None:
    value = response.header("Content-Type")
    return value.split(";", 1)[0].strip().lower() if value else None


class RegistryClient:
    """Resolves tags to digests. One instance may resolve many references; it caches pull tokens."""

    def __init__(
        self,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        allow_insecure_loopback: bool = False,
        transport: Transport = http_transport,
        credentials: Mapping[str, CredentialProvider] | None = None,
    ) -> None:
        if not 0 < timeout <= 300:
            raise ValueError(f"timeout={timeout!r}: expected seconds in (0, 300]")
        self.timeout = timeout
        self.allow_insecure_loopback = allow_insecure_loopback
        self.transport = transport
        self.credentials = {host.lower(): provider for host, provider in (credentials or {}).items()}
        self._tokens: dict[tuple[str, str], str] = {}

    # public API

    def resolve(self, reference: str) -> Resolved:
        ref = parse_reference(reference)
        url = self.manifest_url(ref)
        head = self._request(ref, "HEAD", url)
        digest = head.header("Docker-Content-Digest")
        if digest is not None and digest.strip():
            return Resolved(
                reference, self._valid_digest(ref, digest.strip()), self._check_media_type(ref, head), "HEAD"
            )
        response = self._request(ref, "GET", url)
        if len(response.body) > MAX_MANIFEST_BYTES:
            raise RegistryResponseError(reference, f"the manifest is larger than {MAX_MANIFEST_BYTES} bytes")
        computed = "sha256:" + hashlib.sha256(response.body).hexdigest()
        claimed = (response.header("Docker-Content-Digest") or "").strip()
        if claimed and claimed != computed:
            raise MalformedDigestError(
                reference,
                f"the registry claims Docker-Content-Digest {claimed} but the manifest it served hashes to {computed}",
            )
        return Resolved(reference, computed, self._check_media_type(ref, response), "GET")

    def resolve_digest(self, reference: str) -> str:
        return self.resolve(reference).digest

    def manifest_url(self, ref: ImageReference) -> str:
        scheme = "http" if self.allow_insecure_loopback and is_loopback(ref.hostname) else "https"
        return f"{scheme}://{ref.endpoint}/v2/{quote(ref.repository, safe='/')}/manifests/{quote(ref.tag, safe='')}"

    # internals

    def _valid_digest(self, ref: ImageReference, digest: str) -> str:
        if not _SHA256_DIGEST.match(digest):
            raise MalformedDigestError(
                ref.reference,
                f"the registry answered Docker-Content-Digest {digest[:100]!r}; expected sha256: and 64 lower-case hex",
            )
        return digest

    def _check_media_type(self, ref: ImageReference, response: HttpResponse) -> str | None:
        media_type = _media_type(response)
        if media_type is not None and media_type not in MANIFEST_MEDIA_TYPES:
            raise RegistryResponseError(
                ref.reference,
                f"the registry served media type {media_type!r}, none of the accepted "
                f"{', '.join(MANIFEST_MEDIA_TYPES)}",
            )
        return media_type

    def _credential(self, ref: ImageReference) -> str | None:
        provider = self.credentials.get(ref.registry) or self.credentials.get(ref.endpoint)
        return provider(ref) if provider is not None else None

    def _check_url(self, ref: ImageReference, url: str, what: str) -> None:
        parts = urlsplit(url)
        if parts.scheme == "https" and parts.hostname:
            return
        if parts.scheme == "http" and parts.hostname and is_loopback(parts.hostname):
            if self.allow_insecure_loopback:
                return
            raise InsecureURLError(
                ref.reference, f"{what} {url} is plain http; allowed for loopback only with allow_insecure_loopback"
            )
        raise InsecureURLError(ref.reference, f"{what} {url} is not an https URL; refusing to send it a request")

    def _send(
        self, ref: ImageReference, method: str, url: str, headers: dict[str, str], *, max_body: int
    ) -> HttpResponse:
        """One exchange, following redirects (never to plain http); network failures become RegistryNetworkError."""
        for _ in range(MAX_REDIRECTS + 1):
            self._check_url(ref, url, "URL")
            try:
                response = self.transport(HttpRequest(method, url, dict(headers), self.timeout, max_body))
            except TimeoutError:
                raise RegistryNetworkError(ref.reference, f"{method} {url} timed out after {self.timeout:g}s") from None
            except (OSError, http.client.HTTPException) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
                raise RegistryNetworkError(ref.reference, f"{method} {url} failed: {reason}") from None
            except ValueError as exc:  # http.client.InvalidURL, a bad port in a Location header
                raise RegistryResponseError(ref.reference, f"{method} {url}: invalid URL ({exc})") from None
            location = response.header("Location")
            if response.status not in (301, 302, 303, 307, 308) or not location:
                return response
            target = urljoin(url, location)
            if urlsplit(target).netloc != urlsplit(url).netloc:
                headers.pop("Authorization", None)  # credentials stay with the host they were meant for
            url = target
        raise RegistryResponseError(ref.reference, f"more than {MAX_REDIRECTS} redirects from {method} {url}")

    def _request(self, ref: ImageReference, method: str, url: str) -> HttpResponse:
        scope = f"repository:{ref.repository}:pull"
        credential = self._credential(ref)
        headers = {"Accept": ACCEPT, "User-Agent": USER_AGENT}
        cached = self._tokens.get((ref.endpoint, scope))
        if cached is not None:
            headers["Authorization"] = f"Bearer {cached}"
        elif credential is not None:
            headers["Authorization"] = credential
        response = self._send(ref, method, url, dict(headers), max_body=MAX_MANIFEST_BYTES)
        if response.status == 401:
            challenges = parse_challenges(response.header_all("WWW-Authenticate"))
            bearer = next((c for c in challenges if c.scheme == "bearer"), None)
            if bearer is None:
                raise UnauthorizedError(ref.reference, self._no_bearer(ref, method, url, challenges, credential))
            token = self._fetch_token(ref, bearer, scope, credential)
            headers["Authorization"] = f"Bearer {token}"
            response = self._send(ref, method, url, dict(headers), max_body=MAX_MANIFEST_BYTES)
            if response.status == 401:
                self._tokens.pop((ref.endpoint, scope), None)
                raise UnauthorizedError(
                    ref.reference,
                    f"{method} {url} answered 401 again with the pull token from {bearer.params.get('realm')} "
                    f"(scope {scope}); the registry does not allow this pull",
                )
        return self._check_status(ref, method, url, response)

    def _no_bearer(
        self, ref: ImageReference, method: str, url: str, challenges: list[Challenge], credential: str | None
    ) -> str:
        if any(c.scheme == "basic" for c in challenges):
            if credential is not None:
                return f"{method} {url} answered 401: the registry rejected the credentials for {ref.registry}"
            return (
                f"{method} {url} answered 401 and asks for Basic credentials; trainctl pulls anonymously "
                f"unless a credential provider is configured for {ref.registry}"
            )
        offered = ", ".join(c.scheme for c in challenges) or "no WWW-Authenticate challenge"
        return f"{method} {url} answered 401 ({offered}); only the anonymous Bearer token flow is supported"

    def _fetch_token(self, ref: ImageReference, challenge: Challenge, scope: str, credential: str | None) -> str:
        realm = challenge.params.get("realm")
        if not realm:
            raise UnauthorizedError(ref.reference, "the registry's Bearer challenge names no realm to get a token from")
        self._check_url(ref, realm, "token realm")
        query = {"service": challenge.params["service"]} if challenge.params.get("service") else {}
        query["scope"] = scope
        url = f"{realm}{'&' if urlsplit(realm).query else '?'}{urlencode(query)}"
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if credential is not None:
            headers["Authorization"] = credential
        response = self._send(ref, "GET", url, headers, max_body=MAX_TOKEN_BYTES)
        if response.status != 200:
            detail = _registry_error_detail(response) or response.body[:200].decode("utf-8", "replace").strip()
            raise UnauthorizedError(
                ref.reference,
                f"the token endpoint {realm} refused a pull token for {scope} "
                f"(service {query.get('service', '-')}): HTTP {response.status}" + (f" {detail}" if detail else ""),
            )
        try:
            document = json.loads(response.body)
        except ValueError:
            raise RegistryResponseError(ref.reference, f"the token endpoint {realm} answered non-JSON") from None
        token = document.get("token") or document.get("access_token") if isinstance(document, dict) else None
        if not isinstance(token, str) or not token:
            raise RegistryResponseError(
                ref.reference, f"the token endpoint {realm} answered JSON without a 'token' or 'access_token'"
            )
        self._tokens[(ref.endpoint, scope)] = token
        return token

    def _check_status(self, ref: ImageReference, method: str, url: str, response: HttpResponse) -> HttpResponse:
        if 200 <= response.status < 300:
            return response
        detail = _registry_error_detail(response)
        suffix = f" ({detail})" if detail else ""
        if response.status == 404:
            raise NotFoundError(
                ref.reference,
                f"{method} {url} answered 404: no manifest for tag {ref.tag!r} in {ref.repository}{suffix}",
            )
        if response.status in (401, 403):
            raise UnauthorizedError(ref.reference, f"{method} {url} answered {response.status}{suffix}")
        if response.status == 429:
            raise RegistryResponseError(
                ref.reference, f"{method} {url} answered 429: rate limited{suffix}; retry later"
            )
        raise RegistryResponseError(ref.reference, f"{method} {url} answered HTTP {response.status}{suffix}")


def resolve_digest(
    reference: str,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    allow_insecure_loopback: bool = False,
    credentials: Mapping[str, CredentialProvider] | None = None,
) -> str:
    """The digest the registry serves for registry/repository:tag (the index digest of multi-arch images)."""
    client = RegistryClient(timeout=timeout, allow_insecure_loopback=allow_insecure_loopback, credentials=credentials)
    return client.resolve_digest(reference)
