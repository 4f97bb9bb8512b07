"""A real OCI distribution registry, small: manifests only, on 127.0.0.1, plain http, in a thread.

What it implements, as a registry does:
- `HEAD` and `GET /v2/<repo>/manifests/<tag-or-digest>` with `Docker-Content-Digest`,
  `Content-Type` and `Content-Length`; the digests are sha256 of the JSON bodies made here.
- Content negotiation: a multi-arch tag is served as its OCI image index when the client
  accepts that media type, otherwise as its (single) image manifest.
- `WWW-Authenticate: Bearer realm=...,service=...,scope=...` and its own `/token` endpoint,
  which issues a token only for its service and a `repository:<known repo>:pull` scope; or a
  Basic challenge; plus switches for the failure modes the client must handle.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from trainctl.registry import OCI_INDEX, OCI_MANIFEST

OCI_CONFIG = "application/vnd.oci.image.config.v1+json"


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _json(document: dict[str, Any]) -> bytes:
    return json.dumps(document, indent=3).encode()  # not compact: the digest must be of these exact bytes


@dataclass(frozen=True)
class Image:
    manifest: bytes
    index: bytes | None
    """None: a single-platform image, the tag has only the manifest."""

    @property
    def manifest_digest(self) -> str:
        return sha256(self.manifest)

    @property
    def index_digest(self) -> str:
        assert self.index is not None
        return sha256(self.index)

    @property
    def digest(self) -> str:
        """What a client that prefers indexes gets."""
        return self.index_digest if self.index is not None else self.manifest_digest

    def bodies(self) -> list[tuple[str, bytes]]:
        return [(OCI_MANIFEST, self.manifest)] + ([(OCI_INDEX, self.index)] if self.index is not None else [])


def make_image(label: str, *, multi_arch: bool = True) -> Image:
    config = _json({"architecture": "amd64", "os": "linux", "config": {"Labels": {"test": label}}, "rootfs": {}})
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": sha256(config), "size": len(config)},
            "layers": [],
        }
    )
    if not multi_arch:
        return Image(manifest, None)
    index = _json(
        {
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [
                {
                    "mediaType": OCI_MANIFEST,
                    "digest": sha256(manifest),
                    "size": len(manifest),
                    "platform": {"architecture": "amd64", "os": "linux"},
                }
            ],
        }
    )
    return Image(manifest, index)


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    """Lower-case names."""


@dataclass
class FakeRegistry:
    auth: Literal["none", "bearer", "basic"] = "none"
    challenge_service: str = "fake-registry"
    token_service: str = "fake-registry"
    """The only service the token endpoint issues tokens for."""
    token_policy: Literal["issue", "refuse", "worthless"] = "issue"
    """refuse: the token endpoint answers 401; worthless: it issues tokens the registry then rejects."""
    token_field: str = "token"
    realm: str | None = None
    """Overrides the realm of the Bearer challenge (default: this server's /token)."""
    basic_credential: str = "Basic " + base64.b64encode(b"AWS:secret").decode()
    digest_header: Literal["correct", "absent-on-head", "absent", "malformed", "wrong-on-get"] = "correct"
    drip_seconds: float = 0.0
    """Send manifest bodies 16 bytes at a time, this long apart (a registry that never quite stalls)."""
    fail_with: int | None = None
    """Answer every manifest request with this status."""
    redirects: dict[str, str] = field(default_factory=dict)
    """repo -> repo: manifest requests for the first are redirected (307) to the second."""
    tags: dict[tuple[str, str], Image] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    _tokens: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    # --- control (from the test) ---

    def start(self) -> FakeRegistry:
        registry = self

        class Handler(_Handler):
            owner = registry

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def host(self) -> str:
        assert self._server is not None
        return f"127.0.0.1:{self._server.server_address[1]}"

    def ref(self, repo: str, tag: str) -> str:
        return f"{self.host}/{repo}:{tag}"

    def push(self, repo: str, tag: str, image: Image) -> Image:
        with self._lock:
            self.tags[(repo, tag)] = image
        return image

    def requests(self, path_prefix: str = "") -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if s.path.startswith(path_prefix)]

    # --- serving (from the handler threads) ---

    def token(self, handler: _Handler, query: dict[str, list[str]]) -> None:
        service = query.get("service", [""])[0]
        scope = query.get("scope", [""])[0]
        repos = {repo for repo, _ in self.tags}
        wanted = {f"repository:{repo}:pull" for repo in repos}
        if self.token_policy == "refuse" or service != self.token_service or scope not in wanted:
            body = {"errors": [{"code": "DENIED", "message": f"no token for service={service!r} scope={scope!r}"}]}
            handler.reply(401, _json(body), {"Content-Type": "application/json"})
            return
        token = secrets.token_hex(16)
        with self._lock:
            self._tokens[token] = scope
        handler.reply(200, _json({self.token_field: token, "expires_in": 300}), {"Content-Type": "application/json"})

    def authorized(self, handler: _Handler, repo: str) -> bool:
        given = handler.headers.get("Authorization", "")
        if self.auth == "none":
            return True
        if self.auth == "basic":
            return given == self.basic_credential
        scheme, _, token = given.partition(" ")
        with self._lock:
            scope = self._tokens.get(token)
        return scheme == "Bearer" and self.token_policy != "worthless" and scope == f"repository:{repo}:pull"

    def challenge(self, repo: str) -> str:
        if self.auth == "basic":
            return 'Basic realm="fake-registry"'
        realm = self.realm or f"http://{self.host}/token"
        return f'Bearer realm="{realm}",service="{self.challenge_service}",scope="repository:{repo}:pull"'

    def manifest(self, handler: _Handler, repo: str, reference: str, head: bool) -> None:
        if repo in self.redirects:
            target = f"/v2/{self.redirects[repo]}/manifests/{reference}"
            handler.reply(307, b"", {"Location": target}, head=head)
            return
        if not self.authorized(handler, repo):
            error = {"errors": [{"code": "UNAUTHORIZED", "message": "authentication required"}]}
            headers = {"WWW-Authenticate": self.challenge(repo), "Content-Type": "application/json"}
            handler.reply(401, _json(error), headers, head=head)
            return
        if self.fail_with is not None:
            failure = {"errors": [{"code": "UNKNOWN", "message": "the registry is having a bad day"}]}
            handler.reply(self.fail_with, _json(failure), {"Content-Type": "application/json"}, head=head)
            return
        found = self.lookup(repo, reference, handler.headers.get("Accept", ""))
        if found is None:
            error = {"errors": [{"code": "MANIFEST_UNKNOWN", "message": f"manifest unknown: {reference}"}]}
            handler.reply(404, _json(error), {"Content-Type": "application/json"}, head=head)
            return
        media_type, body = found
        headers = {"Content-Type": media_type}
        mode = self.digest_header
        if mode == "correct" or (mode == "absent-on-head" and not head):
            headers["Docker-Content-Digest"] = sha256(body)
        elif mode == "malformed":
            headers["Docker-Content-Digest"] = "sha256:not-a-digest"
        elif mode == "wrong-on-get" and not head:
            headers["Docker-Content-Digest"] = sha256(b"something else")
        handler.reply(200, body, headers, head=head)

    def lookup(self, repo: str, reference: str, accept: str) -> tuple[str, bytes] | None:
        accepted = {part.split(";", 1)[0].strip() for part in accept.split(",")}
        with self._lock:
            images = {key: image for key, image in self.tags.items() if key[0] == repo}
        if reference.startswith("sha256:"):
            for candidate in images.values():
                for media_type, body in candidate.bodies():
                    if sha256(body) == reference:
                        return media_type, body
            return None
        tagged = images.get((repo, reference))
        if tagged is None:
            return None
        if tagged.index is not None and OCI_INDEX in accepted:
            return OCI_INDEX, tagged.index
        return OCI_MANIFEST, tagged.manifest


class _Handler(BaseHTTPRequestHandler):
    owner: FakeRegistry
    server_version = "fake-registry"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def reply(self, status: int, body: bytes, headers: dict[str, str], *, head: bool = False) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if head:
            return
        if not self.owner.drip_seconds:
            self.wfile.write(body)
            return
        try:
            for start in range(0, len(body), 16):
                self.wfile.write(body[start : start + 16])
                self.wfile.flush()
                time.sleep(self.owner.drip_seconds)
        except OSError:  # the client gave up, as it should
            return

    def _route(self, head: bool) -> None:
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        with self.owner._lock:
            self.owner.seen.append(
                Seen(self.command, parts.path, query, {k.lower(): v for k, v in self.headers.items()})
            )
        if parts.path == "/token" and not head:
            self.owner.token(self, query)
            return
        if parts.path.startswith("/v2/") and "/manifests/" in parts.path:
            repo, _, reference = parts.path[len("/v2/") :].rpartition("/manifests/")
            self.owner.manifest(self, repo, reference, head)
            return
        self.reply(404, b"{}", {"Content-Type": "application/json"}, head=head)

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)
