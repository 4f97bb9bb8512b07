"""The training code ships as a ConfigMap (k8s/charts/ray.py TrainingCodeChart); two size limits apply to it.

- A client-side `kubectl apply` stores the whole object in the `kubectl.kubernetes.io/last-applied-configuration`
  annotation, and the API server refuses annotations over 262,144 bytes in total (apimachinery
  pkg/api/validation/objectmeta.go TotalAnnotationSizeLimitB = 256 KiB). Server-side apply keeps no such copy, so
  the docs apply with `--server-side`.
- A ConfigMap's data cannot exceed 1 MiB (Kubernetes docs, ConfigMaps; etcd's request limit): synth refuses it.
"""

from __future__ import annotations

import re
from pathlib import Path

import cdk8s
import pytest

from k8s.charts.ray import CONFIGMAP_DATA_LIMIT_BYTES, TrainingCodeChart, configmap_data_bytes
from k8s.ray_spec import WorkloadError
from rehearse.manifests import yaml_documents
from tests.conftest import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A command applying a file (prose such as "read as `kubectl apply -f` reads it" names no file).
APPLY = re.compile(r"kubectl\s+apply\s+(?:--?[a-z-]+(?:=\S+)?\s+)*-f\s+\S+\.ya?ml[^`\n]*")


def test_every_documented_kubectl_apply_is_server_side() -> None:
    applies = [(doc.name, m.group(0)) for doc in DOCS for m in APPLY.finditer(doc.read_text())]
    assert applies, "the docs show no kubectl apply at all"
    client_side = [(name, cmd) for name, cmd in applies if "--server-side" not in cmd]
    assert not client_side, f"client-side apply stores the object in a 256 KiB annotation: {client_side}"


def test_the_shipped_training_code_fits_a_configmap_with_room_to_grow(dist: Path) -> None:

    sizes = [
        configmap_data_bytes(obj["data"])
        for path in sorted(dist.glob("*/training-code.k8s.yaml"))
        for obj in yaml_documents(path.read_text())
        if obj and obj["kind"] == "ConfigMap"
    ]
    assert sizes
    assert max(sizes) < CONFIGMAP_DATA_LIMIT_BYTES


def test_a_training_package_over_the_configmap_limit_is_refused_naming_the_largest_files(tmp_path: Path) -> None:
    (tmp_path / "ray_finetune.py").write_text("print('hi')\n")
    (tmp_path / "big.py").write_text("#" * CONFIGMAP_DATA_LIMIT_BYTES)
    with pytest.raises(WorkloadError, match=r"training-code ConfigMap.*exceeds.*1048576.*big\.py"):
        TrainingCodeChart(cdk8s.Testing.app(), "code", package=tmp_path)
