"""NetworkPolicies into a chart, from infra/spec/network_policies.py (the one builder CDK applies too)."""

from __future__ import annotations

from collections.abc import Iterable

import cdk8s
from constructs import Construct

from infra.spec.network_policies import PolicySpec


def add_policies(scope: Construct, policies: Iterable[PolicySpec]) -> None:
    """Each policy as an object of `scope`'s chart, in its own namespace, as the spec's builder writes it."""
    for policy in policies:
        manifest = policy.manifest()
        metadata = manifest["metadata"]
        cdk8s.ApiObject(
            scope,
            f"netpol-{policy.namespace}-{policy.name}",
            api_version=manifest["apiVersion"],
            kind=manifest["kind"],
            metadata=cdk8s.ApiObjectMetadata(
                name=metadata["name"], namespace=metadata["namespace"], annotations=metadata["annotations"]
            ),
        ).add_json_patch(cdk8s.JsonPatch.add("/spec", manifest["spec"]))
