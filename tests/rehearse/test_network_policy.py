"""The NetworkPolicy decision (rehearse/network_policy.py) and the routing rules made of it (policy_routes.py), on
hand-written policies: the API's semantics, without processes (test_harness.py enforces them on real pods)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from rehearse.admission import InputError, admit
from rehearse.network import LoopbackNetwork
from rehearse.network_policy import EVERY_PORT, Endpoint, Policies, PortRange
from rehearse.pods import PodPlan, PolicyDeniedError, Runtime
from rehearse.policy_routes import rules_toward


def policy(
    namespace: str, selector: dict[str, Any], ingress: list[dict[str, Any]] | None, **spec: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {"podSelector": selector, **spec}
    if ingress is not None:
        body["ingress"] = ingress
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "p", "namespace": namespace},
        "spec": body,
    }


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


GANG_A0 = Endpoint("a-0", "training", {"job-name": "a"}, "10.244.0.2")
GANG_A1 = Endpoint("a-1", "training", {"job-name": "a"}, "10.244.0.3")
GANG_B0 = Endpoint("b-0", "training", {"job-name": "b"}, "10.244.0.4")
STRANGER = Endpoint("s", "default", {"job-name": "a"}, "10.244.0.9")
HEAD = Endpoint(
    "head", "ray", {"ray.io/cluster": "c", "ray.io/node-type": "head"}, "10.244.0.5", (("dashboard", 8265, "TCP"),)
)

DEFAULT_DENY = policy("training", {}, None, policyTypes=["Ingress"])
GANG = policy(
    "training", {"matchLabels": {"job-name": "a"}}, [{"from": [{"podSelector": {"matchLabels": {"job-name": "a"}}}]}]
)


def test_a_pod_no_policy_selects_admits_everything_and_default_deny_admits_nothing() -> None:
    assert Policies.of([]).admitted(STRANGER, GANG_A0) == EVERY_PORT
    deny = Policies.of([DEFAULT_DENY])
    assert deny.isolated(GANG_A0)
    assert deny.admitted(STRANGER, GANG_A0) == ()
    assert deny.admitted(GANG_A1, GANG_A0) == ()
    assert deny.admitted(GANG_A0, GANG_A0) == EVERY_PORT  # a pod cannot block itself


def test_a_gang_admits_its_own_pods_on_every_port_and_no_other_job_nor_the_same_labels_elsewhere() -> None:
    policies = Policies.of([DEFAULT_DENY, GANG])
    assert policies.admitted(GANG_A1, GANG_A0) == EVERY_PORT
    assert not policies.reaches(GANG_B0, GANG_A0, 29500)
    # podSelector alone means the policy's namespace: the same label in `default` is a stranger
    assert not policies.reaches(STRANGER, GANG_A0, 29500)


def test_namespace_selectors_read_the_namespace_labels_and_the_name_label_the_api_server_sets() -> None:
    by_label = policy("ray", {}, [{"from": [{"namespaceSelector": {"matchLabels": {"team": "ops"}}}]}])
    by_name = policy(
        "ray",
        {},
        [
            {
                "from": [
                    {
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kuberay-system"}},
                        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "kuberay-operator"}},
                    }
                ]
            }
        ],
    )
    operator = Endpoint("op", "kuberay-system", {"app.kubernetes.io/name": "kuberay-operator"})
    other_pod = Endpoint("x", "kuberay-system", {"app.kubernetes.io/name": "other"})
    ops_pod = Endpoint("y", "monitoring", {})
    policies = Policies.of([namespace("monitoring", team="ops"), by_label, by_name])
    assert policies.admitted(operator, HEAD) == EVERY_PORT
    assert policies.admitted(other_pod, HEAD) == ()  # both selectors must match
    assert policies.admitted(ops_pod, HEAD) == EVERY_PORT
    assert policies.admitted(Endpoint("z", "default", {}), HEAD) == ()


def test_ports_numbers_ranges_names_and_protocols() -> None:
    rule = {
        "ports": [
            {"port": 29500, "endPort": 29502},
            {"protocol": "UDP", "port": 5000},
            {"port": "dashboard"},
            {"port": "absent-name"},
            {"protocol": "SCTP"},
        ]
    }
    policies = Policies.of([policy("ray", {}, [rule])])
    assert policies.admitted(STRANGER, HEAD) == (
        PortRange("SCTP", 1, 65535),
        PortRange("TCP", 8265, 8265),
        PortRange("TCP", 29500, 29502),
        PortRange("UDP", 5000, 5000),
    )
    assert policies.reaches(STRANGER, HEAD, 29501)
    assert not policies.reaches(STRANGER, HEAD, 29503)
    assert not policies.reaches(STRANGER, HEAD, 5000)  # TCP: the rule admits UDP 5000
    assert not policies.reaches(STRANGER, HEAD, 10001)


def test_ip_blocks_admit_the_cidr_less_its_exceptions() -> None:
    rule = {"from": [{"ipBlock": {"cidr": "10.244.0.0/24", "except": ["10.244.0.8/29"]}}], "ports": [{"port": 9443}]}
    policies = Policies.of([policy("ray", {}, [rule])])
    assert policies.reaches(GANG_A0, HEAD, 9443)
    assert not policies.reaches(STRANGER, HEAD, 9443)  # .9 is in the exception
    assert not policies.reaches(Endpoint("op", "kuberay-system", {}), HEAD, 9443)  # no address: no block holds it


def test_routing_rules_admit_the_ports_and_the_replies_outside_the_ephemeral_range_then_prohibit() -> None:
    submitter = Endpoint("sub", "ray", {"job-name": "j"}, "10.244.0.7")
    head_policy = policy(
        "ray",
        {"matchLabels": {"ray.io/node-type": "head"}},
        [{"from": [{"podSelector": {"matchLabels": {"job-name": "j"}}}], "ports": [{"port": 8265}]}],
    )
    policies = Policies.of([policy("ray", {}, None, policyTypes=["Ingress"]), head_policy])
    assert rules_toward(policies, submitter, HEAD) == [
        "rule add pref 100 to 10.244.0.5/32 ipproto 6 dport 8265 lookup main",
        "rule add pref 200 to 10.244.0.5/32 prohibit",
    ]
    # the head answers the submitter from 8265 and may open nothing to it
    assert rules_toward(policies, HEAD, submitter) == [
        "rule add pref 100 to 10.244.0.7/32 ipproto 6 sport 8265 lookup main",
        "rule add pref 200 to 10.244.0.7/32 prohibit",
    ]
    # a pod that admits everything from the head answers from any port outside the kernel's ephemeral range
    open_pod = Endpoint("open", "default", {}, "10.244.0.8")
    assert "rule add pref 100 to 10.244.0.5/32 ipproto 6 sport 1-32767 lookup main" in rules_toward(
        policies, open_pod, HEAD
    )
    assert "rule add pref 100 to 10.244.0.5/32 ipproto 6 sport 61000-65534 lookup main" in rules_toward(
        policies, open_pod, HEAD
    )
    assert rules_toward(policies, HEAD, open_pod) == []


def test_egress_policies_are_refused_before_anything_runs() -> None:
    egress = policy("training", {}, None, policyTypes=["Ingress", "Egress"])
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "training"},
        "spec": {
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i", "command": ["true"]}]}
            }
        },
    }
    with pytest.raises(InputError, match=r"NetworkPolicy/p: spec.policyTypes Egress"):
        admit([egress, job], ["f.yaml", "f.yaml"])
    assert admit([DEFAULT_DENY, job], ["f.yaml", "f.yaml"]).objects[0] == DEFAULT_DENY


def test_a_head_whose_policies_shut_out_the_kuberay_operator_stops_the_run_naming_the_policy(tmp_path: Path) -> None:
    head_labels = {"ray.io/node-type": "head", "platform/workload": "w"}
    submitter_only = policy(
        "ray",
        {"matchLabels": head_labels},
        [
            {
                "from": [{"podSelector": {"matchLabels": {"ray.io/originated-from-crd": "RayJob"}}}],
                "ports": [{"port": 8265}],
            }
        ],
    )
    spec = {"containers": [{"name": "ray-head", "image": "i"}]}
    for policies, denied in ((Policies.of([submitter_only]), True), (Policies.of([]), False)):
        runtime = Runtime(
            output_dir=tmp_path / str(denied), network=LoopbackNetwork(), configmaps={}, services=[], policies=policies
        )
        head = runtime.create(
            PodPlan(name="w-head", namespace="ray", spec=spec, workload="RayCluster/w", labels=head_labels)
        )
        head.process = subprocess.Popen(["true"])
        head.process.wait()
        if denied:
            with pytest.raises(PolicyDeniedError, match=r"admits the KubeRay operator .* on TCP 8265"):
                runtime.dashboard_get(head, "nodes")
        else:
            assert runtime.dashboard_get(head, "nodes") is None  # asked, and nothing answers
