"""argparse value types shared by the subcommands: environment names, bounded seconds, node counts, AWS
region names and [KEY=]URL overrides, each refused with a clear message (trainctl/flags.py declares the
flags that use them)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Collection

from infra.spec import get_environment
from infra.spec.errors import ConfigError
from trainctl.aws import ALL_SERVICES, SERVICES


def environment_name(text: str) -> str:
    """One of infra/spec's ENVIRONMENTS (the name; infra.spec.get_environment gives the Environment)."""
    try:
        get_environment(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(
            f"unknown environment {text!r}; known: {exc.allowed} (declared in infra/spec/environments.py)"
        ) from None
    return text


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


def keyed_url(keys: Collection[str], *, default: str, key_name: str) -> Callable[[str], tuple[str, str]]:
    """`URL` (for every key: `default`) or `KEY=URL` for one of `keys`; an http(s) URL either way."""

    def parse(text: str) -> tuple[str, str]:
        key, equals, url = text.partition("=")
        if not equals or key not in keys:
            key, url = default, text
        if not re.match(r"^https?://[^\s/]+", url):
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected URL or {key_name}=URL with {key_name} one of {', '.join(keys)} and an http(s) URL"
            )
        return key, url

    return parse


_REGION = re.compile(r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d$")


def region_name(text: str) -> str:
    """An AWS region name (us-east-2, us-gov-west-1, us-isob-east-1)."""
    if not _REGION.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an AWS region name (e.g. us-east-2)")
    return text


# --endpoint-url [SERVICE=]URL, in every command that talks to AWS.
aws_endpoint = keyed_url(SERVICES, default=ALL_SERVICES, key_name="SERVICE")
