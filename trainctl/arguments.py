"""argparse value types shared by the subcommands: bounded seconds with a clear message."""

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
