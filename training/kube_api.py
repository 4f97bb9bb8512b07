"""The few Kubernetes API calls the fabric gate (in the job) and its remediation controller make, over the pod's
service-account token: urllib, no client library (both ship as source in a ConfigMap, training/__init__.py).

In a CPU rehearsal only, FABRIC_GATE_API_URL (+ FABRIC_GATE_API_TOKEN) names the rehearsal's API server instead of
the in-cluster one (rehearse/cluster/apiserver.py)."""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from training.rehearsal import cpu_rehearsal

API_URL_ENV = "FABRIC_GATE_API_URL"
API_TOKEN_ENV = "FABRIC_GATE_API_TOKEN"
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"


class KubeError(RuntimeError):
    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class KubeApi:
    def __init__(self, base_url: str, token: str, *, ca_file: str | None = None, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self._context = ssl.create_default_context(cafile=ca_file) if base_url.startswith("https:") else None

    @classmethod
    def in_cluster(cls, environ: Mapping[str, str] | None = None, sa_dir: Path = SERVICE_ACCOUNT_DIR) -> KubeApi | None:
        values = os.environ if environ is None else environ
        if values.get(API_URL_ENV) and cpu_rehearsal():
            # The rehearsal's API server (plain http on a private address); never read outside a CPU rehearsal.
            return cls(values[API_URL_ENV], values.get(API_TOKEN_ENV, "rehearsal"))
        host, port = values.get("KUBERNETES_SERVICE_HOST"), values.get("KUBERNETES_SERVICE_PORT", "443")
        token = sa_dir / "token"
        if not host or not token.exists():
            return None
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{port}", token.read_text().strip(), ca_file=str(sa_dir / "ca.crt"))

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=self._context) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:500]
            raise KubeError(f"{method} {path}: HTTP {exc.code}: {detail}", exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            raise KubeError(f"{method} {path}: {exc}") from None
        return json.loads(payload) if payload else None

    def get(self, path: str) -> dict[str, Any]:
        found: dict[str, Any] = self.request("GET", path)
        return found

    def get_or_none(self, path: str) -> dict[str, Any] | None:
        try:
            return self.get(path)
        except KubeError as exc:
            if exc.code == 404:
                return None
            raise

    def list_items(self, path: str, *, field_selector: str = "", label_selector: str = "") -> list[dict[str, Any]]:
        query = {k: v for k, v in (("fieldSelector", field_selector), ("labelSelector", label_selector)) if v}
        suffix = f"?{urllib.parse.urlencode(query)}" if query else ""
        found = self.request("GET", path + suffix) or {}
        items: list[dict[str, Any]] = found.get("items") or []
        return items

    def create_event(self, event: Mapping[str, Any]) -> dict[str, Any]:
        namespace = event["metadata"]["namespace"]
        created: dict[str, Any] = self.request("POST", f"/api/v1/namespaces/{namespace}/events", dict(event))
        return created

    def json_patch(self, path: str, operations: list[dict[str, Any]]) -> dict[str, Any]:
        patched: dict[str, Any] = self.request("PATCH", path, operations, content_type=JSON_PATCH)
        return patched
