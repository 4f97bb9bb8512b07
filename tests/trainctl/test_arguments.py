"""The shared argparse types: a bad value is refused by argparse (exit 2) naming the value and the bound."""

from __future__ import annotations

import argparse

import pytest

from trainctl.arguments import aws_endpoint, node_count, region_name, seconds
from trainctl.cli import main


def test_node_count_bounds() -> None:
    assert node_count(0)("0") == 0
    assert node_count(1)("8") == 8
    with pytest.raises(argparse.ArgumentTypeError, match="'0': expected at least 1 node"):
        node_count(1)("0")
    with pytest.raises(argparse.ArgumentTypeError, match="'-1': expected 0 or more nodes"):
        node_count(0)("-1")
    with pytest.raises(argparse.ArgumentTypeError, match="'two' is not a whole number"):
        node_count(0)("two")


def test_seconds_bounds() -> None:
    assert seconds(10)("2.5") == 2.5
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected seconds in \(0, 10\]"):
        seconds(10)("11")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["capacity", "--env", "prod", "--nodes", "0"], "expected at least 1 node"),
        (["scale", "--env", "prod", "--group", "p5", "--nodes", "-1"], "expected 0 or more nodes"),
    ],
)
def test_the_cli_refuses_a_bad_node_count(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_keyed_url_overrides() -> None:
    assert aws_endpoint("http://127.0.0.1:5000") == ("*", "http://127.0.0.1:5000")
    assert aws_endpoint("ec2=http://127.0.0.1:5000") == ("ec2", "http://127.0.0.1:5000")
    with pytest.raises(argparse.ArgumentTypeError, match="expected URL or SERVICE=URL with SERVICE one of ec2, "):
        aws_endpoint("ec2=ftp://x")


def test_region_names() -> None:
    for name in ("us-east-2", "eu-central-1", "us-gov-west-1", "us-isob-east-1"):
        assert region_name(name) == name
    for bad in ("", "us-east", "US-EAST-2", "us_east_2", "useast2"):
        with pytest.raises(argparse.ArgumentTypeError, match="is not an AWS region name"):
            region_name(bad)
