"""`trainctl capacity` against moto (zones, offerings, instances), a loopback EC2 front for what moto lacks
(capacity reservations that change state, cancels that fail, Spot placement scores) and Service Quotas."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from infra.spec import get_environment
from tests.trainctl.fake_aws import CapacityEc2, FakeServiceQuotas, MotoServer
from trainctl.capacity import CapacityReport, find_capacity
from trainctl.capacity_probe import Verdict
from trainctl.cli import main

pytestmark = pytest.mark.usefixtures("fake_aws_credentials")

ENV = get_environment("prod")
GROUP = next(g for g in ENV.gpu_node_groups if g.name == "g6")
QUOTA = "L-DB2E81BA"  # G and VT


@pytest.fixture
def quotas() -> Iterator[FakeServiceQuotas]:
    server = FakeServiceQuotas({QUOTA: 1000.0, "L-417A185B": 1000.0})
    server.start()
    yield server
    server.stop()


def run(
    moto: MotoServer,
    quotas: FakeServiceQuotas,
    *,
    probe: bool = False,
    sleep: Any = None,
    nodes: int | None = 2,
    **front: Any,
) -> tuple[CapacityReport, CapacityEc2, list[str]]:
    ec2 = CapacityEc2(moto.url, **front)
    ec2.start()
    said: list[str] = []
    try:
        report, _ = find_capacity(
            ENV.name,
            group_name=GROUP.name,
            nodes=nodes,
            probe=probe,
            endpoint_urls={"ec2": ec2.url, "service-quotas": quotas.url},
            say=said.append,
            poll_s=0.01,
            settle_s=1.0,
            sleep=sleep or (lambda s: None),
        )
    finally:
        ec2.stop()
    return report, ec2, said


def zone_ids(moto: MotoServer) -> dict[str, str]:
    import boto3

    ec2 = boto3.client("ec2", region_name=ENV.region, endpoint_url=moto.url)
    return {z["ZoneName"]: z["ZoneId"] for z in ec2.describe_availability_zones()["AvailabilityZones"]}


def test_every_zone_judged_and_the_gpu_zone_recommended(moto: MotoServer, quotas: FakeServiceQuotas) -> None:
    ids = zone_ids(moto)
    report, ec2, _ = run(moto, quotas, spot_scores={ids[ENV.gpu_availability_zone]: 3, ids["us-east-2b"]: 9})
    zones = {z.name: z for z in report.zones}
    assert set(ENV.network.availability_zones) <= set(zones)
    for name in ENV.network.availability_zones:
        assert zones[name].subnet == "planned"
        assert zones[name].headroom == 1000 - 2 * GROUP.instance.vcpus
    assert zones["us-east-2b"].spot_score == 9
    assert "GetSpotPlacementScores" in ec2.calls
    best = report.recommended()
    assert best is not None
    # A better Spot score elsewhere is a hint only: the GPU zone stays recommended when it qualifies.
    if zones[ENV.gpu_availability_zone].verdict is Verdict.YES:
        assert best.name == ENV.gpu_availability_zone
        assert report.advice(ENV) is None
    assert report.exit_code == 0


# A spare for every gated gang: a node the fabric gate takes out (tainted) is replaced only by an untainted spare.


def test_a_gated_group_is_sized_to_its_gang_and_a_spare_by_default(moto: MotoServer, quotas: FakeServiceQuotas) -> None:
    assert GROUP.workload_nodes == 2
    report, _, _ = run(moto, quotas, nodes=None)
    assert report.nodes == 3
    assert {z.needed_vcpus for z in report.zones} == {3 * GROUP.instance.vcpus}
    assert not [w for w in report.warnings if "spare" in w]
    assert report.summary(ENV).startswith(f"recommended zone for 3 x {GROUP.instance_type} (group {GROUP.name})")


def test_the_gang_alone_warns_naming_the_group_the_gang_the_nodes_and_the_fix(
    moto: MotoServer, quotas: FakeServiceQuotas
) -> None:
    report, _, _ = run(moto, quotas, nodes=2)
    (warning,) = [w for w in report.warnings if "spare" in w]
    assert warning.startswith(f"group {GROUP.name}: 2 node(s) give its gated gang of 2 no spare")
    assert f"Fix: trainctl capacity --env {ENV.name} --group {GROUP.name} --nodes 3" in warning
    _, err = report.render(ENV)
    assert f"warning: {warning}\n" in err
    assert warning in report.to_json(ENV)["warnings"]
    assert report.exit_code == 0  # a warning: the zones still say where 2 nodes launch


def test_quota_short_everywhere_is_exit_1(moto: MotoServer) -> None:
    quotas = FakeServiceQuotas({QUOTA: 8.0})
    quotas.start()
    try:
        report, _, _ = run(moto, quotas)
    finally:
        quotas.stop()
    assert all(z.verdict is Verdict.NO for z in report.zones)
    assert report.exit_code == 1
    assert any("request-service-quota-increase" in n for z in report.zones for n in z.notes)


def test_probe_creates_a_limited_targeted_reservation_and_verifies_its_cancel(
    moto: MotoServer, quotas: FakeServiceQuotas
) -> None:
    report, ec2, said = run(moto, quotas, probe=True, created_state="pending", settles_to="active")
    assert ec2.created, "no reservation was created"
    first = ec2.created[0]
    assert first["InstanceCount"] == "2"
    assert first["EndDateType"] == "limited"
    assert first["InstanceMatchCriteria"] == "targeted"
    assert first["ClientToken"].startswith("trainctl-probe-")
    assert sorted(ec2.cancelled) == sorted(str(p.reservation_id) for p in report.probes)
    assert all(p.cancelled and p.state == "active" for p in report.probes)
    assert any("billed" in line for line in said)
    assert report.exit_code == 0


def test_insufficient_capacity_is_a_no(moto: MotoServer, quotas: FakeServiceQuotas) -> None:
    report, ec2, _ = run(
        moto,
        quotas,
        probe=True,
        create_error=("InsufficientInstanceCapacity", "We currently do not have sufficient capacity"),
    )
    assert report.probes
    assert all(p.verdict is Verdict.NO and p.reservation_id is None for p in report.probes)
    assert ec2.cancelled == []
    assert report.exit_code == 1


def test_failing_cancel_is_retried_and_said_out_loud(moto: MotoServer, quotas: FakeServiceQuotas) -> None:
    report, _, said = run(moto, quotas, probe=True, cancel_failures=2)
    assert all(p.cancelled for p in report.probes)
    assert sum("cancelling" in line and "failed (attempt" in line for line in said) >= 2
    assert report.exit_code == 0


def test_cancel_that_never_works_exits_2_naming_the_reservation_and_the_command(
    moto: MotoServer, quotas: FakeServiceQuotas
) -> None:
    report, _, _ = run(moto, quotas, probe=True, cancel_failures=1000)
    left = report.left_behind
    assert left
    _, err = report.render(ENV)
    for probe in left:
        assert str(probe.reservation_id) in err
        assert f"aws ec2 cancel-capacity-reservation --capacity-reservation-id {probe.reservation_id}" in err
    assert report.exit_code == 2
    assert report.to_json(ENV)["left_behind"]


def test_interrupted_probe_still_cancels(moto: MotoServer, quotas: FakeServiceQuotas) -> None:
    calls = {"n": 0}

    def interrupting_sleep(seconds: float) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt

    report, ec2, _ = run(
        moto,
        quotas,
        probe=True,
        created_state="pending",
        settles_to="active",
        settle_after=99,
        sleep=interrupting_sleep,
    )
    assert len(report.probes) == 1, "the remaining zones must not be probed after an interrupt"
    probe = report.probes[0]
    assert probe.interrupted
    assert probe.cancelled
    assert ec2.cancelled == [probe.reservation_id]
    assert report.exit_code == 2


def test_unknown_group_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["capacity", "--env", "prod", "--group", "nope", "--json"])
    document = json.loads(capsys.readouterr().out)
    assert code == 2
    assert "'nope'" in document["errors"][0]
    assert "p5" in document["errors"][0]
