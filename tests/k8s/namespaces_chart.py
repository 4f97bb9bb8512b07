"""The training namespaces' chart (k8s/charts/namespaces.py) synthesized once per test process (jsii is slow), for
the tests that read its objects: the Namespaces, their NetworkPolicies and the pod policy."""

from __future__ import annotations

import functools
import json
from typing import Any

import cdk8s

from infra.spec.namespaces import TRAINING_NAMESPACES
from k8s.charts.namespaces import NamespacesChart


@functools.cache
def _synthesized() -> str:
    chart = NamespacesChart(
        cdk8s.Testing.app(), "ns", environment="dev", namespaces=TRAINING_NAMESPACES, vpc_cidr="10.10.0.0/16"
    )
    return json.dumps(list(cdk8s.Testing.synth(chart)))


def namespaces_chart_objects() -> list[dict[str, Any]]:
    """Each caller gets its own copy."""
    loaded: list[dict[str, Any]] = json.loads(_synthesized())
    return loaded
