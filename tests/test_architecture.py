"""The architecture pictures under docs/ are drawn from infra/spec: the committed DOT source must be
what the spec gives now (the graph source is compared, never pixels)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from infra.spec import ENVIRONMENTS, AddOnsConfig, get_environment
from infra.spec.addressing import subnet_plan
from infra.spec.endpoints import INTERFACE_ENDPOINTS

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOTS = ROOT / "tests/infra/__snapshots__/test_stability"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("architecture", ROOT / "scripts/architecture.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["architecture"] = module
    spec.loader.exec_module(module)
    return module


architecture = _load()


@pytest.mark.parametrize("env_name", sorted(ENVIRONMENTS))
def test_committed_dot_matches_the_spec(env_name: str) -> None:
    committed = ROOT / f"docs/architecture-{env_name}.dot"
    assert committed.is_file(), f"{committed} is missing; create it with {architecture.REFRESH}"
    expected = architecture.architecture_dot(ENVIRONMENTS[env_name])
    assert committed.read_text() == expected, (
        f"docs/architecture-{env_name}.dot no longer matches infra/spec; refresh it with {architecture.REFRESH} "
        "and commit the .dot and .png"
    )


@pytest.mark.parametrize("env_name", sorted(ENVIRONMENTS))
def test_committed_png_exists(env_name: str) -> None:
    png = ROOT / f"docs/architecture-{env_name}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _snapshot_subnets(env_name: str) -> dict[str, dict[str, str]]:
    """AZ -> {public, private} CIDR from the committed (synthesized) template snapshot."""
    document = json.loads((SNAPSHOTS / f"test_template_snapshot[{env_name}].json").read_text())
    found: dict[str, dict[str, str]] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("Type") == "AWS::EC2::Subnet":
                props = node["Properties"]
                kind = next(t["Value"] for t in props["Tags"] if t["Key"] == "aws-cdk:subnet-name")
                found.setdefault(props["AvailabilityZone"], {})[kind] = props["CidrBlock"]
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(document)
    return found


@pytest.mark.parametrize("env_name", sorted(ENVIRONMENTS))
def test_subnet_plan_is_what_cdk_allocates(env_name: str) -> None:
    plan = subnet_plan(ENVIRONMENTS[env_name].network)
    expected = {az: (cidrs["public"], cidrs["private"]) for az, cidrs in _snapshot_subnets(env_name).items()}
    assert plan == expected


@pytest.mark.parametrize("env_name", sorted(ENVIRONMENTS))
def test_nat_gateways_are_where_the_picture_puts_them(env_name: str) -> None:
    # aws-cdk-lib puts the NAT gateways in the first `nat_gateways` public subnets, in AZ order.
    resources = json.loads((SNAPSHOTS / f"test_template_snapshot[{env_name}].json").read_text())["Platform"][
        "Resources"
    ]
    nat_zones = sorted(
        resources[r["Properties"]["SubnetId"]["Ref"]]["Properties"]["AvailabilityZone"]
        for r in resources.values()
        if r["Type"] == "AWS::EC2::NatGateway"
    )
    env = ENVIRONMENTS[env_name]
    assert nat_zones == sorted(env.network.availability_zones[: env.network.nat_gateways])
    dot = architecture.architecture_dot(env)
    for az in env.network.availability_zones:
        public = subnet_plan(env.network)[az][0]
        expected = "NAT gateway" if az in nat_zones else f"no NAT gateway (egress via {nat_zones[0]})"
        assert f"public subnet {public}\\l{expected}\\l" in dot


def test_subnet_plan_aligns_each_block_to_its_size() -> None:
    network = dataclasses.replace(
        ENVIRONMENTS["prod"].network, public_subnet_prefix=24, private_subnet_prefix=20, cidr="10.30.0.0/16"
    )
    assert subnet_plan(network) == {
        "us-east-2a": ("10.30.0.0/24", "10.30.16.0/20"),
        "us-east-2b": ("10.30.1.0/24", "10.30.32.0/20"),
        "us-east-2c": ("10.30.2.0/24", "10.30.48.0/20"),
    }


def test_stacks_are_the_stages_stacks(assembly: dict[str, Any], env_name: str) -> None:
    built = {stack.id: stack.name for stack in assembly[env_name].values()}
    assert architecture.stacks(ENVIRONMENTS[env_name]) == built
    dot = architecture.architecture_dot(ENVIRONMENTS[env_name])
    for stack_id, name in built.items():
        assert f"{env_name}/{stack_id}<BR/>{name}" in dot


def test_network_builds_the_spec_endpoints() -> None:
    from infra.network import INTERFACE_ENDPOINTS as BUILT

    assert {name: service.short_name for name, service in BUILT.items()} == dict(INTERFACE_ENDPOINTS)


def test_picture_shows_the_spec_facts() -> None:
    prod = architecture.architecture_dot(get_environment("prod"))
    dev = architecture.architecture_dot(get_environment("dev"))
    assert "p5.48xlarge: 8 x NVIDIA H100 80 GB" in prod
    assert "EFA: 32 interfaces per node" in prod
    assert "EFA: 1 interface per node" in prod  # g6
    for env_name, dot in (("dev", dev), ("prod", prod)):
        storage = get_environment(env_name).add_ons.checkpoint_storage
        assert ("FSx for Lustre" in dot) is (storage is not None)
        if storage is not None:
            assert f"{storage.deployment.value}, {storage.storage_capacity_gib} GiB" in dot
    assert prod.count("NAT gateway\\l") == 3
    assert dev.count("NAT gateway\\l") == 1
    assert "no NAT gateway (egress via us-west-2a)" in dev
    assert '"ray-head" -> "system"' in dev
    assert '"ray-workers-g6" -> "gpu-g6"' in dev
    assert '"nvrx" -> "gpu-p5"' in prod  # the NVRx job's default group: the first one
    for service in INTERFACE_ENDPOINTS.values():
        assert service in dev


def test_a_spec_change_changes_the_picture() -> None:
    prod = get_environment("prod")
    fewer = dataclasses.replace(prod.gpu_node_groups[0], efa_interfaces=16)
    changed = dataclasses.replace(prod, gpu_node_groups=(fewer, *prod.gpu_node_groups[1:]))
    before, after = architecture.architecture_dot(prod), architecture.architecture_dot(changed)
    assert before != after
    assert "EFA: 16 interfaces per node" in after


def test_check_mode_names_stale_pictures_and_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert architecture.main(["--out", str(tmp_path)]) == 0
    assert architecture.main(["--out", str(tmp_path), "--check"]) == 0
    (tmp_path / "architecture-dev.dot").write_text("digraph {}\n")
    assert architecture.main(["--out", str(tmp_path), "--check"]) == 1
    err = capsys.readouterr().err
    assert "stale architecture pictures: dev" in err
    assert "make docs" in err


def test_every_add_on_switch_is_drawn() -> None:
    switches = {f.name for f in dataclasses.fields(AddOnsConfig) if isinstance(getattr(AddOnsConfig(), f.name), bool)}
    missing = switches - set(architecture.ADDON_SWITCHES)
    assert not missing, (
        f"add the AddOnsConfig switch(es) {sorted(missing)} to ADDON_SWITCHES in scripts/architecture.py"
    )
