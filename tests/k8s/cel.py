"""A ValidatingAdmissionPolicy's CEL evaluated with cel-python (what the API server would answer), for the tests of
the fabric gate's node policy; each expression is compiled once (~0.2 s each)."""

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
