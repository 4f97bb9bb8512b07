"""A validator of CloudWatch embedded metric format documents, from "Specification: Embedded metric
format" (CloudWatch user guide, CloudWatch_Embedded_Metric_Format_Specification.html).

The JSON schema covers the structure (root `_aws` with `Timestamp` in ms and `CloudWatchMetrics`
directives of Namespace, Dimensions as arrays of dimension sets of at most 30 names, Metrics as
objects of Name and optional Unit/StorageResolution, at most 100, no other members); `validate` adds
what a schema cannot say: each referenced dimension is a string member at the root, each metric a
number (or an array of at most 100 numbers) at the root, and the timestamp is near now.
"""

from __future__ import annotations

import time
from typing import Any

import jsonschema

from training.emf import UNITS

NAME = {"type": "string", "minLength": 1, "maxLength": 255}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["_aws"],
    "properties": {
        "_aws": {
            "type": "object",
            "required": ["Timestamp", "CloudWatchMetrics"],
            "additionalProperties": False,
            "properties": {
                "Timestamp": {"type": "integer", "minimum": 0},
                "CloudWatchMetrics": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["Namespace", "Dimensions", "Metrics"],
                        "additionalProperties": False,
                        "properties": {
                            "Namespace": {"type": "string", "minLength": 1, "maxLength": 1024},
                            "Dimensions": {
                                "type": "array",
                                "items": {"type": "array", "maxItems": 30, "items": NAME},
                            },
                            "Metrics": {
                                "type": "array",
                                "maxItems": 100,
                                "items": {
                                    "type": "object",
                                    "required": ["Name"],
                                    "additionalProperties": False,
                                    "properties": {
                                        "Name": {"type": "string", "minLength": 1, "maxLength": 1024},
                                        "Unit": {"enum": sorted(UNITS)},
                                        "StorageResolution": {"enum": [1, 60]},
                                    },
                                },
                            },
                        },
                    },
                },
            },
        }
    },
}


def validate(doc: dict[str, Any], *, now_ms: int | None = None) -> None:
    """Raises jsonschema.ValidationError or ValueError naming what is wrong."""
    jsonschema.validate(doc, SCHEMA)
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    # CloudWatch accepts metric data from two weeks back to two hours ahead.
    if not now_ms - 14 * 86400_000 <= doc["_aws"]["Timestamp"] <= now_ms + 2 * 3600_000:
        raise ValueError(f"_aws.Timestamp {doc['_aws']['Timestamp']} is not milliseconds near now ({now_ms})")
    for directive in doc["_aws"]["CloudWatchMetrics"]:
        for dimension_set in directive["Dimensions"]:
            for name in dimension_set:
                value = doc.get(name)
                if not isinstance(value, str) or not 1 <= len(value) <= 1024:
                    raise ValueError(f"dimension {name}: root member must be a 1-1024 character string, got {value!r}")
        for metric in directive["Metrics"]:
            value = doc.get(metric["Name"])
            values = value if isinstance(value, list) else [value]
            if not 1 <= len(values) <= 100 or not all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in values
            ):
                raise ValueError(
                    f"metric {metric['Name']}: root member must be a number or 1-100 numbers, got {value!r}"
                )
