"""rehearse/cluster/quantity.py: the one quantity parser behind the scheduler and the Kueue emulator."""

from __future__ import annotations

import pytest

from rehearse.cluster.kueue import KueueError, quantity_value
from rehearse.cluster.quantity import QuantityError, format_quantity, parse_quantity
from rehearse.cluster.scheduler import UnsupportedPodError, quantity

GI = 2**30


@pytest.mark.parametrize(
    ("text", "milli", "value"),
    [
        ("2", True, 2000),
        ("500m", True, 500),
        ("0.1", True, 100),
        (2, True, 2000),
        ("1.5", True, 1500),
        ("8Gi", False, 8 * GI),
        ("1G", False, 10**9),
        ("1.5Mi", False, 1572864),
        ("1k", False, 1000),
        ("1e3", False, 1000),
        (".5", False, 1),  # whole units round up, as Quantity.Value does
        ("100m", False, 1),
        ("1n", True, 1),
    ],
)
def test_quantities_as_the_apiserver_reads_them(text: str | int, milli: bool, value: int) -> None:
    assert parse_quantity(text, milli=milli) == value


@pytest.mark.parametrize(
    ("resource", "text", "value", "shown"),
    [
        ("cpu", "500m", 500, "500m"),
        ("cpu", "1.5", 1500, "1500m"),
        ("cpu", "40", 40000, "40"),
        ("cpu", 2, 2000, "2"),
        ("memory", "8Gi", 8 * GI, "8Gi"),
        ("memory", "512Mi", 512 * 2**20, "512Mi"),
        ("memory", "1k", 1000, "1k"),
        ("nvidia.com/gpu", "4", 4, "4"),
        ("hugepages-2Mi", "5120Mi", 5120 * 2**20, "5Gi"),
    ],
)
def test_kueue_counts_and_shows_quantities(resource: str, text: str | int, value: int, shown: str) -> None:
    assert quantity_value(resource, text) == value
    assert format_quantity(resource, value) == shown


def test_both_consumers_read_every_quantity_the_same_way() -> None:
    for text in ("500m", "40", "160Gi", "1.5Mi", "3", "0.25", "2e2", "+1Ki"):
        for resource in ("cpu", "memory"):
            assert quantity(text, milli=resource == "cpu") == quantity_value(resource, text)


@pytest.mark.parametrize("text", ["8 GB", "1.2.3", "Gi", "", "1Gb", "--1"])
def test_a_bad_quantity_is_refused_by_each_consumer_with_its_own_error(text: str) -> None:
    with pytest.raises(QuantityError, match="is not a Kubernetes quantity"):
        parse_quantity(text)
    with pytest.raises(KueueError, match=r"^memory: .* is not a Kubernetes quantity"):
        quantity_value("memory", text)
    with pytest.raises(UnsupportedPodError, match=r"^quantity .* is not a Kubernetes quantity"):
        quantity(text)
