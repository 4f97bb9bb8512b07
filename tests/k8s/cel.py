"""A ValidatingAdmissionPolicy's CEL evaluated with cel-python (what the API server would answer), for the tests of
the fabric gate's node policy and of the workload namespaces' pod policy; each expression is compiled once."""

from __future__ import annotations

import functools
from typing import Any

import celpy
from celpy.adapter import json_to_cel


@functools.cache
def program(expression: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(expression))


def denied(policy: dict[str, Any], old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The messages of the policy's validations that fail for this update of `old` to `new`."""
    activation = {"object": json_to_cel(new), "oldObject": json_to_cel(old)}
    return [
        v["message"] for v in policy["spec"]["validations"] if not bool(program(v["expression"]).evaluate(activation))
    ]


def request_denied(
    policy: dict[str, Any],
    obj: dict[str, Any],
    *,
    old: dict[str, Any] | None = None,
    operation: str = "CREATE",
    sub_resource: str = "",
) -> list[str]:
    """The messages of the validations that fail for this request, after its matchConditions: none when a condition
    leaves the request alone."""
    request = {"operation": operation, "subResource": sub_resource}
    activation = {"object": json_to_cel(obj), "oldObject": json_to_cel(old), "request": json_to_cel(request)}
    spec = policy["spec"]
    if not all(bool(program(c["expression"]).evaluate(activation)) for c in spec.get("matchConditions") or []):
        return []
    return [v["message"] for v in spec["validations"] if not bool(program(v["expression"]).evaluate(activation))]
