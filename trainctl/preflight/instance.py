"""instance: EFA, network cards, GPUs and vCPUs of each GPU type, EC2's view against infra/spec/instances.py
(ec2:DescribeInstanceTypes)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infra.spec import Environment, GpuNodeGroupConfig
from infra.spec.efa import efa_layout
from trainctl.aws import Aws
from trainctl.preflight.results import (
    Check,
    CheckResult,
    Say,
    Status,
    attempt,
    group_subject,
)


def evaluate_instance(group: GpuNodeGroupConfig, info: Mapping[str, Any] | None, region: str) -> CheckResult:
    subject = group_subject(group)
    facts = group.instance
    # GpuNodeGroupConfig validates both.
    assert facts.gpu is not None
    assert facts.efa is not None
    if info is None:
        return CheckResult(
            Check.INSTANCE,
            subject,
            Status.FAIL,
            f"EC2 in {region} does not know {group.instance_type}",
            "pick an instance type EC2 offers in the region (aws ec2 describe-instance-types)",
        )
    attached = group.efa_interface_count
    cards_used = max(slot.network_card_index for slot in efa_layout(facts, attached)) + 1
    network = info.get("NetworkInfo", {})
    efa_supported = network.get("EfaSupported") is True
    max_efa = network.get("EfaInfo", {}).get("MaximumEfaInterfaces")
    cards = network.get("MaximumNetworkCards")
    gpus = sum(int(g.get("Count", 0)) for g in info.get("GpuInfo", {}).get("Gpus", []))
    vcpus = info.get("VCpuInfo", {}).get("DefaultVCpus")

    failures: list[str] = []
    if not efa_supported:
        failures.append("EC2 reports no EFA support (NetworkInfo.EfaSupported)")
    elif max_efa is None or max_efa < attached:
        failures.append(
            f"the node group attaches {attached} EFA interface(s), EC2 allows {max_efa} (EfaInfo.MaximumEfaInterfaces)"
        )
    if cards is None or cards < cards_used:
        failures.append(f"the interface layout uses {cards_used} network card(s), EC2 reports {cards}")
    if gpus != facts.gpu.count:
        failures.append(
            f"EC2 reports {gpus} GPU(s), infra/spec/instances.py {facts.gpu.count} (jobs request GPUs by that number)"
        )
    if failures:
        return CheckResult(
            Check.INSTANCE,
            subject,
            Status.FAIL,
            "; ".join(failures),
            f"correct the facts of {group.instance_type} in infra/spec/instances.py from "
            f"`aws ec2 describe-instance-types --instance-types {group.instance_type}`"
            + (f", or set efa_interfaces of group {group.name} to at most {max_efa}" if max_efa else ""),
        )
    drift = [
        f"{what} {actual} (facts: {declared})"
        for what, actual, declared in (
            ("MaximumEfaInterfaces", max_efa, facts.efa.max_interfaces),
            ("MaximumNetworkCards", cards, facts.network_cards),
            ("DefaultVCpus", vcpus, facts.vcpus),
        )
        if actual != declared
    ]
    if drift:
        return CheckResult(
            Check.INSTANCE,
            subject,
            Status.WARN,
            "the node group fits, but EC2 differs from infra/spec/instances.py: " + ", ".join(drift),
            f"update the facts of {group.instance_type} in infra/spec/instances.py (quota and address "
            "arithmetic derive from them)",
        )
    return CheckResult(
        Check.INSTANCE,
        subject,
        Status.PASS,
        f"EFA: attaches {attached} of {max_efa} interface(s) on {cards_used} of {cards} network card(s); "
        f"{gpus} GPUs, {vcpus} vCPUs as declared",
    )


def gather(env: Environment, aws: Aws, say: Say) -> list[CheckResult]:
    results: list[CheckResult] = []
    infos: dict[str, dict[str, Any] | None] = {}
    for group in env.gpu_node_groups:
        say(f"EFA and GPUs of {group.instance_type}")

        def instance(group: GpuNodeGroupConfig = group) -> list[CheckResult]:
            if group.instance_type not in infos:
                infos[group.instance_type] = aws.instance_type_info(group.instance_type)
            return [evaluate_instance(group, infos[group.instance_type], aws.region)]

        results += attempt(Check.INSTANCE, [group_subject(group)], aws.region, instance)
    return results
