"""In which availability zone can N GPU nodes of a group launch now: per zone the offering, the vCPU quota
headroom, the subnet, the Spot placement score and (probe) a reservation created and cancelled at once,
as a CapacityReport with a recommended zone (trainctl/commands/capacity.py is the command, its docstring
the columns and their API calls).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infra.spec import ConfigError, Environment, GpuNodeGroupConfig, get_environment
from trainctl import gate_taints
from trainctl.aws import (
    Aws,
    AwsError,
)
from trainctl.capacity_probe import POLL_S, PROBE_SETTLE_S, Probe, Verdict, probe_zone
from trainctl.exit_codes import ExitCode
from trainctl.output import table
from trainctl.preflight.quota import quota_for
from trainctl.preflight.results import ENVIRONMENT_TAG

ENVIRONMENTS_FILE = "infra/spec/environments.py"
# A column whose API call failed (see the notes under the table); the zone's verdict is then unknown.
NOT_READ = "not read"


@dataclass
class Zone:
    region: str
    name: str
    zone_id: str | None = None
    offered: bool | None = None
    quota: float | None = None
    used_vcpus: int | None = None
    needed_vcpus: int = 0
    subnet: str | None = None
    """yes (subnet-...), planned, or no; None: could not tell."""
    subnet_ok: bool | None = None
    spot_score: int | None = None
    probe: Probe | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def headroom(self) -> float | None:
        if self.quota is None or self.used_vcpus is None:
            return None
        return self.quota - self.used_vcpus - self.needed_vcpus

    def checks(self) -> list[bool | None]:
        headroom = self.headroom
        found: list[bool | None] = [self.offered, None if headroom is None else headroom >= 0, self.subnet_ok]
        if self.probe is not None:
            probe = self.probe.verdict
            found.append(None if probe is Verdict.UNKNOWN else probe is Verdict.YES)
        return found

    @property
    def verdict(self) -> Verdict:
        checks = self.checks()
        if any(c is False for c in checks):
            return Verdict.NO
        if any(c is None for c in checks):
            return Verdict.UNKNOWN
        return Verdict.YES

    def row(self) -> list[str]:
        headroom = self.headroom
        quota = NOT_READ if headroom is None else f"{headroom:+g} vCPUs"
        offered = {True: "yes", False: "no", None: NOT_READ}[self.offered]
        spot = "-" if self.spot_score is None else f"{self.spot_score}/10"
        probe = "-" if self.probe is None else self.probe.describe()
        return [self.region, self.name, offered, quota, self.subnet or NOT_READ, spot, probe, self.verdict.value]

    def to_json(self) -> dict[str, Any]:
        return {
            "region": self.region,
            "zone": self.name,
            "zone_id": self.zone_id,
            "offered": self.offered,
            "quota_vcpus": self.quota,
            "running_vcpus": self.used_vcpus,
            "needed_vcpus": self.needed_vcpus,
            "headroom_vcpus": self.headroom,
            "subnet": self.subnet,
            "subnet_ok": self.subnet_ok,
            "spot_placement_score": self.spot_score,
            "probe": None if self.probe is None else self.probe.to_json(),
            "verdict": self.verdict.value,
            "notes": list(self.notes),
        }


@dataclass
class CapacityReport:
    environment: str
    group: str | None = None
    instance_type: str | None = None
    nodes: int = 0
    gpu_zone: str | None = None
    zones: list[Zone] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    interrupted: bool = False

    @property
    def probes(self) -> list[Probe]:
        return [z.probe for z in self.zones if z.probe is not None]

    @property
    def left_behind(self) -> list[Probe]:
        return [p for p in self.probes if p.left_behind]

    def recommended(self) -> Zone | None:
        """A zone that can take the nodes: a probed one first, then the GPU zone, then the best Spot score."""
        good = [z for z in self.zones if z.verdict is Verdict.YES]
        if not good:
            return None
        return min(
            good,
            key=lambda z: (z.probe is None, z.name != self.gpu_zone, -(z.spot_score or 0), z.region, z.name),
        )

    @property
    def exit_code(self) -> ExitCode:
        if self.errors or self.left_behind or self.interrupted:
            return ExitCode.ERROR
        if self.recommended() is not None:
            return ExitCode.OK
        if self.zones and all(z.verdict is Verdict.NO for z in self.zones):
            return ExitCode.CHECK_FAILED
        return ExitCode.ERROR

    def advice(self, env: Environment | None) -> str | None:
        best = self.recommended()
        if best is None or env is None:
            return None
        if best.name == self.gpu_zone:
            return None
        if best.region != env.region:
            return (
                f"environment {env.name} is in {env.region}: to use {best.name}, set region={best.region!r}, "
                f"network.availability_zones (with {best.name!r}) and gpu_availability_zone={best.name!r} of "
                f"{env.name} in {ENVIRONMENTS_FILE} (a new VPC and cluster)"
            )
        extra = (
            ""
            if best.name in env.network.availability_zones
            else f", and add {best.name!r} to network.availability_zones (a new private subnet)"
        )
        return (
            f"set gpu_availability_zone={best.name!r} for environment {env.name} in {ENVIRONMENTS_FILE}{extra}; "
            "the GPU node groups move (replaced)"
            + (
                " and so does the checkpoint file system (FSx lives in the GPU zone)"
                if env.add_ons.checkpoint_storage
                else ""
            )
        )

    def summary(self, env: Environment | None) -> str:
        if self.errors:
            return f"capacity could not run: {self.errors[0]}"
        what = f"{self.nodes} x {self.instance_type} (group {self.group})"
        best = self.recommended()
        if best is None:
            unknown = [z.name for z in self.zones if z.verdict is Verdict.UNKNOWN]
            if unknown:
                return f"no zone confirmed for {what}; could not tell for {', '.join(unknown)} (see notes)"
            return f"no zone can take {what} now"
        how = "probe: reservation active" if best.probe is not None else "offered, quota, subnet; not probed"
        match = (
            f"matches gpu_availability_zone ({self.gpu_zone})"
            if best.name == self.gpu_zone
            else f"differs from gpu_availability_zone ({self.gpu_zone})"
        )
        return f"recommended zone for {what}: {best.name} ({how}); {match}"

    def to_json(self, env: Environment | None = None) -> dict[str, Any]:
        best = self.recommended()
        return {
            "command": "capacity",
            "environment": self.environment,
            "group": self.group,
            "instance_type": self.instance_type,
            "nodes": self.nodes,
            "gpu_availability_zone": self.gpu_zone,
            "recommended_zone": None if best is None else best.name,
            "recommended_region": None if best is None else best.region,
            "matches_gpu_availability_zone": None if best is None else best.name == self.gpu_zone,
            "change": self.advice(env),
            "exit_code": int(self.exit_code),
            "summary": self.summary(env),
            "zones": [z.to_json() for z in self.zones],
            "spot_placement_score_is_a_hint": True,
            "left_behind": [p.to_json() for p in self.left_behind],
            "warnings": list(self.warnings),
            "errors": list(self.errors),
        }

    def render(self, env: Environment | None) -> tuple[str, str]:
        err = [f"warning: {w}" for w in self.warnings] + [f"error: {e}" for e in self.errors]
        for probe in self.left_behind:
            err.append(
                f"ERROR: capacity reservation {probe.reservation_id} in {probe.zone} may still exist and is billed "
                f"until cancelled ({probe.cancel_error}). Cancel it now: {probe.cancel_command()}"
            )
        if self.errors and not self.zones:
            return "", "".join(f"{line}\n" for line in err)
        headers = ["REGION", "ZONE", "OFFERED", "QUOTA HEADROOM", "SUBNET", "SPOT (HINT)", "PROBE", "CAN TAKE"]
        out = [table(headers, [z.row() for z in self.zones]), ""]
        notes = [f"  {z.name}: {note}" for z in self.zones for note in z.notes]
        if notes:
            out += ["notes:", *notes, ""]
        out.append("SPOT is EC2's Spot placement score for the same count: a hint about spare capacity, not a verdict.")
        out.append(self.summary(env))
        change = self.advice(env)
        if change:
            out.append(f"to use it: {change}")
        return "\n".join(out) + "\n", "".join(f"{line}\n" for line in err)


# --- the zones ---------------------------------------------------------------------------------


def _deployed_private_zones(env: Environment, aws: Aws) -> dict[str, str] | None:
    """Zone -> private subnet id of the environment's deployed VPC; None if it is not deployed."""
    vpcs = [v for v in aws.vpcs_tagged(ENVIRONMENT_TAG, env.name) if v.get("CidrBlock") == env.network.cidr]
    if not vpcs:
        return None
    subnets = aws.private_subnets(str(vpcs[0]["VpcId"]))
    return {str(s.get("AvailabilityZone")): str(s.get("SubnetId")) for s in subnets}


def _region_zones(
    env: Environment, group: GpuNodeGroupConfig, nodes: int, aws: Aws, report: CapacityReport
) -> list[Zone]:
    region = aws.region
    try:
        listed = aws.availability_zones()
    except AwsError as exc:
        report.errors.append(f"zones of {region}: {exc.api}: {exc}")
        return []
    zones = [
        Zone(region=region, name=str(z["ZoneName"]), zone_id=z.get("ZoneId"), needed_vcpus=nodes * group.instance.vcpus)
        for z in sorted(listed, key=lambda z: str(z["ZoneName"]))
        if z.get("State", "available") == "available"
    ]

    def each(note: str, action: Callable[[], None]) -> None:
        try:
            action()
        except AwsError as exc:
            for zone in zones:
                zone.notes.append(f"{note} could not be read: {exc.api}: {exc}")

    for zone in zones:
        try:
            zone.offered = group.instance_type in aws.offered_instance_types(zone.name, [group.instance_type])
        except AwsError as exc:
            zone.notes.append(f"offering could not be read: {exc.api}: {exc}")
        if zone.offered is False:
            zone.notes.append(f"{group.instance_type} is not offered here")

    quota = quota_for(group.instance_type)

    def quotas() -> None:
        if quota is None:
            for zone in zones:
                zone.notes.append(f"no On-Demand vCPU quota known for {group.instance_type}; check it by hand")
            return
        value = float(aws.service_quota(quota.code)["Value"])
        used = aws.running_vcpus(quota.families)
        for zone in zones:
            zone.quota, zone.used_vcpus = value, used
            if zone.headroom is not None and zone.headroom < 0:
                zone.notes.append(
                    f"{quota.code} ({quota.name}) is {value:g} vCPUs, {used} in use, {zone.needed_vcpus} needed: "
                    f"aws service-quotas request-service-quota-increase --service-code ec2 --quota-code {quota.code} "
                    f"--desired-value {used + zone.needed_vcpus} --region {region}"
                )

    each("the vCPU quota", quotas)

    def subnets() -> None:
        if region != env.region:
            for zone in zones:
                zone.subnet, zone.subnet_ok = f"no (env in {env.region})", False
            return
        deployed = _deployed_private_zones(env, aws)
        for zone in zones:
            if deployed is not None:
                subnet = deployed.get(zone.name)
                zone.subnet, zone.subnet_ok = (f"yes ({subnet})", True) if subnet else ("no", False)
                if subnet is None:
                    zone.notes.append("the deployed VPC has no private subnet here")
            elif zone.name in env.network.availability_zones:
                zone.subnet, zone.subnet_ok = "planned", True
            else:
                zone.subnet, zone.subnet_ok = "no", False
                zone.notes.append(f"not in network.availability_zones of {env.name} ({ENVIRONMENTS_FILE})")

    each("the VPC's subnets", subnets)

    def spot() -> None:
        scores = aws.spot_placement_scores(group.instance_type, nodes, [region])
        by_id = {str(s.get("AvailabilityZoneId")): s.get("Score") for s in scores if s.get("Region") in (None, region)}
        for zone in zones:
            score = by_id.get(str(zone.zone_id))
            zone.spot_score = None if score is None else int(score)

    try:
        spot()
    except AwsError as exc:
        report.warnings.append(f"Spot placement scores of {region} not available (a hint only): {exc.api}: {exc}")
    return zones


def find_capacity(
    env_name: str,
    *,
    group_name: str | None = None,
    nodes: int | None = None,
    regions: Sequence[str] = (),
    probe: bool = False,
    profile: str | None = None,
    endpoint_urls: Mapping[str, str] | None = None,
    say: Callable[[str], None] = lambda message: None,
    poll_s: float = POLL_S,
    settle_s: float = PROBE_SETTLE_S,
    sleep: Callable[[float], None] = time.sleep,
    session: Any = None,
) -> tuple[CapacityReport, Environment | None]:
    report = CapacityReport(env_name)
    try:
        env = get_environment(env_name)
    except ConfigError as exc:
        report.errors.append(
            f"unknown environment {env_name!r}; known: {exc.allowed} (declared in {ENVIRONMENTS_FILE})"
        )
        return report, None
    groups = {g.name: g for g in env.gpu_node_groups}
    if group_name is None and len(groups) == 1:
        group_name = next(iter(groups))
    if group_name not in groups:
        given = "no --group" if group_name is None else f"--group {group_name!r}"
        report.errors.append(
            f"{given}: environment {env.name} has GPU node groups {sorted(groups) or 'none'} ({ENVIRONMENTS_FILE})"
        )
        return report, env
    group = groups[group_name]
    # By default the group's jobs' nodes, and beside a gated gang its spare (GpuNodeGroupConfig.nodes_with_spare).
    count = group.nodes_with_spare if nodes is None else nodes  # at least 1 (GpuNodeGroupConfig)
    report.group, report.instance_type, report.nodes, report.gpu_zone = (
        group.name,
        group.instance_type,
        count,
        env.gpu_availability_zone,
    )
    if not 1 <= count <= group.scaling.max_size:
        report.warnings.append(
            f"--nodes {count} is outside 1..{group.scaling.max_size} (scaling.max_size of group {group.name} in "
            f"{ENVIRONMENTS_FILE}); checked anyway"
        )
    fix = f"trainctl capacity --env {env.name} --group {group.name} --nodes {group.nodes_with_spare}"
    spare = gate_taints.spare_warning(group, count, fix=fix)
    if spare is not None:
        report.warnings.append(spare)
    for region in dict.fromkeys([env.region, *regions]):
        aws = Aws(region=region, profile=profile, endpoint_urls=endpoint_urls, session=session)
        say(f"checking the zones of {region}")
        zones = _region_zones(env, group, count, aws, report)
        report.zones.extend(zones)
        if not probe:
            continue
        for zone in zones:
            if report.interrupted:
                break
            if zone.verdict is Verdict.NO:
                zone.notes.append("not probed: another column already says no")
                continue
            zone.probe = probe_zone(
                aws,
                env_name=env.name,
                instance_type=group.instance_type,
                zone=zone.name,
                count=count,
                say=say,
                poll_s=poll_s,
                settle_s=settle_s,
                sleep=sleep,
            )
            if zone.probe.error:
                zone.notes.append(f"probe: {zone.probe.error}")
            report.interrupted = zone.probe.interrupted
    if report.interrupted:
        report.warnings.append("interrupted: the remaining zones were not probed")
    return report, env


@dataclass(frozen=True)
class ForEnvironment:
    """The report with the environment its advice names (trainctl.output.Report)."""

    report: CapacityReport
    env: Environment | None

    @property
    def exit_code(self) -> ExitCode:
        return self.report.exit_code

    def to_json(self) -> dict[str, Any]:
        return self.report.to_json(self.env)

    def render(self) -> tuple[str, str]:
        return self.report.render(self.env)
