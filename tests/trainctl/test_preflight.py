"""`trainctl preflight` against AWS endpoints on 127.0.0.1: moto in server mode for EC2, stubs for the rest.

boto3 talks HTTP to every endpoint here, through Aws(endpoint_urls=...) or the CLI's --endpoint-url.
What moto 5.2.5 serves and what the stubs serve (and why) is in tests/trainctl/fake_aws.py. The
pinned Helm charts are fetched from a chart repository on loopback (tests/trainctl/fake_chart_repo.py)
that lists every pin, unless a test serves another index.
"""

from __future__ import annotations

import dataclasses
import json
import socket
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest

from infra.spec import Capacity, CapacityKind, Environment, GpuNodeGroupConfig, Scaling, get_environment
from infra.spec.addressing import gpu_zone_demand
from infra.spec.versions import HELM_CHARTS, KUBERNETES_VERSION, MANAGED_ADDONS
from tests.trainctl.fake_aws import (
    Ec2Front,
    FakeCloudFormation,
    FakeEks,
    FakeServiceQuotas,
    MotoServer,
    cluster_version,
    stack_resource,
)
from tests.trainctl.fake_chart_repo import FakeChartRepo, index_yaml
from tests.trainctl.fake_iam import IamDenied
from trainctl.aws import Aws, ErrorKind
from trainctl.cli import main
from trainctl.exit_codes import ExitCode
from trainctl.preflight.addons import environment_addons
from trainctl.preflight.chart import ALL_CHARTS, chart_checks
from trainctl.preflight.leftover import control_plane_log_group
from trainctl.preflight.quota import quota_for
from trainctl.preflight.report import PreflightReport
from trainctl.preflight.results import Check, CheckResult, Status
from trainctl.preflight.runner import preflight, run_checks
from trainctl.preflight.subnet import evaluate_subnet

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


ADMIN_ROLE_IN: set[str] = set()
"""The moto servers (URLs) that hold the admin role since their last reset."""


@pytest.fixture
def admin_role(moto: MotoServer) -> None:
    """The environments' admin role exists in moto's IAM (fresh_moto's reset removes it again)."""
    if moto.url in ADMIN_ROLE_IN:
        return
    iam = boto3.client("iam", region_name="us-east-1", endpoint_url=moto.url)
    try:
        iam.get_role(RoleName=ADMIN)
    except iam.exceptions.NoSuchEntityException:
        iam.create_role(RoleName=ADMIN, AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": []}))
    ADMIN_ROLE_IN.add(moto.url)


@pytest.fixture
def fresh_moto(moto: MotoServer) -> Iterator[MotoServer]:
    """For tests that create resources in moto: reset afterwards, so no other test sees them."""
    try:
        yield moto
    finally:
        moto.reset()
        ADMIN_ROLE_IN.discard(moto.url)


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
    # Progress lines (trainctl.progress) come before the report's warnings and errors; tests_flags tests them.
    report_err = "".join(line for line in err.splitlines(keepends=True) if not line.startswith("trainctl: checking "))
    return code, out, report_err


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
    end: str | None = None,
) -> GpuNodeGroupConfig:
    capacity = Capacity(kind=kind, reservation_id=None if kind is CapacityKind.ON_DEMAND else RESERVATION, end=end)
    return GpuNodeGroupConfig(
        name=name,
        instance_type=instance_type,
        scaling=Scaling(min_size=0, desired_size=0, max_size=max_size),
        workload_nodes=2 if max_size >= 3 else 1,  # a gated gang of 2 needs a spare (GpuNodeGroupConfig)
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
    # Every check but placement (prod's groups are plain On-Demand: no reservation to match) and scaled (no
    # node group deployed yet).
    assert {row[0] for row in table} == {c.value for c in Check} - {"placement", "scaled"}
    assert all("PASS" in row for row in table), out
    assert "offering    p5 (p5.48xlarge)" in out
    assert "in standard support until 2026-12-28" in out
    assert "no VPC tagged platform:environment=prod in us-east-2: not deployed yet" in out
    assert "admin       PlatformAdmin" in out
    assert "leftover    log group /aws/eks/ml-prod/cluster" in out
    # 16 before issue 13; + admin 1, charts 3, leftovers 3 (EKS cluster, log group, FSx); + the
    # observability add-on (issue 15) and the kueue chart (issue 17).
    assert lines[-1] == "preflight passed for environment prod in us-east-2: 25 PASS, 0 WARN, 0 FAIL"
    # The requests really reached the stubs, with the documented quota codes.
    assert quotas.calls == [f"GetServiceQuota {P_QUOTA}", f"GetServiceQuota {G_QUOTA}"]
    assert eks.calls[0] == f"/cluster-versions clusterVersions={KUBERNETES_VERSION}&includeAll=true"
    # cluster versions, every managed add-on of prod (all are enabled there), DescribeCluster
    assert len(eks.calls) == 1 + len(MANAGED_ADDONS) + 1
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
    # offering, instance, quota, capacity, kubernetes, 7 add-ons (4 core + node monitoring, FSx CSI for dev's
    # checkpoint storage, CloudWatch observability), subnet, admin, 4 charts, 3 leftovers
    assert document["counts"] == {"PASS": 21, "WARN": 0, "FAIL": 0, "could_not_run": 0}
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
    # dev's add-ons: its checkpoint storage brings the FSx CSI driver (issue 17: shared checkpoints everywhere)
    assert subjects == {addon for addon in MANAGED_ADDONS}
    assert "eks-node-monitoring-agent" in subjects
    assert quotas.calls == [f"GetServiceQuota {G_QUOTA}"]  # dev has no P instances


def test_unknown_environment_is_exit_2_naming_the_value_and_the_known_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    known = "unknown environment 'staging'; known: dev, prod (declared in infra/spec/environments.py)"
    with pytest.raises(SystemExit) as exited:  # the parser refuses it, as every --env (trainctl/flags.py)
        main(["preflight", "--env", "staging", "--json"])
    out, err = capsys.readouterr()
    assert (exited.value.code, out) == (ExitCode.ERROR, "")
    assert f"trainctl preflight: error: argument --env: {known}" in err
    document = preflight("staging").to_json()  # the library refuses it too, before any AWS call
    assert (document["exit_code"], document["checks"], document["errors"]) == (2, [], [known])


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
    assert (row.status, row.reason) == (Status.FAIL, "64 vCPUs < 144 needed at max size (g6: 3 x 48)")


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


@pytest.mark.parametrize(
    ("end", "status"),
    [(END.isoformat(), Status.PASS), ("2026-12-27T11:30:00+00:00", Status.FAIL)],
    ids=["same", "moved"],
)
def test_capacity_block_end_is_its_end_date(
    end: str, status: Status, moto: MotoServer, quotas: FakeServiceQuotas, eks: FakeEks
) -> None:
    env = with_groups(PROD, gpu_group(kind=CapacityKind.CAPACITY_BLOCK, end=end))
    with started(Ec2Front(moto.url, reservations={RESERVATION: reservation()})) as front:
        row = only(checks(env, aws("us-east-2", front.url, eks, quotas)), Check.CAPACITY)
    assert row.status is status, row.reason
    assert ("capacity.end says 2026-12-27T11:30:00+00:00" in row.reason) == (status is Status.FAIL)


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
    code, out, err = run_cli(capsys, "--env", "prod", "--json", "--quiet", charts)
    document = json.loads(out)
    assert code == document["exit_code"] == ExitCode.ERROR
    assert err == ""  # --quiet: no progress lines; a NOT RUN row is no error line
    groups = PROD.gpu_node_groups
    on_demand = [g for g in groups if g.capacity.kind is CapacityKind.ON_DEMAND]
    # The leftovers' EKS cluster, log group and file systems; with no cluster found, no row per node group.
    leftovers = [f"EKS cluster {PROD.cluster.name}", f"log group {control_plane_log_group(PROD)}", "FSx file systems"]
    # The rows that need AWS: per GPU group, per vCPU quota of the on-demand groups, per add-on prod installs, per
    # admin principal; one for Kubernetes, one for the VPC (none found, so no row per subnet); the leftovers.
    expected = {
        "offering": len(groups),
        "instance": len(groups),
        "quota": len({quota_for(g.instance_type) for g in on_demand}),
        "kubernetes": 1,
        "add-on": len(environment_addons(PROD)),
        "subnet": 1,
        "admin": len(PROD.cluster.admin_principals),
        "leftover": len(leftovers),
    }
    not_run = [c for c in document["checks"] if not c["ran"]]
    assert Counter(c["check"] for c in not_run) == expected
    assert [c["subject"] for c in not_run if c["check"] == "leftover"] == leftovers
    assert document["counts"]["could_not_run"] == len(not_run) == sum(expected.values())
    assert {(c["status"], c["error_kind"]) for c in not_run} == {("NOT RUN", "no-credentials")}
    # Only the capacity rows of on-demand groups and the chart rows need no AWS call.
    ran = [("capacity", "PASS")] * len(on_demand) + [("chart", "PASS")] * len(HELM_CHARTS)
    assert [(c["check"], c["status"]) for c in document["checks"] if c["ran"]] == ran
    assert document["checks"][0]["reason"].startswith(
        "could not run: ec2:DescribeInstanceTypeOfferings: no AWS credentials found"
    )
    rows = sum(expected.values()) + len(ran)
    assert document["summary"].startswith(
        f"preflight incomplete for environment prod in us-east-2: {sum(expected.values())} of {rows} check(s)"
    )
    # Each row names its own call; the table lists the one shared fix once.
    assert {c["check"]: c["reason"].split(": ")[1] for c in not_run}["add-on"] == "eks:DescribeAddonVersions"
    code, out, _ = run_cli(capsys, "--env", "prod", charts)
    assert code == ExitCode.ERROR
    fixes = out.split("\nfixes:\n")[1].split("\n\n")[0].splitlines()
    assert fixes == [
        f"  {sum(expected.values())} rows ({', '.join(expected)}): configure credentials "
        "(aws configure, aws sso login, AWS_PROFILE or --profile) and run again"
    ]


def test_unreachable_ec2_is_not_run_and_not_retried_for_every_call(
    dead_url: str, moto: MotoServer, quotas: FakeServiceQuotas, eks: FakeEks
) -> None:
    results = checks(PROD, aws("us-east-2", dead_url, eks, quotas, others=moto.url, max_attempts=1))
    ec2_rows = [r for r in results if r.check in (Check.OFFERING, Check.INSTANCE, Check.SUBNET)]
    # One offering and one instance row per GPU group; one subnet row, as the VPC lookup itself failed.
    groups = len(PROD.gpu_node_groups)
    assert [r.check for r in ec2_rows] == [Check.OFFERING] * groups + [Check.INSTANCE] * groups + [Check.SUBNET]
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
    assert f"chart repository {CHARTS['*']}" in steps  # one fetch for the four charts it lists
    assert steps[-1] == "leftovers of earlier deployments of ml-dev"


# --- 7. reservation placement group -----------------------------------------------------------------

PLACEMENT_ARN = "arn:aws:ec2:us-east-2:123456789012:placement-group/p5-odcr"


def reserved_group(placement_group_name: str | None) -> GpuNodeGroupConfig:
    return dataclasses.replace(
        gpu_group(kind=CapacityKind.RESERVATION),
        capacity=Capacity(
            kind=CapacityKind.RESERVATION, reservation_id=RESERVATION, placement_group_name=placement_group_name
        ),
    )


@pytest.mark.parametrize(
    ("reserved_in", "declared", "status", "reason"),
    [
        (PLACEMENT_ARN, "p5-odcr", Status.PASS, f"{RESERVATION} was created in cluster placement group p5-odcr"),
        (None, None, Status.PASS, f"{RESERVATION} is not in a placement group and the group names none"),
        (
            PLACEMENT_ARN,
            None,
            Status.FAIL,
            f"{RESERVATION} was created in cluster placement group p5-odcr ({PLACEMENT_ARN}); only instances "
            "launched into that group use it, and the group names none",
        ),
        (
            PLACEMENT_ARN,
            "other-pg",
            Status.FAIL,
            "only instances launched into that group use it, and the group names other-pg",
        ),
        (
            None,
            "p5-odcr",
            Status.FAIL,
            f"the group launches into placement group p5-odcr, but {RESERVATION} was not created in a placement group",
        ),
    ],
    ids=["match", "neither", "reservation-only", "another-group", "spec-only"],
)
def test_reservation_placement_group_must_match_the_group(
    reserved_in: str | None,
    declared: str | None,
    status: Status,
    reason: str,
    moto: MotoServer,
    quotas: FakeServiceQuotas,
    eks: FakeEks,
) -> None:
    found = reservation(kind="default")
    if reserved_in is not None:
        found["PlacementGroupArn"] = reserved_in  # DescribeCapacityReservations' <placementGroupArn>
    env = with_groups(PROD, reserved_group(declared))
    with started(Ec2Front(moto.url, reservations={RESERVATION: found})) as front:
        results = checks(env, aws("us-east-2", front.url, eks, quotas))
        assert front.calls == ["DescribeCapacityReservations"]  # one call serves capacity and placement
    assert only(results, Check.CAPACITY).status is Status.PASS
    row = only(results, Check.PLACEMENT)
    assert row.status is status
    assert row.reason.startswith(reason) if status is Status.PASS else reason in row.reason, row.reason
    if status is Status.FAIL:
        assert row.fix is not None
        assert "capacity.placement_group_name of group p5" in row.fix
        if reserved_in is not None:
            assert row.fix.endswith("to 'p5-odcr'")


def test_placement_has_no_row_when_the_reservation_is_missing(
    moto: MotoServer, quotas: FakeServiceQuotas, eks: FakeEks
) -> None:
    with started(Ec2Front(moto.url)) as front:
        results = checks(with_groups(PROD, reserved_group("p5-odcr")), aws("us-east-2", front.url, eks, quotas))
    assert only(results, Check.CAPACITY).status is Status.FAIL
    assert rows(results, Check.PLACEMENT) == {}


# --- 8. admin principals ------------------------------------------------------------------------------


def with_admins(env: Environment, *principals: str) -> Environment:
    return dataclasses.replace(env, cluster=dataclasses.replace(env.cluster, admin_principals=principals))


def test_admin_principals_that_exist_pass_and_missing_ones_fail(
    fresh_moto: MotoServer, quotas: FakeServiceQuotas, eks: FakeEks
) -> None:
    iam = boto3.client("iam", region_name="us-east-1", endpoint_url=fresh_moto.url)
    iam.create_user(UserName="alice")
    iam.create_role(RoleName="Ops", Path="/team/", AssumeRolePolicyDocument="{}")
    env = with_admins(
        DEV,
        ADMIN,
        "MissingAdmin",
        "arn:aws:iam::123456789012:user/alice",
        "arn:aws:iam::123456789012:role/team/Ops",
        "arn:aws:iam::123456789012:role/Ops",
        "arn:aws:iam::123456789012:user/bob",
        "arn:aws:iam::210987654321:role/Auditor",
    )
    admin = rows(checks(env, aws("us-west-2", fresh_moto.url, eks, quotas)), Check.ADMIN)
    assert {s: r.status for s, r in admin.items()} == {
        ADMIN: Status.PASS,
        "MissingAdmin": Status.FAIL,
        "arn:aws:iam::123456789012:user/alice": Status.PASS,
        "arn:aws:iam::123456789012:role/team/Ops": Status.PASS,
        "arn:aws:iam::123456789012:role/Ops": Status.FAIL,
        "arn:aws:iam::123456789012:user/bob": Status.FAIL,
        "arn:aws:iam::210987654321:role/Auditor": Status.WARN,
    }
    assert admin[ADMIN].reason == f"role exists: arn:aws:iam::123456789012:role/{ADMIN}"
    missing = admin["MissingAdmin"]
    assert missing.reason == (
        "no IAM role named MissingAdmin in account 123456789012: EKS rejects its access entry "
        '("The specified principalArn is invalid") and the cluster\'s stack rolls back'
    )
    assert missing.fix == (
        "create the role in account 123456789012 (aws iam create-role --role-name MissingAdmin ...), "
        "or change cluster.admin_principals in infra/spec/environments.py"
    )
    assert admin["arn:aws:iam::123456789012:user/bob"].reason.startswith("no IAM user named bob")
    wrong_path = admin["arn:aws:iam::123456789012:role/Ops"]
    assert wrong_path.reason == (
        "nothing at that ARN: the role named Ops in account 123456789012 is "
        "arn:aws:iam::123456789012:role/team/Ops (another path)"
    )
    other = admin["arn:aws:iam::210987654321:role/Auditor"]
    assert other.reason == (
        "role Auditor is in account 210987654321, the credentials are account 123456789012's: not looked up"
    )


def test_admin_check_denied_by_iam_could_not_run(moto: MotoServer, quotas: FakeServiceQuotas, eks: FakeEks) -> None:
    with started(IamDenied()) as iam:
        session = aws("us-west-2", moto.url, eks, quotas)
        session.endpoint_urls["iam"] = iam.url
        results = checks(DEV, session)
        assert iam.calls == ["GetRole"]
    row = only(results, Check.ADMIN)
    assert (row.status, row.ran, row.error_kind) == (Status.NOT_RUN, False, "access-denied")
    assert row.reason.startswith("could not run: iam:GetRole: AccessDenied: User: ")
    assert row.fix == "allow iam:GetRole (read-only) for the caller, or run as a role that has it"
    assert PreflightReport("dev", "us-west-2", "us-west-2", results).exit_code is ExitCode.ERROR


# --- 9. pinned Helm chart versions ------------------------------------------------------------------

EFA_PIN = HELM_CHARTS["aws-efa-k8s-device-plugin"]
NVIDIA_PIN = HELM_CHARTS["nvidia-device-plugin"]


def listing(**replaced: list[str]) -> dict[str, list[str]]:
    """Every pinned chart at its pinned version, except the charts given (chart -> versions)."""
    listed = {pin.chart: [pin.version] for pin in HELM_CHARTS.values()}
    return {**listed, **{k.replace("_", "-"): v for k, v in replaced.items()}}


def chart_rows(repo: FakeChartRepo, prefix: str = "") -> dict[str, CheckResult]:
    results = chart_checks({ALL_CHARTS: repo.repository(prefix)}, timeout=5, say=lambda _: None)
    return {r.subject.split()[0]: r for r in results}


def test_a_pinned_version_missing_from_its_repository_fails_and_lists_the_newest() -> None:
    efa_versions = ["v0.5.14", "v0.5.13", "v0.5.9", "v0.5.10", "v0.4.4", "v0.3.3"]
    index = index_yaml(listing(aws_efa_k8s_device_plugin=efa_versions))
    with started(FakeChartRepo({"/index.yaml": (200, index)})) as repo:
        found = chart_rows(repo)
        assert repo.calls == ["/index.yaml"]  # one fetch for every pin on that repository
    efa = found[EFA_PIN.chart]
    assert (efa.status, efa.ran) == (Status.FAIL, True)
    assert efa.subject == f"aws-efa-k8s-device-plugin {EFA_PIN.version}"
    assert efa.reason == (
        f"version {EFA_PIN.version!r} is not in {repo.url}/index.yaml: the Helm install fails inside CloudFormation "
        "and rolls the stack back; newest listed: v0.5.14, v0.5.13, v0.5.10, v0.5.9, v0.4.4"
    )
    assert efa.fix == "pin a listed version of aws-efa-k8s-device-plugin in HELM_CHARTS (infra/spec/versions.py)"
    assert [found[p.chart].status for p in HELM_CHARTS.values() if p is not EFA_PIN] == [Status.PASS] * 3


def test_a_leading_v_mismatch_is_not_a_pass() -> None:
    # nvidia-device-plugin is pinned "0.20.0"; a repository listing only "v0.20.0".
    index = index_yaml(listing(nvidia_device_plugin=["v0.20.0", "v0.19.0"]))
    with started(FakeChartRepo({"/index.yaml": (200, index)})) as repo:
        row = chart_rows(repo)[NVIDIA_PIN.chart]
    assert row.status is Status.WARN
    assert row.reason == (
        "'0.20.0' is not listed, 'v0.20.0' is (Helm's semver match would install it); newest: v0.20.0, v0.19.0"
    )
    assert row.fix == "pin the exact string 'v0.20.0' for nvidia-device-plugin in HELM_CHARTS (infra/spec/versions.py)"


def test_a_chart_missing_from_the_index_and_a_404_fail() -> None:
    without_efa = {k: v for k, v in listing().items() if k != EFA_PIN.chart}
    routes = {"/a/index.yaml": (200, index_yaml(without_efa))}
    with started(FakeChartRepo(routes)) as repo:
        missing = chart_rows(repo, "/a")[EFA_PIN.chart]
        absent = chart_rows(repo, "/nothing-here")[EFA_PIN.chart]
    assert (missing.status, missing.ran) == (Status.FAIL, True)
    assert missing.reason == f"{repo.url}/a/index.yaml has no chart named aws-efa-k8s-device-plugin (3 charts listed)"
    assert (absent.status, absent.ran) == (Status.FAIL, True)
    assert absent.reason == f"no Helm repository index: GET {repo.url}/nothing-here/index.yaml: HTTP 404 Not Found"
    assert absent.fix is not None
    assert "correct the repository of aws-efa-k8s-device-plugin in HELM_CHARTS" in absent.fix


def test_malformed_index_and_dead_repository_could_not_run(dead_url: str) -> None:
    with started(FakeChartRepo({"/index.yaml": (200, b"apiVersion: v1\nentries: {a: [\n")})) as repo:
        malformed = chart_rows(repo)
    assert {(r.status, r.ran, r.error_kind) for r in malformed.values()} == {(Status.NOT_RUN, False, "malformed")}
    assert malformed[EFA_PIN.chart].reason.startswith(f"could not run: {repo.url}/index.yaml is not valid YAML")
    results = chart_checks({ALL_CHARTS: dead_url}, timeout=5, say=lambda _: None)
    assert {(r.status, r.ran, r.error_kind) for r in results} == {(Status.NOT_RUN, False, "unreachable")}
    assert results[0].fix == f"check network access to {dead_url}/index.yaml (proxy, firewall) and run again"
    report = PreflightReport("dev", "us-west-2", "us-west-2", results)
    assert report.exit_code is ExitCode.ERROR


def test_cli_chart_repository_per_chart_override(
    moto: MotoServer, quotas: FakeServiceQuotas, eks: FakeEks, capsys: pytest.CaptureFixture[str]
) -> None:
    index = index_yaml({EFA_PIN.chart: ["v0.5.14"]})
    with started(FakeChartRepo({"/efa/index.yaml": (200, index)})) as efa_repo:
        code, out, _ = run_cli(
            capsys,
            "--env",
            "dev",
            "--json",
            *endpoint_args(moto.url, eks, quotas),
            f"--chart-repository=aws-efa-k8s-device-plugin={efa_repo.url}/efa",
        )
        assert efa_repo.calls == ["/efa/index.yaml"]
    document = json.loads(out)
    assert code == ExitCode.CHECK_FAILED
    chart = {c["subject"]: c for c in document["checks"] if c["check"] == "chart"}
    assert chart[f"aws-efa-k8s-device-plugin {EFA_PIN.version}"]["status"] == "FAIL"
    assert chart[f"nvidia-device-plugin {NVIDIA_PIN.version}"]["status"] == "PASS"  # from the "*" repository
    assert chart[f"aws-efa-k8s-device-plugin {EFA_PIN.version}"]["api"] == (
        "HTTP GET <repository>/index.yaml; oci:// charts: HEAD /v2/<chart>/manifests/<version>"
    )


# --- 10. leftovers of an earlier deployment ----------------------------------------------------------------

CLUSTER = {
    "name": "ml-prod",
    "arn": "arn:aws:eks:us-east-2:123456789012:cluster/ml-prod",
    "createdAt": START.timestamp(),
    "version": KUBERNETES_VERSION,
    "status": "ACTIVE",
}


def leftovers(results: Sequence[CheckResult]) -> dict[str, CheckResult]:
    return rows(results, Check.LEFTOVER)


@pytest.mark.parametrize(
    ("stacks", "status", "reason"),
    [
        (
            {"ml-prod-platform": [stack_resource("EksCluster", "AWS::EKS::Cluster", "ml-prod")]},
            Status.PASS,
            "belongs to stack ml-prod-platform: the deploy updates it",
        ),
        (
            {},
            Status.FAIL,
            "a cluster of that name exists (ACTIVE, created 2026-12-14) and stack ml-prod-platform does not exist: "
            "creating it fails (ResourceInUseException) and rolls the stack back",
        ),
        (
            # The first create rolled back: the stack is ROLLBACK_COMPLETE and lists the cluster deleted.
            {"ml-prod-platform": [stack_resource("EksCluster", "AWS::EKS::Cluster", "ml-prod", "DELETE_COMPLETE")]},
            Status.FAIL,
            "and stack ml-prod-platform does not hold it",
        ),
    ],
    ids=["owned", "no-stack", "rolled-back-stack"],
)
def test_an_eks_cluster_of_the_name_outside_the_platform_stack_fails(
    stacks: dict[str, list[dict[str, Any]]],
    status: Status,
    reason: str,
    moto: MotoServer,
    quotas: FakeServiceQuotas,
) -> None:
    with (
        started(eks_offering()) as eks,
        started(FakeCloudFormation(stacks)) as cloudformation,
    ):
        eks.clusters["ml-prod"] = CLUSTER
        session = aws("us-east-2", moto.url, eks, quotas)
        session.endpoint_urls["cloudformation"] = cloudformation.url
        results = checks(PROD, session)
        assert cloudformation.calls[0] == "ListStackResources ml-prod-platform"
    row = leftovers(results)["EKS cluster ml-prod"]
    assert row.status is status
    assert reason in row.reason
    if status is Status.FAIL:
        assert row.fix is not None
        assert "aws eks delete-cluster --name ml-prod --region us-east-2" in row.fix
        assert "or change cluster.name in infra/spec/environments.py" in row.fix


def test_the_control_plane_log_group_is_reported_and_never_blocks(
    fresh_moto: MotoServer, quotas: FakeServiceQuotas, eks: FakeEks
) -> None:
    name = "/aws/eks/ml-prod/cluster"
    absent = leftovers(checks(PROD, aws("us-east-2", fresh_moto.url, eks, quotas)))[f"log group {name}"]
    assert (absent.status, absent.reason) == (Status.PASS, "does not exist: the deploy creates it (365 days)")
    logs = boto3.client("logs", region_name="us-east-2", endpoint_url=fresh_moto.url)
    logs.create_log_group(logGroupName=name)
    logs.put_retention_policy(logGroupName=name, retentionInDays=30)
    logs.create_log_group(logGroupName=f"{name}-other")  # a prefix match only: not the group
    present = leftovers(checks(PROD, aws("us-east-2", fresh_moto.url, eks, quotas)))[f"log group {name}"]
    assert present.status is Status.PASS
    assert present.reason.startswith("exists (30 days, ")
    assert present.reason.endswith("bytes): the deploy adopts it and sets 365 days")


def create_file_system(moto: MotoServer, environment: str) -> str:
    fsx = boto3.client("fsx", region_name="us-east-2", endpoint_url=moto.url)
    created = fsx.create_file_system(
        FileSystemType="LUSTRE",
        StorageCapacity=4800,
        SubnetIds=["subnet-0123456789abcdef0"],
        Tags=[
            {"Key": "platform:environment", "Value": environment},
            {"Key": "aws:cloudformation:stack-name", "Value": "ml-prod-storage"},
        ],
    )
    file_system_id: str = created["FileSystem"]["FileSystemId"]
    return file_system_id


def test_a_retained_file_system_outside_the_storage_stack_warns(
    fresh_moto: MotoServer, quotas: FakeServiceQuotas, eks: FakeEks
) -> None:
    kept = create_file_system(fresh_moto, "prod")
    owned = create_file_system(fresh_moto, "prod")
    moved = create_file_system(fresh_moto, "prod")
    create_file_system(fresh_moto, "dev")  # another environment's: not looked at
    stacks = {
        "ml-prod-storage": [
            stack_resource("CheckpointsFileSystem", "AWS::FSx::FileSystem", owned),
            # What a rolled-back create leaves listed for a retained file system.
            stack_resource("OldFileSystem", "AWS::FSx::FileSystem", kept, "DELETE_SKIPPED"),
        ],
        "ml-prod-platform": [stack_resource("AddOnsCheckpointsFileSystem", "AWS::FSx::FileSystem", moved)],
    }
    with started(FakeCloudFormation(stacks)) as cloudformation:
        session = aws("us-east-2", fresh_moto.url, eks, quotas)
        session.endpoint_urls["cloudformation"] = cloudformation.url
        found = leftovers(checks(PROD, session))
        # Each stack is asked once, though two checks read the platform stack.
        assert sorted(cloudformation.calls) == [
            "ListStackResources ml-prod-platform",
            "ListStackResources ml-prod-storage",
        ]
    fsx = {s: r for s, r in found.items() if s.startswith("FSx ")}
    assert set(fsx) == {f"FSx {kept}", f"FSx {owned}", f"FSx {moved}"}
    assert fsx[f"FSx {owned}"].status is Status.PASS
    assert fsx[f"FSx {owned}"].reason.startswith("belongs to stack ml-prod-storage (4800 GiB, ")
    leftover = fsx[f"FSx {kept}"]
    assert leftover.status is Status.WARN
    assert "tagged platform:environment=prod (4800 GiB, " in leftover.reason
    assert leftover.reason.endswith(
        "but stack ml-prod-storage does not hold it: a retained leftover that keeps costing; "
        "the deploy creates a second file system beside it"
    )
    assert leftover.fix == (
        "import it into ml-prod-storage (cdk import) to keep its data, or copy what you need and delete it "
        f"(aws fsx delete-file-system --file-system-id {kept} --region us-east-2)"
    )
    assert fsx[f"FSx {moved}"].status is Status.WARN
    assert "belongs to stack ml-prod-platform (the layout before the storage stack" in fsx[f"FSx {moved}"].reason


def test_no_tagged_file_system_is_one_pass_row(fresh_moto: MotoServer, quotas: FakeServiceQuotas, eks: FakeEks) -> None:
    create_file_system(fresh_moto, "dev")
    found = leftovers(checks(PROD, aws("us-east-2", fresh_moto.url, eks, quotas)))
    assert found["FSx file systems"].status is Status.PASS
    assert found["FSx file systems"].reason == "no file system tagged platform:environment=prod"
    assert not [s for s in found if s.startswith("FSx fs-")]


def nodegroup(name: str) -> dict[str, Any]:
    return {
        "nodegroupName": name,
        "clusterName": "ml-prod",
        "nodegroupArn": f"arn:aws:eks:us-east-2:123456789012:nodegroup/ml-prod/{name}/0",
        "status": "ACTIVE",
    }


def test_a_gpu_node_group_of_the_fixed_name_outside_its_stack_fails(
    moto: MotoServer, quotas: FakeServiceQuotas
) -> None:
    platform = [stack_resource("EksCluster", "AWS::EKS::Cluster", "ml-prod")]
    stacks = {
        "ml-prod-platform": [
            *platform,
            stack_resource("GpuNodesg6", "AWS::EKS::Nodegroup", "ml-prod/ml-prod-g6-us-east-2a-od"),
        ],
        # The p5 stack's delete failed half-way: its node group is listed deleted, yet EKS still has it.
        "ml-prod-gpu-p5": [
            stack_resource("GpuNodesp5", "AWS::EKS::Nodegroup", "ml-prod/ml-prod-p5-us-east-2a-od", "DELETE_FAILED")
        ],
    }
    with (
        started(eks_offering()) as eks,
        started(FakeCloudFormation(stacks)) as cloudformation,
    ):
        eks.clusters["ml-prod"] = CLUSTER
        eks.nodegroups = {
            ("ml-prod", "ml-prod-p5-us-east-2a-od"): nodegroup("ml-prod-p5-us-east-2a-od"),
            ("ml-prod", "ml-prod-g6-us-east-2a-od"): nodegroup("ml-prod-g6-us-east-2a-od"),
        }
        session = aws("us-east-2", moto.url, eks, quotas)
        session.endpoint_urls["cloudformation"] = cloudformation.url
        found = leftovers(checks(PROD, session))
        assert "/clusters/ml-prod/node-groups/ml-prod-p5-us-east-2a-od " in eks.calls
    assert found["EKS cluster ml-prod"].status is Status.PASS
    p5 = found["node group ml-prod-p5-us-east-2a-od"]
    assert p5.status is Status.FAIL
    assert p5.reason == (
        "exists (ACTIVE) and stack ml-prod-gpu-p5 does not hold it: creating it fails (ResourceInUseException) "
        "and rolls the stack back"
    )
    assert p5.fix is not None
    assert (
        "aws eks delete-nodegroup --cluster-name ml-prod --nodegroup-name ml-prod-p5-us-east-2a-od --region us-east-2"
        in p5.fix
    )
    g6 = found["node group ml-prod-g6-us-east-2a-od"]
    assert g6.status is Status.WARN
    assert g6.reason.startswith("belongs to stack ml-prod-platform (the layout before the GPU stacks)")
    # Owned by its own stack: an update.
    stacks["ml-prod-gpu-p5"] = [stack_resource("GpuNodesp5", "AWS::EKS::Nodegroup", "ml-prod/ml-prod-p5-us-east-2a-od")]
    with (
        started(eks_offering()) as eks,
        started(FakeCloudFormation(stacks)) as cloudformation,
    ):
        eks.clusters["ml-prod"] = CLUSTER
        eks.nodegroups = {("ml-prod", "ml-prod-p5-us-east-2a-od"): nodegroup("ml-prod-p5-us-east-2a-od")}
        session = aws("us-east-2", moto.url, eks, quotas)
        session.endpoint_urls["cloudformation"] = cloudformation.url
        found = leftovers(checks(PROD, session))
    assert found["node group ml-prod-p5-us-east-2a-od"].status is Status.PASS
    assert found["node group ml-prod-g6-us-east-2a-od"].reason == "none in cluster ml-prod"


def test_no_cluster_means_no_node_group_lookups(moto: MotoServer, quotas: FakeServiceQuotas, eks: FakeEks) -> None:
    found = leftovers(checks(PROD, aws("us-east-2", moto.url, eks, quotas)))
    assert not [s for s in found if s.startswith("node group")]
    assert not [c for c in eks.calls if "/node-groups/" in c]


def test_a_node_group_scaled_away_from_desired_size_is_warned_with_the_fix(
    moto: MotoServer, quotas: FakeServiceQuotas
) -> None:
    """Issue 22 #5: `trainctl scale` moved p5 to 2 nodes and its Kueue quota with it; a cdk deploy may set either
    back to desired_size 0, so the row says so and names the command that puts them together again."""
    stacks = {
        "ml-prod-platform": [stack_resource("EksCluster", "AWS::EKS::Cluster", "ml-prod")],
        "ml-prod-gpu-p5": [stack_resource("GpuNodesp5", "AWS::EKS::Nodegroup", "ml-prod/ml-prod-p5-us-east-2a-od")],
        "ml-prod-gpu-g6": [stack_resource("GpuNodesg6", "AWS::EKS::Nodegroup", "ml-prod/ml-prod-g6-us-east-2a-od")],
    }
    with started(eks_offering()) as eks, started(FakeCloudFormation(stacks)) as cloudformation:
        eks.clusters["ml-prod"] = CLUSTER
        eks.nodegroups = {
            ("ml-prod", name): {**nodegroup(name), "scalingConfig": {"minSize": 0, "maxSize": high, "desiredSize": n}}
            for name, high, n in (("ml-prod-p5-us-east-2a-od", 8, 2), ("ml-prod-g6-us-east-2a-od", 4, 0))
        }
        session = aws("us-east-2", moto.url, eks, quotas)
        session.endpoint_urls["cloudformation"] = cloudformation.url
        scaled = {r.subject: r for r in checks(PROD, session) if r.check is Check.SCALED}
    p5, g6 = scaled["p5 (p5.48xlarge)"], scaled["g6 (g6.12xlarge)"]
    assert p5.status is Status.WARN
    assert p5.reason.startswith("node group ml-prod-p5-us-east-2a-od has desired size 2 (trainctl scale) where")
    assert p5.fix == (
        "after the deploy, run `trainctl scale --env prod --group p5 --nodes 2` to put nodes and quota together "
        "again (`trainctl status` shows both)"
    )
    assert (g6.status, g6.reason) == (Status.PASS, "desired size 0, as the spec deploys it and its quota covers")
