"""Bad input is refused on construction, with the field, the value and what is allowed."""

from __future__ import annotations

import dataclasses
import math

import pytest

from infra.spec import (
    ENVIRONMENTS,
    Capacity,
    CapacityKind,
    ClusterConfig,
    ConfigError,
    EndpointAccess,
    GpuNodeGroupConfig,
    NetworkConfig,
    Scaling,
    SystemNodeGroupConfig,
    get_environment,
)
from infra.spec.addressing import addresses_per_node, gpu_zone_demand, max_pods
from infra.spec.environments import LOG_RETENTION_DAYS
from infra.spec.instances import INSTANCE_TYPES, InstanceType
from infra.spec.namespaces import NamespaceSpec

DEV = ENVIRONMENTS["dev"]
PROD = ENVIRONMENTS["prod"]


def network(**overrides: object) -> NetworkConfig:
    fields = {
        "cidr": "10.10.0.0/16",
        "availability_zones": ("us-west-2a", "us-west-2b"),
        "nat_gateways": 1,
    }
    fields.update(overrides)
    return NetworkConfig(**fields)  # type: ignore[arg-type]


def test_unknown_environment_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as err:
        get_environment("staging")
    message = str(err.value)
    assert "env='staging'" in message
    assert "dev, prod" in message
    assert "-c env=" in message


@pytest.mark.parametrize(
    ("cidr", "reason"),
    [
        ("10.10.0.0/33", "CIDR form"),
        ("10.10.0.1/16", "host bits set"),
        ("not-a-cidr", "CIDR form"),
        ("10.0.0.0/8", "/16 to /24"),
        ("8.8.0.0/16", "private range"),
    ],
)
def test_invalid_cidr(cidr: str, reason: str) -> None:
    with pytest.raises(ConfigError) as err:
        network(cidr=cidr)
    assert f"network.cidr={cidr!r}" in str(err.value)
    assert reason in str(err.value)


def test_subnets_that_do_not_fit_the_vpc() -> None:
    with pytest.raises(
        ConfigError, match=r"network.private_subnet_prefix=17 .*need 65664 addresses but 10.10.0.0/16 has 65536"
    ):
        network(cidr="10.10.0.0/16", private_subnet_prefix=17, availability_zones=("us-west-2a", "us-west-2b"))


@pytest.mark.parametrize(
    ("sizes", "field"),
    [
        ((3, 2, 4), "desired_size=2"),  # min > desired
        ((1, 5, 4), "desired_size=5"),  # desired > max
        ((-1, 0, 1), "min_size=-1"),
        ((0, 0, 0), "max_size=0"),
    ],
)
def test_scaling_order(sizes: tuple[int, int, int], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        Scaling(min_size=sizes[0], desired_size=sizes[1], max_size=sizes[2])
    assert field in str(err.value)
    if field.startswith("desired"):
        assert "min_size" in str(err.value)
        assert "max_size" in str(err.value)


def test_more_nat_gateways_than_zones() -> None:
    with pytest.raises(ConfigError) as err:
        network(nat_gateways=3)
    assert "network.nat_gateways=3" in str(err.value)
    assert "1 to 2" in str(err.value)


def test_zero_nat_gateways_refused() -> None:
    # Private subnets need egress: pulling images from public registries goes through NAT.
    with pytest.raises(ConfigError, match=r"network.nat_gateways=0"):
        network(nat_gateways=0)


def test_one_availability_zone_refused() -> None:
    with pytest.raises(ConfigError, match=r"at least 2 zones"):
        network(availability_zones=("us-west-2a",), nat_gateways=1)


def test_log_retention_must_be_a_cloudwatch_value() -> None:
    with pytest.raises(ConfigError, match=r"network.flow_log_retention_days=31"):
        network(flow_log_retention_days=31)


def test_zones_must_belong_to_the_region() -> None:
    with pytest.raises(ConfigError) as err:
        dataclasses.replace(DEV, region="eu-west-1")
    assert "network.availability_zones='us-west-2a'" in str(err.value)
    assert "eu-west-1a" in str(err.value)


def test_gpu_zone_must_be_one_of_the_vpc_zones() -> None:
    with pytest.raises(ConfigError, match=r"gpu_availability_zone='us-west-2c'"):
        dataclasses.replace(DEV, gpu_availability_zone="us-west-2c")


def test_account_must_be_twelve_digits() -> None:
    with pytest.raises(ConfigError, match=r"account='12345'"):
        dataclasses.replace(DEV, account="12345")


def test_private_endpoint_takes_no_public_cidrs() -> None:
    with pytest.raises(ConfigError, match=r"cluster.public_access_cidrs"):
        ClusterConfig(name="c", admin_principals=("Admin",), public_access_cidrs=("203.0.113.0/24",))


@pytest.mark.parametrize("cidr", ["0.0.0.0/0", "::/0"])
def test_open_public_endpoint_refused(cidr: str) -> None:
    with pytest.raises(ConfigError) as err:
        ClusterConfig(
            name="c",
            admin_principals=("Admin",),
            endpoint_access=EndpointAccess.PUBLIC_AND_PRIVATE,
            public_access_cidrs=(cidr,),
        )
    assert f"cluster.public_access_cidrs={cidr!r}" in str(err.value)
    assert "open API endpoint is refused" in str(err.value)


def test_public_endpoint_needs_an_allow_list() -> None:
    with pytest.raises(ConfigError, match=r"at least one CIDR"):
        ClusterConfig(name="c", admin_principals=("Admin",), endpoint_access=EndpointAccess.PUBLIC_AND_PRIVATE)


@pytest.mark.parametrize("principal", ["*", "arn:aws:iam::123456789012:role/*", "arn:aws:iam::*:role/Admin", ""])
def test_admin_principal_wildcards_refused(principal: str) -> None:
    with pytest.raises(ConfigError, match=r"cluster.admin_principals"):
        ClusterConfig(name="c", admin_principals=(principal,))


def test_admin_principals_required() -> None:
    with pytest.raises(ConfigError, match=r"at least one IAM role"):
        ClusterConfig(name="c")


def test_admin_principal_forms_accepted() -> None:
    config = ClusterConfig(name="c", admin_principals=("PlatformAdmin", "arn:aws:iam::123456789012:user/ops"))
    assert config.admin_principals == ("PlatformAdmin", "arn:aws:iam::123456789012:user/ops")


def test_unknown_instance_type_lists_known_ones() -> None:
    with pytest.raises(ConfigError) as err:
        GpuNodeGroupConfig(name="x", instance_type="p9.mega", scaling=Scaling(min_size=0, desired_size=0, max_size=1))
    assert "gpu_node_groups[x].instance_type='p9.mega'" in str(err.value)
    assert "p5.48xlarge" in str(err.value)


def test_gpu_group_needs_gpu_and_efa() -> None:
    with pytest.raises(ConfigError, match=r"GPU groups need an instance type with GPUs and EFA"):
        GpuNodeGroupConfig(
            name="x", instance_type="m7i.xlarge", scaling=Scaling(min_size=0, desired_size=0, max_size=1)
        )


def test_system_group_refuses_gpu_instances() -> None:
    with pytest.raises(ConfigError, match=r"system_nodes.instance_type='g6.12xlarge'"):
        SystemNodeGroupConfig(instance_type="g6.12xlarge", scaling=Scaling(min_size=1, desired_size=1, max_size=1))


def test_duplicate_gpu_group_names_refused() -> None:
    with pytest.raises(ConfigError, match=r"distinct group names"):
        dataclasses.replace(PROD, gpu_node_groups=(PROD.gpu_node_groups[0], PROD.gpu_node_groups[0]))


def test_pod_security_warn_must_not_be_laxer_than_enforce() -> None:
    with pytest.raises(ConfigError, match=r"namespaces\[x\].warn='baseline'"):
        NamespaceSpec(name="x", purpose="", enforce="restricted", warn="baseline")


def test_privileged_is_enforced_only_for_capabilities_the_admission_policy_holds_to_baseline_plus() -> None:
    # Issue 38: Privileged admits hostPath, hostNetwork and privileged pods; a namespace enforces it only to admit
    # named capabilities, which the ValidatingAdmissionPolicy (k8s/charts/pod_security.py) adds to Baseline.
    with pytest.raises(ConfigError, match=r"namespaces\[x\].capabilities=\(\)"):
        NamespaceSpec(name="x", purpose="", enforce="privileged", warn="baseline")
    with pytest.raises(ConfigError, match=r"namespaces\[x\].capabilities=\('IPC_LOCK',\)"):
        NamespaceSpec(name="x", purpose="", enforce="baseline", warn="baseline", capabilities=("IPC_LOCK",))
    with pytest.raises(ConfigError, match=r"namespaces\[x\].capabilities=\('CHOWN',\)"):
        NamespaceSpec(name="x", purpose="", enforce="privileged", warn="baseline", capabilities=("CHOWN",))
    with pytest.raises(ConfigError, match=r"namespaces\[x\].capabilities=\('ipc_lock',\)"):
        NamespaceSpec(name="x", purpose="", enforce="privileged", warn="baseline", capabilities=("ipc_lock",))
    spec = NamespaceSpec(name="x", purpose="", enforce="privileged", warn="baseline", capabilities=("IPC_LOCK",))
    assert spec.capabilities == ("IPC_LOCK",)


# Address arithmetic (infra/spec/addressing.py documents the formula).


def test_max_pods_follows_the_eks_eni_formula() -> None:
    m7i = INSTANCE_TYPES["m7i.xlarge"]
    assert max_pods(m7i) == 4 * (15 - 1) + 2 == 58  # EKS's published value for m7i.xlarge
    # nodeadm counts the default network card's ENIs only: a p5's card 0 has 2 (2 x 49 + 2).
    assert max_pods(INSTANCE_TYPES["p5.48xlarge"]) == 100


def test_subnet_sizing_and_the_kubelet_use_one_max_pods() -> None:
    from infra.spec.kubelet import node_allocatable

    for spec in INSTANCE_TYPES.values():
        assert max_pods(spec) == node_allocatable(spec).max_pods, spec.name


def test_addresses_per_node() -> None:
    """ENIs for max_pods secondary IPs (each ENI keeps one address of its own) plus one warm ENI, at most the
    instance's ENI limit, each taking ipv4_per_interface addresses (infra/spec/addressing.py)."""
    m7i, g6, p5 = (INSTANCE_TYPES[name] for name in ("m7i.xlarge", "g6.12xlarge", "p5.48xlarge"))

    def enis_wanted(spec: InstanceType) -> int:
        return math.ceil(max_pods(spec) / (spec.ipv4_per_interface - 1)) + 1

    # m7i and g6: their pods want more ENIs than the instance takes, so every ENI it can attach counts.
    for spec in (m7i, g6):
        assert enis_wanted(spec) > spec.max_network_interfaces, spec.name
        assert addresses_per_node(spec) == spec.max_network_interfaces * spec.ipv4_per_interface, spec.name
    # p5: fewer than its ENI limit, an upper bound (docs/deploy.md): ceil(100 / 49) + 1 warm = 4 ENIs x 50.
    assert enis_wanted(p5) < p5.max_network_interfaces
    assert addresses_per_node(p5) == enis_wanted(p5) * p5.ipv4_per_interface


def test_prod_gpu_zone_budget_matches_the_documented_figure() -> None:
    assert gpu_zone_demand(PROD) == 3334
    assert 2 ** (32 - PROD.network.private_subnet_prefix) >= 3 * gpu_zone_demand(PROD)


def test_subnet_too_small_for_the_nodes_is_refused() -> None:
    small = dataclasses.replace(PROD.network, private_subnet_prefix=21)
    with pytest.raises(ConfigError) as err:
        dataclasses.replace(PROD, network=small)
    assert "network.private_subnet_prefix=21" in str(err.value)
    assert "at least 3334 addresses" in str(err.value)


def test_log_retention_table_matches_cdk_enum() -> None:
    from infra.logs import _BY_DAYS

    assert tuple(_BY_DAYS) == LOG_RETENTION_DAYS


def test_declared_environments_have_the_issue_shapes() -> None:
    # On-Demand GPU groups launch nothing at deploy; a job uses workload_nodes once scaled up.
    assert {g.instance_type: (g.scaling.desired_size, g.workload_nodes) for g in DEV.gpu_node_groups} == {
        "g6.12xlarge": (0, 2)
    }
    p5 = next(g for g in PROD.gpu_node_groups if g.instance_type == "p5.48xlarge")
    assert (p5.scaling.min_size, p5.scaling.desired_size, p5.scaling.max_size) == (0, 0, 8)
    assert all(g.scaling.desired_size == 0 and g.workload_nodes == 2 for g in PROD.gpu_node_groups)
    assert not any(g.launch_at_deploy for env in (DEV, PROD) for g in env.gpu_node_groups)
    assert any(g.instance_type == "g6.12xlarge" for g in PROD.gpu_node_groups)
    assert DEV.network.nat_gateways == 1
    assert PROD.network.nat_gateways == len(PROD.network.availability_zones)


def test_extra_efa_interfaces_count_in_the_budget() -> None:
    from infra.spec.addressing import extra_efa_addresses

    assert extra_efa_addresses(INSTANCE_TYPES["p5.48xlarge"], 32) == 0  # efa-only: no addresses
    assert extra_efa_addresses(INSTANCE_TYPES["g6.12xlarge"], 1) == 0  # the primary is the EFA
    assert extra_efa_addresses(INSTANCE_TYPES["p4d.24xlarge"], 4) == 3  # cards 1-3


# Capacity policy (issue 13): GPU capacity that cannot roll back the cluster.

RESERVATION = "cr-0123456789abcdef0"


def gpu(desired: int, *, kind: CapacityKind = CapacityKind.ON_DEMAND, **fields: object) -> GpuNodeGroupConfig:
    capacity = Capacity(kind=kind, reservation_id=None if kind is CapacityKind.ON_DEMAND else RESERVATION)
    return GpuNodeGroupConfig(
        name="p5",
        instance_type="p5.48xlarge",
        scaling=Scaling(min_size=0, desired_size=desired, max_size=4),
        capacity=capacity,
        **fields,  # type: ignore[arg-type]
    )


def test_on_demand_group_launching_at_deploy_needs_the_opt_in() -> None:
    with pytest.raises(ConfigError) as err:
        gpu(2)
    message = str(err.value)
    assert "gpu_node_groups[p5].scaling.desired_size=2" in message
    assert "scale up after deploy with `trainctl scale` or set launch_at_deploy=True" in message
    assert "rolls back that GPU stack" in message


def test_on_demand_opt_in_and_idle_groups_are_accepted() -> None:
    assert gpu(2, launch_at_deploy=True).scaling.desired_size == 2
    assert gpu(0).scaling.desired_size == 0


def test_reservation_group_may_launch_at_deploy() -> None:
    assert gpu(2, kind=CapacityKind.RESERVATION).scaling.desired_size == 2


@pytest.mark.parametrize("fields", [{}, {"launch_at_deploy": True}])
def test_capacity_block_group_desired_is_zero(fields: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as err:
        gpu(1, kind=CapacityKind.CAPACITY_BLOCK, **fields)
    message = str(err.value)
    assert "gpu_node_groups[p5]." in message
    assert "Capacity Block" in message
    assert "`trainctl scale` once the block is active" in message


def test_capacity_block_group_at_zero_is_accepted() -> None:
    assert gpu(0, kind=CapacityKind.CAPACITY_BLOCK).capacity.kind is CapacityKind.CAPACITY_BLOCK


@pytest.mark.parametrize("nodes", [0, 5])
def test_workload_nodes_within_the_group(nodes: int) -> None:
    with pytest.raises(ConfigError) as err:
        gpu(0, workload_nodes=nodes)
    assert f"gpu_node_groups[p5].workload_nodes={nodes}" in str(err.value)
    assert "1 to scaling.max_size (4)" in str(err.value)


# A spare for every gated gang: the fabric gate (training/fabric_gate.py) takes a node out of a multi-node gang by
# tainting it, and the gang is re-placed only onto an untainted node beside it.


def test_a_gated_group_that_cannot_hold_its_gang_plus_a_spare_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        gpu(0, workload_nodes=4)  # max_size 4: the gang fills the group
    message = str(err.value)
    assert "gpu_node_groups[p5].scaling.max_size=4" in message
    assert "workload_nodes + 1 (5)" in message
    assert "fabric gate" in message
    assert "raise scaling.max_size to 5" in message


def test_a_group_with_a_spare_or_a_single_node_gang_is_accepted() -> None:
    assert gpu(0, workload_nodes=3).scaling.max_size == 4
    single = GpuNodeGroupConfig(
        name="p5",
        instance_type="p5.48xlarge",
        scaling=Scaling(min_size=0, desired_size=0, max_size=1),
        workload_nodes=1,
    )
    assert single.workload_nodes == single.scaling.max_size  # one node: no fabric between nodes, no gate


@pytest.mark.parametrize("env_name", sorted(ENVIRONMENTS))
def test_every_declared_gated_group_holds_its_gang_plus_a_spare(env_name: str) -> None:
    for group in ENVIRONMENTS[env_name].gpu_node_groups:
        if group.workload_nodes >= 2:
            assert group.scaling.max_size >= group.workload_nodes + 1, (env_name, group.name)


def test_placement_group_name_refused_for_plain_on_demand() -> None:
    with pytest.raises(ConfigError) as err:
        Capacity(placement_group_name="my-pg")
    assert "capacity.placement_group_name='my-pg'" in str(err.value)
    assert "gets a cluster placement group of its own" in str(err.value)


@pytest.mark.parametrize("name", ["", "has space", "x" * 256])
def test_malformed_placement_group_name(name: str) -> None:
    with pytest.raises(ConfigError, match=r"capacity.placement_group_name="):
        Capacity(kind=CapacityKind.RESERVATION, reservation_id=RESERVATION, placement_group_name=name)


def test_addon_pod_table_rows_are_whole_records() -> None:
    """infra/spec/addon_pods.py builds its records from one table: each row a distinct pod with its kind, a
    source, and instance types exactly where it selects GPU instance types."""
    from infra.spec.addon_pods import _TABLE, ADDON_PODS, DCGM_EXPORTER_INSTANCE_TYPES, Where

    names = [pod.name for pod in ADDON_PODS]
    assert len(names) == len(set(names)) == len(_TABLE)
    assert {pod.kind for pod in ADDON_PODS} == {"DaemonSet", "Deployment"}
    assert all(pod.source and pod.replicas >= 1 for pod in ADDON_PODS)
    assert [(p.name, p.instance_types) for p in ADDON_PODS if p.instance_types or p.where is Where.GPU_TYPES] == [
        ("dcgm-exporter", DCGM_EXPORTER_INSTANCE_TYPES)
    ]
    coredns = next(p for p in ADDON_PODS if p.name == "coredns")
    assert (coredns.kind, coredns.replicas, coredns.cpu_millis, coredns.memory_mib) == ("Deployment", 2, 100, 70)


@pytest.mark.parametrize(
    ("kind", "end", "says"),
    [
        (CapacityKind.RESERVATION, "2026-12-10T11:30:00+00:00", "only a block ends"),
        (CapacityKind.CAPACITY_BLOCK, "2026-12-10T11:30:00", "UTC offset"),
        (CapacityKind.CAPACITY_BLOCK, "next tuesday", "UTC offset"),
    ],
)
def test_capacity_end_is_a_blocks_aware_time(kind: CapacityKind, end: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        Capacity(kind=kind, reservation_id="cr-0123456789abcdef0", end=end)
    assert "capacity.end" in str(err.value)
    assert says in str(err.value)


def test_capacity_block_end_is_read_as_utc() -> None:
    block = Capacity(kind=CapacityKind.CAPACITY_BLOCK, reservation_id="cr-0123456789abcdef0", end="2026-12-10T11:30Z")
    assert block.end_time is not None
    assert block.end_time.isoformat() == "2026-12-10T11:30:00+00:00"
