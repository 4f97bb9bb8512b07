"""How the controller reads a gated pod's owners (fabric_controller/facts.py find_gang) where its Role grants them in
one namespace only (k8s/charts/fabric_gate.py OWNER_READS): an owner of a kind its namespace's Role does not grant
is refused with the reason at once, not retried on every poll."""

from __future__ import annotations

from typing import Any

import pytest

from fabric_controller.facts import find_gang
from training.kube_api import KubeError


class OnlyJobs:
    """The API server as the controller's training Role has it: Jobs and Workloads readable, ray.io forbidden."""

    def __init__(self, fail: int = 403) -> None:
        self.fail = fail
        self.paths: list[str] = []

    def get_or_none(self, path: str) -> dict[str, Any] | None:
        self.paths.append(path)
        if "/apis/ray.io/" in path:
            raise KubeError(f"GET {path}: HTTP {self.fail}", self.fail)
        return None

    def list_items(self, path: str, **_: str) -> list[dict[str, Any]]:
        return []


def pod(kind: str) -> dict[str, Any]:
    owner = {"apiVersion": "ray.io/v1", "kind": kind, "name": "c", "uid": "u", "controller": True}
    return {"metadata": {"name": "p", "namespace": "training", "ownerReferences": [owner]}}


def test_an_owner_the_namespace_role_does_not_grant_is_refused_with_the_reason() -> None:
    api = OnlyJobs()
    gang = find_gang(api, pod("RayCluster"))  # type: ignore[arg-type]
    assert gang is not None
    assert not gang.admitted
    assert (gang.namespace, gang.kind, gang.name) == ("training", "RayCluster", "c")
    assert "no gated RayCluster lives in namespace training" in gang.why
    assert api.paths == ["/apis/ray.io/v1/namespaces/training/rayclusters/c"]


def test_any_other_error_still_propagates_for_the_next_poll() -> None:
    with pytest.raises(KubeError, match="HTTP 500"):
        find_gang(OnlyJobs(fail=500), pod("RayCluster"))  # type: ignore[arg-type]
