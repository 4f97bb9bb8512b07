"""Fabric environment profiles, derived from the instance facts."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.spec.instances import INSTANCE_TYPES
from k8s.fabric_env import OFI_NETWORK_NAME, FabricProfile, fabric_env
from rehearse.manifests import yaml_documents
from tests.conftest import ROOT

P5 = INSTANCE_TYPES["p5.48xlarge"]
G6 = INSTANCE_TYPES["g6.12xlarge"]


@pytest.mark.parametrize("instance", [P5, G6], ids=lambda i: i.name)
def test_efa_profile_forces_the_plugin_network(instance: object) -> None:
    env = fabric_env(instance)  # type: ignore[arg-type]
    assert env["NCCL_NET"] == OFI_NETWORK_NAME == "AWS Libfabric"
    assert env["NCCL_NET_PLUGIN"] == "ofi"
    assert env["FI_PROVIDER"] == "efa"
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env["NCCL_DEBUG"] == "INFO"
    assert "INIT" in env["NCCL_DEBUG_SUBSYS"]
    assert "NET" in env["NCCL_DEBUG_SUBSYS"]


def test_gpudirect_rdma_only_where_the_instance_has_it() -> None:
    assert fabric_env(P5)["FI_EFA_USE_DEVICE_RDMA"] == "1"
    # Written out as 0 on g6: libfabric aborts ("device has no rdma-read capability") when an image default of 1
    # meets a device without RDMA read, so nothing is left to the image.
    assert fabric_env(G6)["FI_EFA_USE_DEVICE_RDMA"] == "0"
    assert fabric_env(INSTANCE_TYPES["p4d.24xlarge"])["FI_EFA_USE_DEVICE_RDMA"] == "1"


def test_tcp_baseline_is_explicitly_sockets() -> None:
    env = fabric_env(G6, FabricProfile.TCP_BASELINE)
    assert env["NCCL_NET"] == "Socket"
    assert env["NCCL_NET_PLUGIN"] == "none"
    assert env["FI_PROVIDER"] == "tcp"
    assert "FI_EFA_USE_DEVICE_RDMA" not in env


def test_profiles_never_leave_the_network_to_chance() -> None:
    for instance in (P5, G6):
        for profile in FabricProfile:
            assert "NCCL_NET" in fabric_env(instance, profile)


def test_efa_profile_refused_on_an_instance_without_efa() -> None:
    with pytest.raises(ValueError, match=r"m7i\.xlarge has no EFA"):
        fabric_env(INSTANCE_TYPES["m7i.xlarge"])


def _orders() -> list[str]:
    """Each instance and profile with fabric_env's variable names in the order it gives them."""
    pairs = [(i, p) for i in (P5, G6) for p in FabricProfile]
    return [f"{i.name} {p.value}: {' '.join(fabric_env(i, p))}" for i, p in pairs]


def test_order_is_the_same_whatever_the_hash_seed() -> None:
    """The manifests list the variables in fabric_env's order (k8s/ray_spec.py env_list), so that order must not
    depend on the process: built from a set anywhere, it would follow PYTHONHASHSEED and reorder every container's
    env from one synth to the next. Fresh interpreters with different seeds give the order this one does."""
    program = "from tests.k8s.test_fabric_env import _orders\nprint('\\n'.join(_orders()))"
    here = _orders()
    for seed in ("0", "1", "2", "3"):
        done = subprocess.run(
            [sys.executable, "-c", program],
            cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == here, f"PYTHONHASHSEED={seed}"


@pytest.mark.parametrize("instance", [P5, G6], ids=lambda i: i.name)
def test_efa_profile_turns_libfabric_huge_pages_off(instance: object) -> None:
    # The pods request no hugepages-2Mi (issue 22 finding 8): the EFA provider's bounce buffers then come from
    # ordinary pages, said explicitly so that no image default or node reservation decides it.
    assert fabric_env(instance)["FI_EFA_USE_HUGE_PAGE"] == "0"  # type: ignore[arg-type]
    assert "FI_EFA_USE_HUGE_PAGE" not in fabric_env(instance, FabricProfile.TCP_BASELINE)  # type: ignore[arg-type]


def test_no_workload_requests_hugepages_and_every_efa_container_turns_them_off(dist: Path) -> None:
    """Every container that requests an EFA device runs with FI_EFA_USE_HUGE_PAGE=0, and none requests
    hugepages-*: the ClusterQueues and the rehearsal's node model then have nothing of them to count."""
    efa_containers = 0
    for path in sorted(dist.rglob("*.yaml")):
        for obj in yaml_documents(path.read_text()):
            for container in _containers(obj):
                resources = container.get("resources") or {}
                amounts = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
                assert not [r for r in amounts if r.startswith("hugepages-")], (path.name, container.get("name"))
                if "vpc.amazonaws.com/efa" in amounts:
                    efa_containers += 1
                    env = {e["name"]: e.get("value") for e in container.get("env") or []}
                    assert env.get("FI_EFA_USE_HUGE_PAGE") == "0", (path.name, container.get("name"))
    assert efa_containers >= 4


def _containers(obj: Any) -> Iterator[dict[str, Any]]:
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                yield from (c for c in value if isinstance(c, dict))
            else:
                yield from _containers(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from _containers(value)
