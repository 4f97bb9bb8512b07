"""One snapshot per environment of everything cdk8s writes to dist/<env>/ (synthesized once per session
with the check lock: unpinned images get placeholder digests, see k8s/check_lock.py).

Every file is snapshotted byte for byte, except the training-code ConfigMaps: their data is the
source of training/*.py, which changes with every training edit. There the snapshot keeps the
objects and the list of shipped files, and the content is checked against training/ instead.

After an intended manifest change: python -m pytest tests/k8s/test_manifest_snapshots.py --snapshot-update,
and review the diff of tests/k8s/__snapshots__/ like code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from syrupy.assertion import SnapshotAssertion

from infra.spec import ENVIRONMENTS
from k8s.charts.ray import TRAINING_PACKAGE
from k8s.main import synth_all
from rehearse.manifests import yaml_documents

CODE_FILE = "training-code.k8s.yaml"


def _code_placeholder(name: str) -> str:
    return f"<the text of training/{name}; checked against the file, not snapshotted>"


def manifests(directory: Path) -> dict[str, str]:
    """File name -> text, with the training code replaced by placeholders (after checking it)."""
    files = {p.name: p.read_text() for p in sorted(directory.iterdir()) if p.is_file()}
    if CODE_FILE in files:
        sources = {p.name: p.read_text() for p in sorted(TRAINING_PACKAGE.glob("*.py"))}
        documents: list[dict[str, Any]] = [d for d in yaml_documents(files[CODE_FILE]) if d]
        # Each namespace's ConfigMaps together (the fabric tools ship in one of their own) carry training/*.py.
        shipped: dict[str, dict[str, str]] = {}
        for document in documents:
            shipped.setdefault(document["metadata"]["namespace"], {}).update(document["data"])
        for namespace, data in shipped.items():
            assert data == sources, f"the code ConfigMaps of {namespace}: it does not carry training/*.py as they are"
        for document in documents:
            document["data"] = {key: _code_placeholder(key) for key in document["data"]}
        files[CODE_FILE] = yaml.safe_dump_all(documents, sort_keys=False)
    return files


@pytest.mark.parametrize("environment", sorted(ENVIRONMENTS))
def test_manifests_snapshot(dist: Path, environment: str, snapshot: SnapshotAssertion) -> None:
    found = manifests(dist / environment)
    assert found, f"cdk8s wrote nothing for {environment}"
    assert found == snapshot


def test_snapshot_input_is_stable_across_runs(dist: Path, tmp_path: Path) -> None:
    """A second synthesis (a fresh process state: new cdk8s Apps) gives the same snapshot input."""
    from k8s.check_lock import check_lock
    from k8s.images import ImageLock

    synth_all(tmp_path, check_lock(ImageLock.load()))
    for environment in ENVIRONMENTS:
        assert manifests(tmp_path / environment) == manifests(dist / environment)


def test_changed_training_code_is_caught(dist: Path, tmp_path: Path) -> None:
    """The placeholder hides the code from the snapshot, never a ConfigMap that differs from training/."""
    environment = sorted(ENVIRONMENTS)[0]
    copy = tmp_path / environment
    copy.mkdir()
    for path in (dist / environment).iterdir():
        (copy / path.name).write_text(path.read_text())
    text = (copy / CODE_FILE).read_text()
    (copy / CODE_FILE).write_text(text.replace("  __init__.py: |\n", "  __init__.py: |\n    # edited\n", 1))
    with pytest.raises(AssertionError, match="does not carry training"):
        manifests(copy)
