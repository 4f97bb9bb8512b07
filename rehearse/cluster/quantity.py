"""Kubernetes resource quantities as integers, shared by the scheduler and the Kueue emulator.

k8s.io/apimachinery pkg/api/resource (quantity.go): a signed decimal number (with an optional
exponent) and one suffix, binary (Ki..Ei), decimal SI (n, u, m, k, M..E) or none. Both consumers
count cpu in milli-units (Quantity.MilliValue) and everything else in whole units rounded up
(Quantity.Value); Kueue's resources.ResourceValue does the same. `format_quantity` writes a count back
the way Kueue's messages show it.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

_SUFFIXES = {
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?)(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?)$"
)


class QuantityError(ValueError):
    """Not a Kubernetes quantity (the API server would have refused the object)."""


def parse_quantity(text: str | int | float, *, milli: bool = False) -> int:
    """`text` as an integer: milli-units with `milli` (cpu), else whole units rounded up."""
    match = _QUANTITY.match(str(text).strip())
    if match is None:
        raise QuantityError(f"{text!r} is not a Kubernetes quantity (e.g. 500m, 8Gi, 4)")
    try:
        value = Decimal(match["number"]) * _SUFFIXES[match["suffix"]]
    except InvalidOperation as error:
        raise QuantityError(f"{text!r} is not a Kubernetes quantity") from error
    if milli:
        value *= 1000
    return math.ceil(value)


_BINARY_FORMAT = ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki")
_DECIMAL_FORMAT = ("E", "P", "T", "G", "M", "k")


def _decimal_si(value: int, milli: bool = False) -> str:
    if milli:
        if value % 1000:
            return f"{value}m"
        value //= 1000
    if value == 0:
        return "0"
    for power, suffix in zip(range(6, 0, -1), _DECIMAL_FORMAT, strict=True):
        if value % 10 ** (3 * power) == 0:
            return f"{value // 10 ** (3 * power)}{suffix}"
    return str(value)


def format_quantity(resource: str, value: int) -> str:
    """resources.ResourceFormatter.ResourceQuantity(...).String(): cpu as a milli quantity, memory,
    ephemeral-storage and hugepages in BinarySI (falling back to DecimalSI when not a multiple of
    1024), the rest DecimalSI."""
    if resource == "cpu":
        return _decimal_si(value, milli=True)
    if resource in ("memory", "ephemeral-storage") or resource.startswith("hugepages-"):
        if value == 0:
            return "0"
        for power, suffix in zip(range(6, 0, -1), _BINARY_FORMAT, strict=True):
            if value % 1024**power == 0:
                return f"{value // 1024**power}{suffix}"
    return _decimal_si(value)
