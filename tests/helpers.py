"""Small helpers for walking synthesized templates."""

from __future__ import annotations

from typing import Any


def of_type(template_json: dict[str, Any], cfn_type: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in template_json["Resources"].items() if v["Type"] == cfn_type}


def only(template_json: dict[str, Any], cfn_type: str) -> tuple[str, dict[str, Any]]:
    found = of_type(template_json, cfn_type)
    assert len(found) == 1, f"expected one {cfn_type}, found {sorted(found)}"
    return next(iter(found.items()))
