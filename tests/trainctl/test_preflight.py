"""`trainctl preflight` against AWS endpoints on 127.0.0.1: moto in server mode for EC2, stubs for the rest.

boto3 talks HTTP to every endpoint here, through Aws(endpoint_urls=...) or the CLI's --endpoint-url.
What moto 5.2.5 serves and what the stubs serve (and why) is in tests/trainctl/fake_aws.py. The
pinned Helm charts are fetched from a chart repository on loopback (tests/trainctl/fake_chart_repo.py)
that lists every pin, unless a test serves another index.
"""

from __future__ import annotations

import dataclasses
import io
import json
import socket
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest

from infra.spec import Capacity, CapacityKind, Environment, GpuNodeGroupConfig, Scaling, get_environment
from infra.spec.addressing import gpu_zone_demand
from infra.spec.versions import HELM_CHARTS, KUBERNETES_VERSION, MANAGED_ADDONS
from tests.trainctl.fake_aws import Ec2Front, FakeEks, FakeServiceQuotas, MotoServer, cluster_version
from tests.trainctl.fake_chart_repo import FakeChartRepo, index_yaml
from trainctl.aws import Aws, ErrorKind
from trainctl.cli import main
from trainctl.exit_codes import ExitCode
from trainctl.preflight import (
    Check,
    CheckResult,
    PreflightReport,
    Status,
    StderrProgress,
    evaluate_subnet,
    preflight,
    run_checks,
)

PROD = get_environment("prod")
DEV = get_environment("dev")
P_QUOTA = "L-417A185B"
G_QUOTA = "L-DB2E81BA"
ENOUGH = {P_QUOTA: 4000.0, G_QUOTA: 1000.0}
RESERVATION = "cr-0123456789abcdef0"
START = datetime(2026, 12, 14, 11, 30, tzinfo=UTC)
END = datetime(2026, 12, 28, 11, 30, tzinfo=UTC)


# --- fixtures ----------------------------------------------------------------------------------


pytestmark = pytest.mark.usefixtures("fake_aws_credentials", "admin_role")

ADMIN = "PlatformAdmin"  # dev's and prod's cluster.admin_principals
CHARTS: dict[str, str] = {}
"""ALL_CHARTS -> the URL of the loopback repository listing every pinned chart (set by `pinned_charts`)."""


@pytest.fixture(scope="module", autouse=True)
def pinned_charts() -> Iterator[FakeChartRepo]:
    listed: dict[str, list[str]] = {}
    for pin in HELM_CHARTS.values():
        listed.setdefault(pin.chart, []).append(pin.version)
    with started(FakeChartRepo({"/index.yaml": (200, index_yaml(listed))})) as repo:
        CHARTS["*"] = repo.url
        yield repo
    CHARTS.clear()


@pytest.fixture
def admin_role(moto: MotoServer) -> None:
    """The environments' admin role exists in moto's IAM (fresh_moto's reset removes it again)."""
    iam = boto3.client("iam", region_name="us-east-1", endpoint_url=moto.url)
    try:
        iam.get_role(RoleName=ADMIN)
    except iam.exceptions.NoSuchEntityException:
        iam.create_role(RoleName=ADMIN, AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": []}))


@pytest.fixture
def fresh_moto(moto: MotoServer) -> Iterator[MotoServer]:
    """For tests that create resources in moto: reset afterwards, so no other test sees them."""
    try:
        yield moto
    finally:
        moto.reset()


@pytest.fixture
def quotas() -> Iterator[FakeServiceQuotas]:
    with started(FakeServiceQuotas(ENOUGH)) as stub:
        yield stub


@pytest.fixture
def eks() -> Iterator[FakeEks]:
    with started(eks_offering()) as stub:
        yield stub


@pytest.fixture
def dead_url() -> Iterator[str]:
    """http://127.0.0.1:<port> where a socket is bound but not listening: connections are refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


# --- helpers -----------------------------------------------------------------------------------


class started:  # noqa: N801 (used like contextlib's lower-case managers)
    def __init__(self, stub: Any) -> None:
        self.stub = stub

    def __enter__(self) -> Any:
        return self.stub.start()

    def __exit__(self, *exc: object) -> None:
        self.stub.stop()


def eks_offering(
    versions: Sequence[Mapping[str, Any]] | None = None, addons: Mapping[str, Sequence[str]] | None = None
) -> FakeEks:
    """EKS offering KUBERNETES_VERSION in standard support and every pinned add-on, unless told otherwise."""
    offered = {name: [version] for name, version in MANAGED_ADDONS.items()} | dict(addons or {})
    return FakeEks(
        [cluster_version(KUBERNETES_VERSION, end_of_standard=END)] if versions is None else versions,
        {(name, KUBERNETES_VERSION): list(v) for name, v in offered.items()},
    )


def endpoint_args(ec2: str, eks: FakeEks, quotas: FakeServiceQuotas) -> list[str]:
    return [
        f"--endpoint-url=ec2={ec2}",
        f"--endpoint-url=eks={eks.url}",
        f"--endpoint-url=service-quotas={quotas.url}",
        f"--endpoint-url={ec2}",
        f"--chart-repository={CHARTS['*']}",
    ]


# One boto3 Session for the tests that build Aws themselves: its service models load once, not per test.
# (The CLI tests make their own, as the command does; so does the test without credentials.)
SESSION = boto3.session.Session()


def aws(
    region: str,
    ec2: str,
    eks: FakeEks | str,
    quotas: FakeServiceQuotas | str,
    *,
    others: str | None = None,
    **kwargs: Any,
) -> Aws:
    """`others`: IAM, STS, Logs, FSx, KMS, CloudFormation (default: the EC2 URL, moto or Ec2Front in front
    of it, which forwards them to moto)."""
    return Aws(
        session=SESSION,
        region=region,
        endpoint_urls={
            "ec2": ec2,
            "eks": eks if isinstance(eks, str) else eks.url,
            "service-quotas": quotas if isinstance(quotas, str) else quotas.url,
            "*": others or ec2,
        },
        **kwargs,
    )


def checks(env: Environment, aws: Aws, **kwargs: Any) -> list[CheckResult]:
    """run_checks with the pinned charts served from loopback."""
    return run_checks(env, aws, chart_repositories=kwargs.pop("chart_repositories", CHARTS), **kwargs)


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["preflight", *args])
    out, err = capsys.readouterr()
    return code, out, err


def rows(results: Sequence[CheckResult], check: Check) -> dict[str, CheckResult]:
    return {r.subject: r for r in results if r.check is check}


def only(results: Sequence[CheckResult], check: Check) -> CheckResult:
    found = list(rows(results, check).values())
    assert len(found) == 1, found
    return found[0]


def gpu_group(
    name: str = "p5",
    instance_type: str = "p5.48xlarge",
    *,
    max_size: int = 8,
    kind: CapacityKind = CapacityKind.ON_DEMAND,
    efa_interfaces: int | None = None,
) -> GpuNodeGroupConfig:
    capacity = Capacity(kind=kind, reservation_id=None if kind is CapacityKind.ON_DEMAND else RESERVATION)
    return GpuNodeGroupConfig(
        name=name,
        instance_type=instance_type,
        scaling=Scaling(min_size=0, desired_size=0, max_size=max_size),
        workload_nodes=min(2, max_size),
        efa_interfaces=efa_interfaces,
        capacity=capacity,
    )


def with_groups(env: Environment, *groups: GpuNodeGroupConfig) -> Environment:
    return dataclasses.replace(env, gpu_node_groups=groups)


def moto_instance_type(moto: MotoServer, region: str, instance_type: str) -> dict[str, Any]:
    """moto's copy of AWS's InstanceTypeInfo, to be altered and served by Ec2Front."""
    ec2 = boto3.client("ec2", region_name=region, endpoint_url=moto.url)
    info: dict[str, Any] = ec2.describe_instance_types(InstanceTypes=[instance_type])["InstanceTypes"][0]
    return info


def reservation(
    *,
    state: str = "active",
    instance_type: str = "p5.48xlarge",
    zone: str = "us-east-2a",
    total: int = 8,
    available: int | None = None,
    kind: str = "capacity-block",
    tags: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "CapacityReservationId": RESERVATION,
        "OwnerId": "123456789012",
        "CapacityReservationArn": f"arn:aws:ec2:us-east-2:123456789012:capacity-reservation/{RESERVATION}",
        "InstanceType": instance_type,
        "InstancePlatform": "Linux/UNIX",
        "AvailabilityZone": zone,
        "Tenancy": "default",
        "TotalInstanceCount": total,
        "AvailableInstanceCount": total if available is None else available,
        "State": state,
        "StartDate": START,
        "EndDate": END,
        "EndDateType": "limited",
        "InstanceMatchCriteria": "targeted",
        "ReservationType": kind,
        "Tags": [{"Key": k, "Value": v} for k, v in (tags or {}).items()],
    }


def create_vpc(moto: MotoServer, env: Environment, prefixes: Mapping[str, int], *, cidr: str | None = None) -> str:
    """A VPC as CDK deploys it: tagged with the environment, private subnets tagged Private, one per zone."""
    ec2 = boto3.client("ec2", region_name=env.region, endpoint_url=moto.url)
    vpc_cidr = cidr or env.network.cidr
    vpc_id: str = ec2.create_vpc(
        CidrBlock=vpc_cidr,
        TagSpecifications=[
            {
                "ResourceType": "vpc",
                "Tags": [
                    {"Key": "platform:environment", "Value": env.name},
                    {"Key": "aws:cloudformation:stack-name", "Value": f"{env.cluster.name}-platform"},
                ],
            }
        ],
    )["Vpc"]["VpcId"]
    base = vpc_cidr.split(".")
    for index, zone in enumerate(env.network.availability_zones):
        ec2.create_subnet(
            VpcId=vpc_id,
            AvailabilityZone=zone,
            CidrBlock=f"{base[0]}.{base[1]}.{index * 64}.0/{prefixes.get(zone, 18)}",
            TagSpecifications=[
                {
                    "ResourceType": "subnet",
                    "Tags": [
                        {"Key": "aws-cdk:subnet-type", "Value": "Private"},
                        {"Key": "platform:environment", "Value": env.name},
                    ],
                }
            ],
        )
    return vpc_id


# --- the command: table, JSON, exit codes -------------------------------------------------------


def test_prod_passes_with_a_table_and_every_service_was_asked(
    moto: MotoServer, quotas: FakeServiceQuotas, eks: FakeEks, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "--env", "prod", *endpoint_args(moto.url, eks, quotas))
    assert (code, err) == (ExitCode.OK, "")
    lines = out.splitlines()
    assert lines[0].split() == ["CHECK", "SUBJECT", "STATUS", "REASON"]
    table = [line.split() for line in lines[1 : lines.index("")]]
    # Every check but placement (prod's groups are plain On-Demand: no reservation to match).
    assert {row[0] for row in table} == {c.value for c in Check} - {"placement"}
    assert all("PASS" in row for row in table), out
    assert "offering    p5 (p5.48xlarge)" in out
    assert "in standard support until 2026-12-28" in out
    assert "no VPC tagged platform:environment=prod in us-east-2: not deployed yet" in out
    assert "admin       PlatformAdmin" in out
    assert "leftover    log group /aws/eks/ml-prod/cluster" in out
    # 16 before issue 13; + admin 1, charts 3, leftovers 3 (EKS cluster, log group, FSx).
    assert lines[-1] == "preflight passed for environment prod in us-east-2: 23 PASS, 0 WARN, 0 FAIL"
    # The requests really reached the stubs, with the documented quota codes.
    assert quotas.calls == [f"GetServiceQuota {P_QUOTA}", f"GetServiceQuota {G_QUOTA}"]
    assert eks.calls[0] == f"/cluster-versions clusterVersions={KUBERNETES_VERSION}&includeAll=true"
    assert len(eks.calls) == 1 + 6 + 1  # every managed add-on of prod (FSx and node monitoring included)
    assert eks.calls[-1] == "/clusters/ml-prod "  # DescribeCluster: no leftover cluster of that name


def test_json_document_shape_for_dev(
    moto: MotoServer, quotas: FakeServiceQuotas, eks: FakeEks, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "--env", "dev", "--json", *endpoint_args(moto.url, eks, quotas))
    assert (code, err) == (ExitCode.OK, "")
    document = json.loads(out)
    assert set(document) == {
        "command",
        "environment",
        "region",
        "environment_region",
        "exit_code",
        "summary",
        "counts",
        "checks",
        "warnings",
        "errors",
    }
    assert document["command"] == "preflight"
    assert (document["environment"], document["region"], document["environment_region"]) == (
        "dev",
        "us-west-2",
        "us-west-2",
    )
    assert document["exit_code"] == 0
    # offering, instance, quota, capacity, kubernetes, 5 add-ons (4 core + node monitoring), subnet,
    # admin, 3 charts, 3 leftovers
    assert document["counts"] == {"PASS": 18, "WARN": 0, "FAIL": 0, "could_not_run": 0}
    assert (document["warnings"], document["errors"]) == ([], [])
    for check in document["checks"]:
        assert set(check) == {"check", "subject", "status", "reason", "fix", "api", "ran", "error_kind"}
        assert (check["status"], check["ran"], check["error_kind"], check["fix"]) == ("PASS", True, None, None)
    by_check = {(c["check"], c["subject"]): c for c in document["checks"]}
    assert by_check[("quota", f"{G_QUOTA} (Running On-Demand G and VT instances)")]["api"] == (
        "servicequotas:GetServiceQuota"
    )
    assert ("offering", "g6 (g6.12xlarge)") in by_check
    subjects = {c["subject"].split()[0] for c in document["checks"] if c["check"] == "add-on"}
    assert "aws-fsx-csi-driver" not in subjects  # dev has no checkpoint storage
    assert "eks-node-monitoring-agent" in subjects
    assert quotas.calls == [f"GetServiceQuota {G_QUOTA}"]  # dev has no P instances


def test_unknown_environment_is_exit_2_naming_the_value_and_the_known_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_cli(capsys, "--env", "staging")
    assert code == ExitCode.ERROR
    assert out == ""
    assert err == "error: unknown environment 'staging'; known: dev, prod (declared in infra/spec/environments.py)\n"
    code, out, _ = run_cli(capsys, "--env", "staging", "--json")
    document = json.loads(out)
    assert (code, document["exit_code"], document["checks"]) == (ExitCode.ERROR, 2, [])
    assert document["errors"] == [
        "unknown environment 'staging'; known: dev, prod (declared in infra/spec/environments.py)"
    ]


@pytest.mark.parametrize(
    "args",
    [
        ["--env", "prod", "--region", "useast2"],
        ["--env", "prod", "--endpoint-url", "s3=http://127.0.0.1:1"],
        ["--env", "prod", "--endpoint-url", "ftp://127.0.0.1:1"],
        ["--region", "us-east-2"],
    ],
)
def test_bad_arguments_are_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["preflight", *args])
    assert exited.value.code == ExitCode.ERROR
    assert "usage: trainctl preflight" in capsys.readouterr().err


def test_another_region_is_warned_and_the_zone_is_not_offered_there(
    moto: MotoServer, quotas: FakeServiceQuotas, eks: FakeEks, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "--env", "prod", "--region", "us-west-2", *endpoint_args(moto.url, eks, quotas))
    assert code == ExitCode.CHECK_FAILED
    assert err.startswith("warning: --region us-west-2 differs from environment prod's region us-east-2")
    assert "p5.48xlarge is not offered in us-east-2a (region us-west-2)" in out
    assert "preflight failed for environment prod in us-west-2" in out.splitlines()[-1]


# --- 1. offering -----------------------------------------------------------------------------


def test_offering_present_passes_and_missing_in_the_zone_fails(
    moto: MotoServer, quotas: FakeServiceQuotas, eks: FakeEks
) -> None:
    # moto's offering data (AWS's, copied): p5e.48xlarge is offered in us-west-2c, not in us-west-2a.
    env = with_groups(DEV, gpu_group("g6", "g6.12xlarge", max_size=2), gpu_group("p5e", "p5e.48xlarge", max_size=1))
    results = checks(env, aws("us-west-2", moto.url, eks, quotas))
    offering = rows(results, Check.OFFERING)
    assert offering["g6 (g6.12xlarge)"].status is Status.PASS
    missing = offering["p5e (p5e.48xlarge)"]
    assert missing.status is Status.FAIL
    assert missing.reason == "p5e.48xlarge is not offered in us-west-2a (region us-west-2)"
    assert missing.fix is not None
    assert "gpu_availability_zone" in missing.fix
    assert "Values=p5e.48xlarge --region us-west-2" in missing.fix
    report = PreflightReport("dev", "us-west-2", "us-west-2", results)
    assert report.exit_code is ExitCode.CHECK_FAILED


# --- 2. EFA, network cards, GPUs ------------------------------------------------------------------


def test_efa_interfaces_and_cards_below_what_the_group_attaches_fail(
    moto: MotoServer, quotas: FakeServiceQuotas, eks: FakeEks
) -> None:
    info = moto_instance_type(moto, "us-east-2", "p5.48xlarge")
    info["NetworkInfo"]["EfaInfo"]["MaximumEfaInterfaces"] = 16
    info["NetworkInfo"]["MaximumNetworkCards"] = 16
    with started(Ec2Front(moto.url, instance_types={"p5.48xlarge": info})) as front:
        results = checks(with_groups(PROD, gpu_group()), aws("us-east-2", front.url, eks, quotas))
        assert front.calls == ["DescribeInstanceTypes"]
    row = only(results, Check.INSTANCE)
    assert row.status is Status.FAIL
    assert row.reason == (
        "the node group attaches 32 EFA interface(s), EC2 allows 16 (EfaInfo.MaximumEfaInterfaces); "
        "the interface layout uses 32 network card(s), EC2 reports 16"
    )
    assert row.fix is not None
    assert "set efa_interfaces of group p5 to at most 16" in row.fix


def test_efa_facts_that_differ_but_fit_warn_and_fewer_interfaces_pass(
    moto: MotoServer, quotas: FakeServiceQuotas, eks: FakeEks
) -> None:
    info = moto_instance_type(moto, "us-east-2", "p5.48xlarge")
    info["NetworkInfo"]["EfaInfo"]["MaximumEfaInterfaces"] = 16
    info["NetworkInfo"]["MaximumNetworkCards"] = 16
    env = with_groups(PROD, gpu_group(efa_interfaces=16), gpu_group("small", efa_interfaces=4, max_size=1))
    with started(Ec2Front(moto.url, instance_types={"p5.48xlarge": info})) as front:
        results = checks(env, aws("us-east-2", front.url, eks, quotas))
    instance = rows(results, Check.INSTANCE)
    for row in instance.values():
        assert row.status is Status.WARN
        assert "MaximumEfaInterfaces 16 (facts: 32), MaximumNetworkCards 16 (facts: 32)" in row.reason
    # Unchanged data from moto (AWS's) matches infra/spec/instances.py.
    results = checks(env, aws("us-east-2", moto.url, eks, quotas))
    passing = rows(results, Check.INSTANCE)["small (p5.48xlarge)"]
    assert passing.status is Status.PASS
    assert passing.reason.startswith("EFA: attaches 4 of 32 interface(s) on 4 of 32 network card(s)")


def test_no_efa_and_a_different_gpu_count_fail(moto: MotoServer, quotas: FakeServiceQuotas, eks: FakeEks) -> None:
    info = moto_instance_type(moto, "us-east-2", "g6.12xlarge")
    info["NetworkInfo"]["EfaSupported"] = False
    info["GpuInfo"]["Gpus"][0]["Count"] = 8
    with started(Ec2Front(moto.url, instance_types={"g6.12xlarge": info})) as front:
        results = checks(with_groups(PROD, gpu_group("g6", "g6.12xlarge")), aws("us-east-2", front.url, eks, quotas))
    row = only(results, Check.INSTANCE)
    assert row.status is Status.FAIL
    assert "EC2 reports no EFA support (NetworkInfo.EfaSupported)" in row.reason
    assert "EC2 reports 8 GPU(s), infra/spec/instances.py 4" in row.reason


# --- 3. quotas -----------------------------------------------------------------------------------


def test_quota_short_of_max_fails_and_short_of_the_surge_node_warns(
    moto: MotoServer, eks: FakeEks, capsys: pytest.CaptureFixture[str]
) -> None:
    # prod: p5 max 8 x 192 = 1536 (1728 with a surge node); g6 max 4 x 48 = 192 (240).
    with started(FakeServiceQuotas({P_QUOTA: 1536, G_QUOTA: 96})) as quotas:
        code, out, _ = run_cli(capsys, "--env", "prod", "--json", *endpoint_args(moto.url, eks, quotas))
    document = json.loads(out)
    assert code == document["exit_code"] == ExitCode.CHECK_FAILED
    quota = {c["subject"]: c for c in document["checks"] if c["check"] == "quota"}
    p = quota[f"{P_QUOTA} (Running On-Demand P instances)"]
    g = quota[f"{G_QUOTA} (Running On-Demand G and VT instances)"]
    assert (p["status"], g["status"]) == ("WARN", "FAIL")
    assert p["reason"] == "1536 vCPUs cover max size (1536) but not a rolling update's surge node (1728)"
    assert g["reason"] == "96 vCPUs < 192 needed at max size (g6: 4 x 48)"
    assert g["fix"] == (
        "request at least 240 vCPUs: aws service-quotas request-service-quota-increase --service-code ec2 "
        f"--quota-code {G_QUOTA} --desired-value 240 --region us-east-2"
    )
    assert document["counts"]["FAIL"] == 1


def test_quota_never_changed_falls_back_to_the_aws_default(moto: MotoServer, eks: FakeEks) -> None:
    with started(FakeServiceQuotas({}, defaults={G_QUOTA: 64})) as quotas:
        results = checks(DEV, aws("us-west-2", moto.url, eks, quotas))
        assert quotas.calls == [f"GetServiceQuota {G_QUOTA}", f"GetAWSDefaultServiceQuota {G_QUOTA}"]
    row = only(results, Check.QUOTA)
    assert (row.status, row.reason) == (Status.FAIL, "64 vCPUs < 96 needed at max size (g6: 2 x 48)")


def test_quota_is_skipped_for_a_group_on_a_capacity_block(moto: MotoServer, eks: FakeEks) -> None:
    env = with_groups(PROD, gpu_group(kind=CapacityKind.CAPACITY_BLOCK), gpu_group("g6", "g6.12xlarge", max_size=4))
    with (
        started(FakeServiceQuotas({G_QUOTA: 240})) as quotas,
        started(Ec2Front(moto.url, reservations={RESERVATION: reservation()})) as front,
    ):
        results = checks(env, aws("us-east-2", front.url, eks, quotas))
        assert quotas.calls == [f"GetServiceQuota {G_QUOTA}"]  # P is not asked: its only group is reserved
    quota = rows(results, Check.QUOTA)
    skipped = quota["p5 (p5.48xlarge)"]
    assert skipped.status is Status.PASS
    assert skipped.reason == f"skipped: runs on capacity-block {RESERVATION} (see the capacity row)"
    assert quota[f"{G_QUOTA} (Running On-Demand G and VT instances)"].status is Status.PASS


# --- 4. capacity reservations and Capacity Blocks --------------------------------------------------


@pytest.mark.parametrize(
    ("state", "status", "reason"),
    [
        ("active", Status.PASS, f"Capacity Block {RESERVATION} active until 2026-12-28: 8 x p5.48xlarge in us-east-2a"),
        ("scheduled", Status.WARN, f"Capacity Block {RESERVATION} is scheduled, starts 2026-12-14 until 2026-12-28"),
        ("payment-pending", Status.WARN, f"Capacity Block {RESERVATION} is payment-pending, starts 2026-12-14"),
        ("expired", Status.FAIL, f"Capacity Block {RESERVATION}: it is expired"),
        ("cancelled", Status.FAIL, f"Capacity Block {RESERVATION}: it is cancelled"),
        ("payment-failed", Status.FAIL, f"Capacity Block {RESERVATION}: it is payment-failed"),
    ],
)
def test_capacity_block_state(
    state: str, status: Status, reason: str, moto: MotoServer, quotas: FakeServiceQuotas, eks: FakeEks
) -> None:
    # A Capacity Block shows 0 instances before it starts; its size is in a tag.
    before_start = state in ("scheduled", "payment-pending")
    found = reservation(
        state=state,
        total=0 if before_start else 8,
        tags={"aws:ec2capacityreservation:incrementalRequestedQuantity": "8"} if before_start else None,
    )
    env = with_groups(PROD, gpu_group(kind=CapacityKind.CAPACITY_BLOCK))
    with started(Ec2Front(moto.url, reservations={RESERVATION: found})) as front:
        results = checks(env, aws("us-east-2", front.url, eks, quotas))
        assert front.calls.count("DescribeCapacityReservations") == 1
    row = only(results, Check.CAPACITY)
    assert row.status is status
    assert row.reason.startswith(reason), row.reason
    assert (row.fix is None) == (status is Status.PASS)


def test_missing_reservation_fails(moto: MotoServer, quotas: FakeServiceQuotas, eks: FakeEks) -> None:
    env = with_groups(PROD, gpu_group(kind=CapacityKind.RESERVATION))
    with started(Ec2Front(moto.url)) as front:
        results = checks(env, aws("us-east-2", front.url, eks, quotas))
        assert front.calls == ["DescribeCapacityReservations"]
    row = only(results, Check.CAPACITY)
    assert row.status is Status.FAIL
    assert row.reason == f"capacity reservation {RESERVATION} not found in us-east-2 (or not shared with this account)"
    assert row.fix is not None
    assert f"--capacity-reservation-ids {RESERVATION} --region us-east-2" in row.fix


@pytest.mark.parametrize(
    ("found", "kind", "problem"),
    [
        (
            reservation(instance_type="p5e.48xlarge"),
            CapacityKind.CAPACITY_BLOCK,
            "it holds p5e.48xlarge, the group launches p5.48xlarge",
        ),
        (
            reservation(zone="us-east-2b"),
            CapacityKind.CAPACITY_BLOCK,
            "it is in us-east-2b, the GPU zone is us-east-2a",
        ),
        (
            reservation(total=4),
            CapacityKind.CAPACITY_BLOCK,
            "it holds 4 instance(s), the node group(s) on it scale to 8",
        ),
        (
            reservation(kind="default"),
            CapacityKind.CAPACITY_BLOCK,
            "it is an On-Demand Capacity Reservation, the group is declared capacity-block",
        ),
        (
            reservation(kind="capacity-block"),
            CapacityKind.RESERVATION,
            "it is a Capacity Block, the group is declared capacity-reservation",
        ),
    ],
    ids=["instance-type", "zone", "count", "block-declared-but-odcr", "odcr-declared-but-block"],
)
def test_reservation_that_does_not_match_the_group_fails(
    found: dict[str, Any],
    kind: CapacityKind,
    problem: str,
    moto: MotoServer,
    quotas: FakeServiceQuotas,
    eks: FakeEks,
) -> None:
    env = with_groups(PROD, gpu_group(kind=kind))
    with started(Ec2Front(moto.url, reservations={RESERVATION: found})) as front:
        results = checks(env, aws("us-east-2", front.url, eks, quotas))
    row = only(results, Check.CAPACITY)
    assert row.status is Status.FAIL
    assert problem in row.reason
    assert row.reason.count(";") == 0  # only the one problem the case introduced


def test_two_groups_on_one_reservation_need_their_sum_and_a_busy_one_warns(
    moto: MotoServer, quotas: FakeServiceQuotas, eks: FakeEks
) -> None:
    env = with_groups(
        PROD,
        gpu_group("a", kind=CapacityKind.RESERVATION, max_size=4),
        gpu_group("b", kind=CapacityKind.RESERVATION, max_size=4),
    )
    found = reservation(kind="default", total=8, available=6)
    with started(Ec2Front(moto.url, reservations={RESERVATION: found})) as front:
        results = checks(env, aws("us-east-2", front.url, eks, quotas))
        assert front.calls == ["DescribeCapacityReservations"]  # asked once for both groups
    for row in rows(results, Check.CAPACITY).values():
        assert row.status is Status.WARN
        assert "only 6 of 8 instance(s) unused (the group scales to 8)" in row.reason


# --- 5. Kubernetes version and add-ons --------------------------------------------------------------


@pytest.mark.parametrize(
    ("versions", "status", "reason"),
    [
        ([], Status.FAIL, f"EKS in us-east-2 does not offer Kubernetes {KUBERNETES_VERSION}"),
        (
            [cluster_version(KUBERNETES_VERSION, "EXTENDED_SUPPORT", end_of_extended=END)],
            Status.WARN,
            "in extended support until 2026-12-28 (charged extra per cluster hour)",
        ),
        ([cluster_version(KUBERNETES_VERSION, "UNSUPPORTED")], Status.FAIL, "EKS reports it unsupported"),
    ],
    ids=["missing", "extended-support", "unsupported"],
)
def test_kubernetes_version_not_in_standard_support(
    versions: list[dict[str, Any]], status: Status, reason: str, moto: MotoServer, quotas: FakeServiceQuotas
) -> None:
    with started(eks_offering(versions)) as eks:
        results = checks(PROD, aws("us-east-2", moto.url, eks, quotas))
    row = only(results, Check.KUBERNETES)
    assert (row.status, row.reason) == (status, reason)
    assert row.fix is not None
    assert "KUBERNETES_VERSION in infra/spec/versions.py" in row.fix


def test_addon_version_not_offered_fails(moto: MotoServer, quotas: FakeServiceQuotas) -> None:
    offered = {"vpc-cni": ["v1.23.0-eksbuild.1", "v1.22.9-eksbuild.2"], "coredns": []}
    with started(eks_offering(addons=offered)) as eks:
        results = checks(PROD, aws("us-east-2", moto.url, eks, quotas))
    addons = rows(results, Check.ADDON)
    cni = addons[f"vpc-cni {MANAGED_ADDONS['vpc-cni']}"]
    assert cni.status is Status.FAIL
    assert cni.reason == (
        f"not offered for Kubernetes {KUBERNETES_VERSION} (offered: v1.23.0-eksbuild.1, v1.22.9-eksbuild.2)"
    )
    coredns = addons[f"coredns {MANAGED_ADDONS['coredns']}"]
    assert (coredns.status, coredns.reason) == (
        Status.FAIL,
        f"EKS offers no coredns version for Kubernetes {KUBERNETES_VERSION}",
    )
    assert addons[f"kube-proxy {MANAGED_ADDONS['kube-proxy']}"].status is Status.PASS


# --- 6. subnet addresses ----------------------------------------------------------------------------


def test_deployed_vpc_with_room_passes_and_a_small_gpu_subnet_fails(
    fresh_moto: MotoServer, quotas: FakeServiceQuotas, eks: FakeEks
) -> None:
    # us-east-2a (the GPU zone) gets a /22: 1019 free, far below prod's worst case.
    create_vpc(fresh_moto, PROD, {"us-east-2a": 22})
    results = checks(PROD, aws("us-east-2", fresh_moto.url, eks, quotas))
    subnets = rows(results, Check.SUBNET)
    assert len(subnets) == 3
    gpu = next(r for s, r in subnets.items() if s.startswith("private us-east-2a"))
    needed = gpu_zone_demand(PROD) - 5
    assert gpu.status is Status.FAIL
    assert gpu.reason.startswith(f"1019 free < {needed} needed (GPU and system nodes at max size plus surge")
    assert gpu.fix is not None
    assert "private_subnet_prefix" in gpu.fix
    others = [r for s, r in subnets.items() if not s.startswith("private us-east-2a")]
    assert [r.status for r in others] == [Status.PASS, Status.PASS]
    assert all(r.reason.startswith("16379 free >= 329 needed (system nodes") for r in others)


def test_deployed_vpc_of_the_planned_size_passes(
    fresh_moto: MotoServer, quotas: FakeServiceQuotas, eks: FakeEks, capsys: pytest.CaptureFixture[str]
) -> None:
    create_vpc(fresh_moto, PROD, {})
    code, out, _ = run_cli(capsys, "--env", "prod", "--json", *endpoint_args(fresh_moto.url, eks, quotas))
    document = json.loads(out)
    subnets = [c for c in document["checks"] if c["check"] == "subnet"]
    assert [c["status"] for c in subnets] == ["PASS", "PASS", "PASS"]
    assert subnets[0]["subject"].startswith("private us-east-2a (subnet-")
    assert subnets[0]["reason"].startswith(f"16379 free >= {gpu_zone_demand(PROD) - 5} needed")
    assert code == ExitCode.OK


def test_vpc_tagged_for_the_environment_with_another_cidr_warns(
    fresh_moto: MotoServer, quotas: FakeServiceQuotas, eks: FakeEks
) -> None:
    vpc_id = create_vpc(fresh_moto, PROD, {}, cidr="10.99.0.0/16")
    results = checks(PROD, aws("us-east-2", fresh_moto.url, eks, quotas))
    row = only(results, Check.SUBNET)
    assert row.status is Status.WARN
    assert f"{vpc_id} (10.99.0.0/16)" in row.reason


def test_addresses_held_by_the_clusters_own_nodes_count_as_available() -> None:
    subnet = {"SubnetId": "subnet-1", "CidrBlock": "10.20.0.0/22", "AvailableIpAddressCount": 900}
    kwargs: dict[str, Any] = {"needed": 1000, "cluster_name": "ml-prod", "gpu_zone": True}
    held = evaluate_subnet("us-east-2a", subnet, held=150, **kwargs)
    assert (held.status, held.reason.split(" (")[0]) == (
        Status.PASS,
        "900 free + 150 held by ml-prod's nodes >= 1000 needed",
    )
    short = evaluate_subnet("us-east-2a", subnet, held=0, **kwargs)
    assert (short.status, short.reason.split(" (")[0]) == (Status.FAIL, "900 free < 1000 needed")


# --- could not run: credentials, endpoints, permissions ---------------------------------------------


def test_no_credentials_is_exit_2_with_every_check_not_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    charts = f"--chart-repository={CHARTS['*']}"  # the chart check needs no AWS credentials
    code, out, err = run_cli(capsys, "--env", "prod", "--json", charts)
    document = json.loads(out)
    assert code == document["exit_code"] == ExitCode.ERROR
    assert err == ""
    not_run = [c for c in document["checks"] if not c["ran"]]
    assert document["counts"]["could_not_run"] == len(not_run) == 18
    assert {(c["status"], c["error_kind"]) for c in not_run} == {("FAIL", "no-credentials")}
    # Only the capacity rows of on-demand groups and the chart rows need no AWS call.
    assert [(c["check"], c["status"]) for c in document["checks"] if c["ran"]] == [("capacity", "PASS")] * 2 + [
        ("chart", "PASS")
    ] * 3
    assert document["checks"][0]["reason"].startswith(
        "could not run: ec2:DescribeInstanceTypeOfferings: no AWS credentials found"
    )
    assert document["summary"].startswith("preflight incomplete for environment prod in us-east-2: 18 of 23 check(s)")
    # Each row names its own call; the table lists the one shared fix once.
    assert {c["check"]: c["reason"].split(": ")[1] for c in not_run}["add-on"] == "eks:DescribeAddonVersions"
    code, out, _ = run_cli(capsys, "--env", "prod", charts)
    assert code == ExitCode.ERROR
    fixes = out.split("\nfixes:\n")[1].split("\n\n")[0].splitlines()
    assert fixes == [
        "  18 rows (offering, instance, quota, kubernetes, add-on, subnet, admin, leftover): configure credentials "
        "(aws configure, aws sso login, AWS_PROFILE or --profile) and run again"
    ]


def test_unreachable_ec2_is_not_run_and_not_retried_for_every_call(
    dead_url: str, moto: MotoServer, quotas: FakeServiceQuotas, eks: FakeEks
) -> None:
    results = checks(PROD, aws("us-east-2", dead_url, eks, quotas, others=moto.url, max_attempts=1))
    ec2_rows = [r for r in results if r.check in (Check.OFFERING, Check.INSTANCE, Check.SUBNET)]
    assert len(ec2_rows) == 5
    assert all(r.error_kind == ErrorKind.UNREACHABLE for r in ec2_rows)
    # Both offering rows share the first call's error; every later EC2 call fails at once.
    assert ec2_rows[0].reason == ec2_rows[1].reason
    assert "endpoint unreachable" in ec2_rows[0].reason
    assert "(not retried)" not in ec2_rows[0].reason
    assert all(r.reason.endswith("(not retried)") for r in ec2_rows[2:])
    assert all(r.ran and r.status is Status.PASS for r in results if r not in ec2_rows)
    report = PreflightReport("prod", "us-east-2", "us-east-2", results)
    assert report.exit_code is ExitCode.ERROR
    out, _ = report.render()
    assert "fix them" not in out
    assert "check network access to the AWS endpoints of us-east-2" in out


def test_access_denied_for_one_api_is_exit_2_but_a_real_failure_is_exit_1(
    moto: MotoServer, eks: FakeEks, capsys: pytest.CaptureFixture[str]
) -> None:
    with started(FakeServiceQuotas(ENOUGH, denied=True)) as quotas:
        code, out, _ = run_cli(capsys, "--env", "dev", "--json", *endpoint_args(moto.url, eks, quotas))
    document = json.loads(out)
    assert code == ExitCode.ERROR
    denied = [c for c in document["checks"] if not c["ran"]]
    assert [(c["check"], c["error_kind"]) for c in denied] == [("quota", "access-denied")]
    assert denied[0]["reason"].startswith("could not run: servicequotas:GetServiceQuota: AccessDeniedException")
    assert (
        denied[0]["fix"]
        == "allow servicequotas:GetServiceQuota (read-only) for the caller, or run as a role that has it"
    )
    # The same denial next to a check that ran and failed: that failure decides (exit 1).
    with (
        started(FakeServiceQuotas(ENOUGH, denied=True)) as quotas,
        started(eks_offering(versions=[])) as no_version,
    ):
        code, out, _ = run_cli(capsys, "--env", "dev", *endpoint_args(moto.url, no_version, quotas))
    assert code == ExitCode.CHECK_FAILED
    assert out.splitlines()[-1].endswith("Fix them before cdk deploy")
    assert "; 1 could not run" in out.splitlines()[-1]


# --- progress -------------------------------------------------------------------------------------


def test_progress_names_each_step_and_the_terminal_line_is_cleared(
    moto: MotoServer, quotas: FakeServiceQuotas, eks: FakeEks
) -> None:
    steps: list[str] = []
    report = preflight(
        "dev",
        endpoint_urls={"ec2": moto.url, "eks": eks.url, "service-quotas": quotas.url, "*": moto.url},
        chart_repositories=CHARTS,
        progress=steps.append,
    )
    assert report.exit_code is ExitCode.OK
    assert steps[0] == "instance type offerings in us-west-2a"
    assert f"quota {G_QUOTA} (Running On-Demand G and VT instances)" in steps
    assert "private subnets of the deployed VPC" in steps
    assert f"chart repository {CHARTS['*']}" in steps  # one fetch for the three charts it lists
    assert steps[-1] == "leftovers of earlier deployments of ml-dev"
    stream = io.StringIO()
    line = StderrProgress(stream)
    line.clear()
    assert stream.getvalue() == ""  # nothing shown, nothing to clear
    line("add-on vpc-cni")
    line.clear()
    assert stream.getvalue() == "\r\x1b[Kpreflight: checking add-on vpc-cni ...\r\x1b[K"
