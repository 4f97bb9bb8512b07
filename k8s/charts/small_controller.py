"""A platform controller that ships as source: its package and the modules it shares with the jobs in one ConfigMap,
its config in another, and a one-replica Deployment on the system nodes in a pinned small Python image, with a
ServiceAccount token of its own (k8s/charts/fabric_gate.py, k8s/charts/capacity_hold.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from constructs import Construct

from infra.spec.addon_pods import CONTROLLER_CPU, CONTROLLER_MEMORY
from infra.spec.scheduling import SYSTEM_NODE_SELECTOR
from k8s.charts.objects import api_object
from k8s.ray_spec import CONTAINER_SECURITY

ROOT = Path(__file__).resolve().parents[2]
# The controllers' own small Python image (k8s/images.lock.json): both run standard-library code only.
CONTROLLER_IMAGE = "fabric-gate-controller"
REQUESTS = {"cpu": CONTROLLER_CPU, "memory": CONTROLLER_MEMORY}
LIMITS = {"cpu": "200m", "memory": "128Mi"}


def source_code(sources: Sequence[str]) -> dict[str, str]:
    """Each source file under a ConfigMap key (DIR--FILE: a key holds no slash); the pod's volume maps it back."""
    return {path.replace("/", "--"): (ROOT / path).read_text() for path in sources}


def small_controller(
    scope: Construct,
    *,
    name: str,
    namespace: str,
    image: str,
    module: str,
    code_root: str,
    sources: Sequence[str],
    config: Mapping[str, Any],
    ack: str,
) -> None:
    """`python -m MODULE --config CODE_ROOT/config/config.json` as Deployment `name` with ServiceAccount `name`; its
    code in ConfigMap `name`-code, its config in `name`-config (the ServiceAccount and its power: the caller's)."""
    code = source_code(sources)
    api_object(scope, "code", "v1", "ConfigMap", f"{name}-code", namespace, data=code)
    data = {"config.json": json.dumps(dict(config), indent=2, sort_keys=True)}
    api_object(scope, "config", "v1", "ConfigMap", f"{name}-config", namespace, data=data)
    items = [{"key": key, "path": key.replace("--", "/")} for key in sorted(code)]
    labels = {"app.kubernetes.io/name": name}
    container = {
        "name": "controller",
        "image": image,
        "command": ["python", "-m", module, "--config", f"{code_root}/config/config.json"],
        "workingDir": f"{code_root}/code",
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}, {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
        "resources": {"requests": dict(REQUESTS), "limits": dict(LIMITS)},
        "securityContext": {**CONTAINER_SECURITY, "readOnlyRootFilesystem": True, "runAsNonRoot": True},
        "volumeMounts": [
            {"name": "code", "mountPath": f"{code_root}/code", "readOnly": True},
            {"name": "config", "mountPath": f"{code_root}/config", "readOnly": True},
        ],
    }
    pod = {
        "serviceAccountName": name,
        "automountServiceAccountToken": True,
        "nodeSelector": dict(SYSTEM_NODE_SELECTOR),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "runAsGroup": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            {"name": "code", "configMap": {"name": f"{name}-code", "items": items}},
            {"name": "config", "configMap": {"name": f"{name}-config"}},
        ],
    }
    spec = {
        "replicas": 1,
        # One writer at a time: the old pod is gone before the new one polls.
        "strategy": {"type": "Recreate"},
        "selector": {"matchLabels": labels},
        "template": {"metadata": {"labels": labels}, "spec": pod},
    }
    # checkov's CKV_K8S_38 asks why a token is mounted: this one is the controller's own, and it is what it is for.
    annotations = {"checkov.io/skip1": ack}
    api_object(scope, "deployment", "apps/v1", "Deployment", name, namespace, annotations=annotations, spec=spec)
