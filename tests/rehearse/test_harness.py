"""Fidelity of the rehearsal harness itself, on small hand-written manifests (tiny python -c pods)."""

from __future__ import annotations

import json
import socket
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from rehearse import Kill, Options, Rehearsal, RehearsalError, run
from trainctl.cli import main

pytestmark = [pytest.mark.rehearsal, pytest.mark.usefixtures("namespaces")]
NS = "t"


def python_container(script: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": "main",
        "image": "example.invalid/tiny:1",
        "command": ["python", "-c", textwrap.dedent(script)],
        **extra,
    }


def job(
    name: str,
    script: str,
    *,
    completions: int | None = 1,
    parallelism: int = 1,
    indexed: bool = False,
    backoff_limit: int = 0,
    pod_failure_policy: dict[str, Any] | None = None,
    restart_policy: str = "Never",
    volumes: list[dict[str, Any]] | None = None,
    mounts: list[dict[str, Any]] | None = None,
    env: list[dict[str, Any]] | None = None,
    subdomain: str | None = None,
) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "restartPolicy": restart_policy,
        "containers": [python_container(script, volumeMounts=mounts or [], env=env or [])],
        "volumes": volumes or [],
    }
    if subdomain:
        pod["subdomain"] = subdomain
    spec: dict[str, Any] = {"parallelism": parallelism, "backoffLimit": backoff_limit, "template": {"spec": pod}}
    if completions is not None:
        spec["completions"] = completions
    if indexed:
        spec["completionMode"] = "Indexed"
    if pod_failure_policy:
        spec["podFailurePolicy"] = pod_failure_policy
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": NS}, "spec": spec}


def headless(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"clusterIP": "None", "selector": {"job-name": name}, "ports": [{"port": 7000}]},
    }


def rehearse(tmp_path: Path, *objects: dict[str, Any], **options: Any) -> Rehearsal:
    options.setdefault("backoff_base_s", 0.0)
    options.setdefault("timeout_s", 60.0)
    return run(list(objects), Options(output_dir=tmp_path / "out", **options))


def test_indexed_pods_get_kubernetes_names_hostnames_index_and_reach_each_other_by_headless_dns(tmp_path: Path) -> None:
    server = """
        import os, socket, time
        index = os.environ["JOB_COMPLETION_INDEX"]
        env = os.environ
        print("identity", socket.gethostname(), index, env["POD_NAME"], env["POD_IP"], env["INDEX_ANN"])
        if index == "0":
            s = socket.socket()
            s.bind(("0.0.0.0", 7000))
            s.listen()
            conn, peer = s.accept()
            print("received", conn.recv(64).decode(), "from", peer[0])
        else:
            for _ in range(200):
                try:
                    conn = socket.create_connection(("pair-0.pair.t.svc.cluster.local", 7000), timeout=1)
                    break
                except OSError:
                    time.sleep(0.05)
            conn.sendall(b"hello-from-" + socket.gethostname().encode())
    """
    env = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {
            "name": "INDEX_ANN",
            "valueFrom": {
                "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
            },
        },
    ]
    result = rehearse(
        tmp_path,
        headless("pair"),
        job("pair", server, completions=2, parallelism=2, indexed=True, env=env, subdomain="pair"),
    )
    pair = result.workload("pair")
    assert (pair.state, pair.message.split(":")[0]) == ("Complete", "CompletionsReached"), pair
    pod0, pod1 = pair.pod("pair-0"), pair.pod("pair-1")
    assert pod0.name.startswith("pair-0-")
    assert len(pod0.name) == len("pair-0-") + 5
    assert pod0.address != pod1.address
    assert f"identity pair-0 0 {pod0.name} {pod0.address} 0" in pod0.log()
    assert f"identity pair-1 1 {pod1.name} {pod1.address} 1" in pod1.log()
    # Over TCP between two network namespaces: the peer address is pod 1's own.
    assert f"received hello-from-pair-1 from {pod1.address}" in pod0.log()
    assert result.network == "bridge"


def test_empty_dir_and_tmp_are_private_to_a_pod_and_a_claim_is_shared(tmp_path: Path) -> None:
    script = """
        import os, pathlib, sys, time
        index = os.environ["JOB_COMPLETION_INDEX"]
        if index == "0":
            pathlib.Path("/scratch/from-0").write_text("x")
            pathlib.Path("/tmp/from-0").write_text("x")
            pathlib.Path("/shared/from-0").write_text("x")
        else:
            for _ in range(400):
                if pathlib.Path("/shared/from-0").exists():
                    break
                time.sleep(0.05)
            seen = {p: os.path.exists(p) for p in ("/shared/from-0", "/scratch/from-0", "/tmp/from-0")}
            print("seen", seen)
            sys.exit(0 if seen == {"/shared/from-0": True, "/scratch/from-0": False, "/tmp/from-0": False} else 1)
    """
    volumes = [
        {"name": "scratch", "emptyDir": {}},
        {"name": "shared", "persistentVolumeClaim": {"claimName": "data"}},
    ]
    mounts = [{"name": "scratch", "mountPath": "/scratch"}, {"name": "shared", "mountPath": "/shared"}]
    result = rehearse(
        tmp_path, job("vols", script, completions=2, parallelism=2, indexed=True, volumes=volumes, mounts=mounts)
    )
    vols = result.workload("vols")
    assert vols.state == "Complete", vols.pod("vols-1").log()
    assert (tmp_path / "out/claims/t/data/from-0").exists()
    # The host's own /tmp never saw the pod's file.
    assert not Path("/tmp/from-0").exists()


def test_config_map_items_and_sub_path_are_files_and_read_only(tmp_path: Path) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cfg", "namespace": NS},
        "data": {"a.txt": "alpha", "b.txt": "beta"},
    }
    script = """
        import pathlib, sys
        assert pathlib.Path("/cfg/renamed/a").read_text() == "alpha"
        assert not pathlib.Path("/cfg/b.txt").exists()
        assert pathlib.Path("/one/b.txt").read_text() == "beta"
        try:
            pathlib.Path("/cfg/new").write_text("x")
        except OSError as exc:
            print("read-only:", exc.errno)
            sys.exit(0)
        sys.exit(1)
    """
    volumes = [
        {"name": "cfg", "configMap": {"name": "cfg", "items": [{"key": "a.txt", "path": "renamed/a"}]}},
        {"name": "all", "configMap": {"name": "cfg"}},
    ]
    mounts = [{"name": "cfg", "mountPath": "/cfg"}, {"name": "all", "mountPath": "/one/b.txt", "subPath": "b.txt"}]
    result = rehearse(tmp_path, config, job("cm", script, volumes=volumes, mounts=mounts))
    cm = result.workload("cm")
    assert cm.state == "Complete", cm.pods[0].log()
    assert "read-only: 30" in cm.pods[0].log()  # EROFS


def test_backoff_limit_counts_failed_pods_then_fails_the_job(tmp_path: Path) -> None:
    result = rehearse(tmp_path, job("fails", "import sys; sys.exit(3)", backoff_limit=2))
    fails = result.workload("fails")
    assert fails.state == "Failed"
    assert fails.message.startswith("BackoffLimitExceeded")
    # backoffLimit 2: the first pod and two replacements, each exit 3.
    assert [p.exit_codes["main"] for p in fails.pods] == [3, 3, 3]
    assert result.exit_code == 1


def test_a_retry_within_the_backoff_limit_completes(tmp_path: Path) -> None:
    script = """
        import pathlib, sys
        marker = pathlib.Path("/shared/tried")
        if not marker.exists():
            marker.write_text("once")
            sys.exit(1)
    """
    volumes = [{"name": "shared", "persistentVolumeClaim": {"claimName": "retry"}}]
    result = rehearse(
        tmp_path,
        job("retry", script, backoff_limit=1, volumes=volumes, mounts=[{"name": "shared", "mountPath": "/shared"}]),
    )
    retry = result.workload("retry")
    assert retry.state == "Complete"
    assert [p.phase for p in retry.pods] == ["Failed", "Succeeded"]


def test_restart_policy_on_failure_counts_container_restarts_against_the_backoff_limit(tmp_path: Path) -> None:
    result = rehearse(tmp_path, job("onfail", "import sys; sys.exit(5)", backoff_limit=2, restart_policy="OnFailure"))
    onfail = result.workload("onfail")
    assert onfail.state == "Failed"
    assert onfail.message.startswith("BackoffLimitExceeded")
    # One pod, restarted in place until restarts exceeded the limit.
    assert len(onfail.pods) == 1
    assert onfail.pods[0].restarts >= 3


FAIL_ON_42 = {
    "rules": [
        {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]
}


def test_pod_failure_policy_fail_job_stops_at_the_first_matching_exit_code(tmp_path: Path) -> None:
    result = rehearse(
        tmp_path, job("bad-args", "import sys; sys.exit(42)", backoff_limit=6, pod_failure_policy=FAIL_ON_42)
    )
    bad = result.workload("bad-args")
    assert bad.state == "Failed"
    assert bad.message.startswith("PodFailurePolicy: Container main for pod t/bad-args-")
    assert "failed with exit code 42 matching FailJob rule" in bad.message
    assert len(bad.pods) == 1  # not retried although backoffLimit is 6


def test_an_exit_code_outside_the_rule_is_counted(tmp_path: Path) -> None:
    result = rehearse(tmp_path, job("other", "import sys; sys.exit(1)", backoff_limit=1, pod_failure_policy=FAIL_ON_42))
    other = result.workload("other")
    assert other.message.startswith("BackoffLimitExceeded")
    assert len(other.pods) == 2


SLEEP_ONCE = """
    import pathlib, time
    marker = pathlib.Path("/shared/started")
    if not marker.exists():
        marker.write_text("first pod")
        time.sleep(60)
"""


def _killed_job(pod_failure_policy: dict[str, Any] | None) -> dict[str, Any]:
    volumes = [{"name": "shared", "persistentVolumeClaim": {"claimName": "kill"}}]
    return job(
        "victim",
        SLEEP_ONCE,
        backoff_limit=0,
        pod_failure_policy=pod_failure_policy,
        volumes=volumes,
        mounts=[{"name": "shared", "mountPath": "/shared"}],
    )


# The kill's clock starts once the first pod's container has written its marker on the claim: a kill at a fixed
# time could land before the container started on a loaded machine (then no exit code, PodInitializing).
STARTED = Kill(pod="victim", seconds=0.5, after=Path(f"claims/{NS}/kill/started"))


def test_kill_gives_disruption_target_which_an_ignore_rule_does_not_count(tmp_path: Path) -> None:
    result = rehearse(tmp_path, _killed_job(FAIL_ON_42), kills=(STARTED,))
    victim = result.workload("victim")
    first, replacement = victim.pods
    assert first.conditions[0]["type"] == "DisruptionTarget"
    assert first.exit_codes["main"] == 137  # SIGKILL, as the kubelet reports it
    assert replacement.phase == "Succeeded"
    assert victim.state == "Complete"  # backoffLimit 0, yet the disruption was not counted


def test_kill_without_a_disruption_rule_counts_as_a_failure(tmp_path: Path) -> None:
    result = rehearse(tmp_path, _killed_job(None), kills=(STARTED,))
    victim = result.workload("victim")
    assert victim.state == "Failed"
    assert victim.message.startswith("BackoffLimitExceeded")
    assert len(victim.pods) == 1


def test_cli_exit_codes_json_and_bad_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Job\nmetadata: {name: x\n")
    assert main(["rehearse", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: cannot read Kubernetes YAML" in err
    good = tmp_path / "ok.yaml"
    good.write_text(json.dumps(job("ok", "print('fine')")))
    assert main(["rehearse", str(good), "--json", "--output-dir", str(tmp_path / "o")]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["workloads"][0]["state"] == "Complete"
    assert document["workloads"][0]["pods"][0]["images"] == ["example.invalid/tiny:1"]
    failing = tmp_path / "fail.yaml"
    failing.write_text(json.dumps(job("no", "raise SystemExit(4)")))
    assert main(["rehearse", str(failing), "--pod-backoff", "0", "--output-dir", str(tmp_path / "f")]) == 1
    assert "Job/no (t): Failed" in capsys.readouterr().out


def _label_ref(name: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{key}']"}}}


def test_job_pods_carry_the_controller_uid_and_job_name_labels_kubernetes_sets(tmp_path: Path) -> None:
    """The apiserver gives a Job a uid and its pods batch.kubernetes.io/controller-uid, .../job-name,
    the legacy controller-uid and job-name, and (Indexed) .../job-completion-index: a fieldRef to them
    resolves in the pod (a per-run id for the training code)."""
    script = """
        import os
        print("labels", *(os.environ[k] for k in ("UID", "NAME", "LEGACY_UID", "LEGACY_NAME", "INDEX", "POD_UID")))
    """
    env = [
        _label_ref("UID", "batch.kubernetes.io/controller-uid"),
        _label_ref("NAME", "batch.kubernetes.io/job-name"),
        _label_ref("LEGACY_UID", "controller-uid"),
        _label_ref("LEGACY_NAME", "job-name"),
        _label_ref("INDEX", "batch.kubernetes.io/job-completion-index"),
        {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
    ]
    result = rehearse(
        tmp_path,
        job("run-a", script, completions=2, parallelism=2, indexed=True, env=env),
        job("run-b", script, env=env),
    )
    a, b = result.workload("run-a"), result.workload("run-b")
    assert (a.state, b.state) == ("Complete", "Complete"), (a, b)
    assert str(uuid.UUID(a.uid)) == a.uid
    assert a.uid != b.uid
    for index, pod in enumerate(a.pods):
        assert f"labels {a.uid} run-a {a.uid} run-a {index} {pod.uid}" in pod.log(), pod.log()
        assert pod.labels["batch.kubernetes.io/controller-uid"] == a.uid
    assert a.pods[0].uid != a.pods[1].uid
    # A NonIndexed Job's pods have no completion index label (the fieldRef resolves to "").
    assert f"labels {b.uid} run-b {b.uid} run-b  {b.pods[0].uid}" in b.pods[0].log(), b.pods[0].log()
    document = result.to_json()
    assert document["workloads"][0]["uid"] == a.uid
    assert document["workloads"][0]["pods"][0]["labels"]["controller-uid"] == a.uid


def test_the_loopback_fallback_gives_distinct_127_addresses_that_reach_each_other_by_dns(tmp_path: Path) -> None:
    """Where no bridge can be made the pods share the host network, each with its own 127.10.x address in its
    /etc/hosts; forced here (Options.network) so the fallback is rehearsed on a machine that has the bridge."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # a free port: in the host network it is shared with everything else
    script = f"""
        import os, socket, time
        index = os.environ["JOB_COMPLETION_INDEX"]
        if index == "0":
            s = socket.socket()
            s.bind((os.environ["POD_IP"], {port}))
            s.listen()
            conn, peer = s.accept()
            print("received", conn.recv(64).decode(), "on", os.environ["POD_IP"])
        else:
            for _ in range(200):
                try:
                    conn = socket.create_connection(("loop-0.loop.t.svc.cluster.local", {port}), timeout=1)
                    break
                except OSError:
                    time.sleep(0.05)
            conn.sendall(b"hello-from-" + socket.gethostname().encode())
    """
    env = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    service = headless("loop")
    result = rehearse(
        tmp_path,
        service,
        job("loop", script, completions=2, parallelism=2, indexed=True, env=env, subdomain="loop"),
        network="loopback",
    )
    loop = result.workload("loop")
    assert loop.state == "Complete", [p.log() for p in loop.pods]
    assert result.network == "loopback"
    assert any("pods share the host network on 127.10.0.0/16" in n for n in result.notes), result.notes
    pod0, pod1 = loop.pod("loop-0"), loop.pod("loop-1")
    assert pod0.address != pod1.address
    assert all(p.address.startswith("127.10.") for p in (pod0, pod1))
    assert f"received hello-from-loop-1 on {pod0.address}" in pod0.log()


def test_an_unknown_network_choice_is_refused() -> None:
    with pytest.raises(RehearsalError, match="network='host': use 'auto' or 'loopback'"):
        Options(network="host")


def network_policy(
    name: str, namespace: str, selector: dict[str, str], ingress: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"podSelector": {"matchLabels": selector}, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def test_network_policies_admit_the_gang_and_the_admitted_port_and_refuse_a_stranger_elsewhere(tmp_path: Path) -> None:
    """Default-deny in both namespaces; the pair's pods admit each other on every port, and pod 0 admits namespace
    `other` on 7001 only: the stranger there is refused 7000 (EACCES at once) and gets pod 0's answer on 7001,
    which only the reply rule lets out of pod 0 (the stranger's namespace admits nothing)."""
    server = """
        import os, socket, time
        if os.environ["JOB_COMPLETION_INDEX"] == "0":
            gang, admitted = socket.socket(), socket.socket()
            gang.bind(("0.0.0.0", 7000)); gang.listen()
            admitted.bind(("0.0.0.0", 7001)); admitted.listen()
            conn, _ = gang.accept()
            print("gang said", conn.recv(64).decode())
            conn, _ = admitted.accept()
            conn.sendall(b"answer")
            conn.close()
        else:
            for _ in range(400):
                try:
                    conn = socket.create_connection(("pair-0.pair.t.svc.cluster.local", 7000), timeout=1)
                    break
                except OSError:
                    time.sleep(0.05)
            conn.sendall(b"hello")
    """
    stranger = """
        import errno, socket, time
        target = "pair-0.pair.t.svc.cluster.local"
        def connect(port):
            for _ in range(400):
                try:
                    return socket.create_connection((target, port), timeout=1)
                except OSError as exc:
                    if exc.errno == errno.EACCES:
                        return exc
                    time.sleep(0.05)
        print("7000:", connect(7000))
        conn = connect(7001)
        print("7001:", conn.recv(64).decode())
    """
    other = job("stranger", stranger)
    other["metadata"]["namespace"] = "other"
    result = rehearse(
        tmp_path,
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}},
        network_policy("default-deny", NS, {}, []),
        network_policy("default-deny", "other", {}, []),
        network_policy(
            "pair", NS, {"job-name": "pair"}, [{"from": [{"podSelector": {"matchLabels": {"job-name": "pair"}}}]}]
        ),
        network_policy(
            "other-on-7001",
            NS,
            {"job-name": "pair"},
            [
                {
                    "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "other"}}}],
                    "ports": [{"protocol": "TCP", "port": 7001}],
                }
            ],
        ),
        headless("pair"),
        job("pair", server, completions=2, parallelism=2, indexed=True, subdomain="pair"),
        other,
    )
    pair, refused = result.workload("pair"), result.workload("stranger")
    assert pair.state == "Complete", pair
    assert "gang said hello" in pair.pod("pair-0").log()
    assert refused.state == "Complete", refused
    log = refused.pod("stranger").log()
    assert "7000: [Errno 13] Permission denied" in log, log
    assert "7001: answer" in log, log
    assert any(n.startswith("NetworkPolicy: 4 enforced (ingress)") for n in result.notes), result.notes


def test_network_policies_are_refused_on_the_loopback_network(tmp_path: Path) -> None:
    with pytest.raises(RehearsalError, match="NetworkPolicy is enforced only on the bridge network"):
        rehearse(tmp_path, network_policy("deny", NS, {}, []), job("one", "print(1)"), network="loopback")
    assert not (tmp_path / "out" / "pods").exists()
