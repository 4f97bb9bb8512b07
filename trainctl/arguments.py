"""argparse value types shared by the subcommands: bounded seconds and node counts with a clear message."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def seconds(upper: float) -> Callable[[str], float]:
    """A type for flags in seconds, accepting (0, upper]."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not 0 < value <= upper:
            raise argparse.ArgumentTypeError(f"{text!r}: expected seconds in (0, {upper:g}]")
        return value

    return parse


def node_count(minimum: int) -> Callable[[str], int]:
    """A number of nodes, at least `minimum` (capacity asks about 1 or more, scale may go to 0)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            wanted = "at least 1 node" if minimum == 1 else f"{minimum} or more nodes"
            raise argparse.ArgumentTypeError(f"{text!r}: expected {wanted}")
        return value

    return parse
