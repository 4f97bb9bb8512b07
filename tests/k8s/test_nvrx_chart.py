"""The NVRx fault-tolerant FSDP job: one pod per node with the node's GPUs and EFA, the fabric and
watchdog env, the checkpoint claim, and an ft_launcher command line that the real parsers accept."""

from __future__ import annotations

import hashlib
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import cdk8s
import pytest
from nvidia_resiliency_ext.fault_tolerance.launcher import get_args_parser

from gates.manifests import check_objects
from infra.spec import ENVIRONMENTS, ConfigError
from k8s.charts.nvrx_job import NvrxJobChart
from k8s.check_lock import check_lock
from k8s.fabric_env import fabric_env
from k8s.images import ImageLock
from k8s.nvrx_spec import (
    INPROCESS_STORE_PORT,
    NVRX_IMAGE,
    RENDEZVOUS_PORT,
    WRAPPER_STORE_PORT,
    CheckpointPolicy,
    FtLauncherConfig,
    InProcessRestart,
    NvrxFsdpJob,
)
from k8s.ray_spec import WorkloadError
from tests.conftest import ROOT
from tests.k8s.schema import validate_core
from tests.tiers import starts_training_processes
from training.nvrx_config import parse_job

DIGEST = "sha256:" + hashlib.sha256(b"nvrx chart test image").hexdigest()
LOCK = check_lock(ImageLock.load()).with_digest(NVRX_IMAGE, DIGEST)


def _chart(env: str, job: NvrxFsdpJob | None = None) -> tuple[NvrxJobChart, dict[str, dict[str, Any]]]:
    chart = NvrxJobChart(cdk8s.Testing.app(), "n", environment=ENVIRONMENTS[env], lock=LOCK, job=job or NvrxFsdpJob())
    objects = {f"{o['kind']}/{o['metadata']['name']}": dict(o) for o in cdk8s.Testing.synth(chart)}
    return chart, objects


@pytest.fixture(scope="module")
def prod() -> tuple[NvrxJobChart, dict[str, dict[str, Any]]]:
    return _chart("prod")


def _pod(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return dict(objects["Job/nvrx-fsdp"]["spec"]["template"]["spec"])


def _container(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (container,) = _pod(objects)["containers"]
    return dict(container)


def _env(objects: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in _container(objects)["env"] if "value" in e}


def test_prod_renders_an_indexed_job_of_p5_pods_one_per_node(prod: Any) -> None:
    _, objects = prod
    spec = objects["Job/nvrx-fsdp"]["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 2, 2)
    pod = _pod(objects)
    assert pod["nodeSelector"]["platform/gpu-group"] == "p5"
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["topologyKey"] == "kubernetes.io/hostname"
    assert pod["restartPolicy"] == "Never"
    assert pod["subdomain"] == "nvrx-fsdp"
    service = objects["Service/nvrx-fsdp"]["spec"]
    assert service["clusterIP"] == "None"
    assert {p["port"] for p in service["ports"]} == {29500}


def test_each_pod_takes_the_whole_p5_from_the_instance_facts(prod: Any) -> None:
    _, objects = prod
    container = _container(objects)
    facts = ENVIRONMENTS["prod"].gpu_node_groups[0].instance
    assert facts.gpu is not None
    assert facts.efa is not None
    for side in ("requests", "limits"):
        resources = container["resources"][side]
        assert resources["nvidia.com/gpu"] == str(facts.gpu.count) == "8"
        assert resources["vpc.amazonaws.com/efa"] == str(facts.efa.max_interfaces) == "32"
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert container["image"] == LOCK.pinned("nvrx-train-prod")
    volumes = {v["name"]: v for v in _pod(objects)["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["dshm"] == "/dev/shm"


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_checkpoints_go_to_the_fsx_claim_every_pod_mounts(env: str) -> None:
    """Issue 17 #3: dev's checkpoints were on a per-pod emptyDir, so pod 1's ranks could not write into the step
    directory rank 0 created on pod 0. Every environment's job now mounts the FSx claim."""
    _, objects = _chart(env)
    storage = ENVIRONMENTS[env].add_ons.checkpoint_storage
    assert storage is not None
    volumes = {v["name"]: v for v in _pod(objects)["volumes"]}
    assert volumes["checkpoints"] == {"name": "checkpoints", "persistentVolumeClaim": {"claimName": storage.claim_name}}
    assert {m["name"]: m["mountPath"] for m in _container(objects)["volumeMounts"]}["checkpoints"] == "/checkpoints"
    assert not [v for v in _pod(objects)["volumes"] if "emptyDir" in v and v["name"] != "dshm"]


def test_an_environment_without_shared_storage_refuses_the_job_naming_the_fix() -> None:
    import dataclasses

    from infra.spec import AddOnsConfig

    bare = dataclasses.replace(ENVIRONMENTS["dev"], add_ons=AddOnsConfig(checkpoint_storage=None))
    with pytest.raises(
        WorkloadError,
        match=r"environment 'dev': add_ons.checkpoint_storage=None, but NVRx job nvrx-fsdp runs 2 pods that must "
        r"share one checkpoint directory; fix: give the environment a CheckpointStorageConfig in "
        r"infra/spec/environments.py",
    ):
        NvrxJobChart(cdk8s.Testing.app(), "n", environment=bare, lock=LOCK, job=NvrxFsdpJob())


def test_fabric_env_is_the_shared_module_and_nvrx_settings_are_explicit() -> None:
    job = NvrxFsdpJob(inprocess=InProcessRestart(enabled=True))
    _, objects = _chart("prod", job)
    env = _env(objects)
    for name, value in fabric_env(ENVIRONMENTS["prod"].gpu_node_groups[0].instance).items():
        assert env[name] == value
    assert env["NCCL_NET"] == "AWS Libfabric"  # forced: no silent fallback to sockets
    hard = job.inprocess.hard_timeout_s
    # The NCCL watchdog must not fire before the in-process Wrapper's hard timeout.
    assert int(env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"]) > hard
    assert env["TORCH_NCCL_RETHROW_CUDA_ERRORS"] == "0"
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert env["HF_HOME"].startswith("/checkpoints/")


def test_without_inprocess_restart_the_inprocess_only_settings_are_absent(prod: Any) -> None:
    chart, objects = prod
    env = _env(objects)
    assert "TORCH_NCCL_RETHROW_CUDA_ERRORS" not in env
    assert "--inprocess" not in chart.training_argv


SUPERVISOR = ["python", "-m", "training.fabric_gate", "supervise", "--"]


def _exec_argv(script: str) -> list[str]:
    """ft_launcher's argv, after the fabric gate's supervisor that runs it (it exits the pod with the gate's code)."""
    (line,) = [line for line in script.splitlines() if line.startswith("exec ")]
    argv = shlex.split(line.removeprefix("exec "))
    assert argv[: len(SUPERVISOR)] == SUPERVISOR
    return argv[len(SUPERVISOR) :]


def test_launcher_command_is_accepted_by_the_real_ft_launcher_parser(prod: Any) -> None:
    chart, _ = prod
    argv = _exec_argv(chart.script)
    assert argv[0] == "ft_launcher"
    args = get_args_parser().parse_args(argv[1:])
    assert (args.nnodes, args.nproc_per_node) == ("2", "8")
    assert args.rdzv_backend == "c10d"
    assert args.rdzv_endpoint == "nvrx-fsdp-0.nvrx-fsdp.training.svc:29500"
    assert args.max_restarts == FtLauncherConfig().max_restarts
    # 0.7.0 parses these as strings (None spellings allowed) and converts them in its FaultToleranceConfig.
    assert float(args.ft_rank_heartbeat_timeout) == FtLauncherConfig().rank_heartbeat_timeout_s
    assert float(args.ft_initial_rank_heartbeat_timeout) == FtLauncherConfig().initial_rank_heartbeat_timeout_s
    assert args.ft_enable_nic_monitor is False
    assert args.ft_rdzv_impl == "barrier"
    # In-job restart is the emitted job's fast path: in-process restart (deprecated upstream) is off.
    assert "--inprocess" not in args.training_script_args
    assert not any(a.startswith("--store-addr") for a in args.training_script_args)
    assert args.module is True
    assert args.training_script == "training.nvrx_fsdp"


def test_in_process_restart_is_an_explicit_option_the_real_parser_accepts() -> None:
    job = NvrxFsdpJob(inprocess=InProcessRestart(enabled=True))
    chart, _ = _chart("prod", job)
    args = get_args_parser().parse_args(_exec_argv(chart.script)[1:])
    assert "--inprocess" in args.training_script_args
    assert "--store-addr=nvrx-fsdp-0.nvrx-fsdp.training.svc:29501" in args.training_script_args
    # 0.7.0 knows one restart policy, any-failed, and nothing is written for it.
    assert not any(a.startswith("--ft-restart-policy") for a in _exec_argv(chart.script))
    assert args.ft_restart_policy == "any-failed"


def test_0_4_1s_min_healthy_is_refused_by_the_0_7_launcher() -> None:
    """The policy the in-process configuration passed on NVRx 0.4.1 ends ft_launcher 0.7.0 with exit 2."""
    with pytest.raises(SystemExit) as exit_:
        get_args_parser().parse_args(["--ft-restart-policy=min-healthy", "-m", "training.nvrx_fsdp"])
    assert exit_.value.code == 2


def test_the_script_runs_and_only_pod_0_hosts_the_rendezvous(prod: Any, tmp_path: Path) -> None:
    chart, _ = prod
    stubs = tmp_path / "bin"
    stubs.mkdir()
    # Stand-ins for what the script calls: python (NVRx "installed", arguments and preconditions fine), mkdir, and
    # ft_launcher printing the argv it received, one argument per line.
    # The supervisor (`python -m training.fabric_gate supervise -- CMD`) runs CMD.
    python = '[ "$1 $2 $3 $4" = "-m training.fabric_gate supervise --" ] && { shift 4; exec "$@"; }; exit 0'
    for name, body in (("python", python), ("mkdir", "exit 0"), ("ft_launcher", 'printf "%s\\n" "$@"')):
        path = stubs / name
        path.write_text(f"#!/bin/bash\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    read = FtLauncherConfig().rendezvous_read_timeout_s
    conf = f"store_connect_wait_seconds=900,read_timeout={read},join_timeout=1200"
    for index, is_host in (("0", "1"), ("1", "0")):
        env = {"PATH": f"{stubs}:/usr/bin:/bin", "JOB_COMPLETION_INDEX": index, "JOB_UID": "u-1"}
        result = subprocess.run(["/bin/bash", "-c", chart.script], env=env, capture_output=True, text=True, check=True)
        received = result.stdout.splitlines()
        assert received == [*chart.launcher_argv[1:], f"--rdzv-conf=is_host={is_host},{conf}", *chart.training_argv]


def test_rendezvous_timeouts_reach_the_real_rendezvous_config_parser(prod: Any) -> None:
    """Issue 17 #7: ft_launcher 0.7.0 probes pod 0's store for 120 s and reads with a 60 s timeout by default; a pod
    whose image pulled minutes after pod 0's exceeds them on fresh p5 nodes. The manifest writes the timeouts out
    instead of relying on a launcher default."""
    from nvidia_resiliency_ext.fault_tolerance.launcher import _parse_rendezvous_config

    chart, _ = prod
    (line,) = [line for line in chart.script.splitlines() if line.startswith("exec ")]
    (conf,) = [a for a in shlex.split(line.replace("$is_host", "0")) if a.startswith("--rdzv-conf=")]
    parsed = _parse_rendezvous_config(conf.removeprefix("--rdzv-conf="))
    assert parsed == {
        "is_host": "0",
        "store_connect_wait_seconds": "900",
        "read_timeout": "900",
        "join_timeout": "1200",
    }


def test_pods_validate_arguments_then_check_preconditions_then_start_ft_launcher(prod: Any) -> None:
    """Issue 17 #6 and the pod checks: ft_launcher turns every worker failure into exit 1, so the Job's exit-2
    rule never fired for bad flags. The script validates the training arguments (exit 2) and the pod's own
    preconditions (exit 2) before ft_launcher starts."""
    chart, objects = prod
    lines = chart.script.splitlines()
    check_args = lines.index(f"python {shlex.join(chart.training_argv)} --check-args")
    (checks,) = [i for i, line in enumerate(lines) if line.startswith("python -m training.pod_checks ")]
    (launch,) = [
        i
        for i, line in enumerate(lines)
        if line.startswith("exec python -m training.fabric_gate supervise -- ft_launcher ")
    ]
    assert check_args < checks < launch
    assert lines[0] == "set -euo pipefail"  # a failed check ends the script with its own exit status
    assert lines[checks] == (
        "python -m training.pod_checks --python 3.12 --package torch==2.13.0 --package nvidia-resiliency-ext==0.7.0 "
        "--package transformers==5.23.0 --nccl-net-plugin ofi --efa-devices 32 "
        "--restart ft_launcher --min-aws-ofi-nccl 1.21.0 --memlock unlimited "
        "--shared-dir /checkpoints/nvrx-fsdp --peers 2 --shared-timeout 1500 --peer-host 'nvrx-fsdp-{index}.nvrx-fsdp' "
        '--index "$JOB_COMPLETION_INDEX" --run-id "$JOB_UID"'
    )
    env = {e["name"]: e for e in _container(objects)["env"]}
    assert env["JOB_UID"] == {
        "name": "JOB_UID",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['batch.kubernetes.io/controller-uid']"}},
    }
    rules = objects["Job/nvrx-fsdp"]["spec"]["podFailurePolicy"]["rules"]
    assert rules[0] == {
        "action": "FailJob",
        "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [2]},
    }
    # Issue 22 #6: a peer that never appeared exits 3 (training/pod_checks.py PEERS_MISSING), which no rule makes
    # permanent; and the wait outlasts Kueue's waitForPodsReady timeout, so Kueue requeues the gang first.
    from infra.spec.kueue import KueueProps
    from training.pod_checks import PEERS_MISSING

    assert all(PEERS_MISSING not in r.get("onExitCodes", {}).get("values", []) for r in rules)
    assert NvrxFsdpJob().preconditions_timeout_s > KueueProps().pods_ready_timeout_minutes * 60


@starts_training_processes
def _check_args(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv, "--check-args"],
        cwd=ROOT,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_args_exits_2_on_a_bad_flag_and_on_a_missing_device(prod: Any, tmp_path: Path) -> None:
    chart, _ = prod
    argv = [a.replace("/checkpoints", str(tmp_path)) for a in chart.training_argv]
    bad_flag = _check_args([*argv, "--no-such-flag"])
    assert bad_flag.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in bad_flag.stderr
    bad_value = _check_args([*argv, "--ckpt-keep=0"])
    assert (bad_value.returncode, "--ckpt-keep 0 must be at least 1" in bad_value.stderr) == (2, True)
    # --device=cuda on this machine: no CUDA device, a precondition the Job cannot fix by retrying.
    no_gpu = _check_args(argv)
    assert no_gpu.returncode == 2
    assert "--device cuda: no CUDA device is visible" in no_gpu.stderr
    rehearsal = _check_args(argv, PLATFORM_REHEARSAL="cpu")
    assert rehearsal.returncode == 0, rehearsal.stderr
    assert "arguments ok: 2000 steps on cpu (gloo)" in rehearsal.stdout
    assert not list(tmp_path.iterdir())  # nothing started, nothing written


def test_check_args_on_cpu_answers_before_torch_is_imported(prod: Any, tmp_path: Path) -> None:
    # Each pod runs --check-args before ft_launcher starts its ranks; on CPU the answer needs no torch (one import of
    # torch and transformers a pod instead of two: training/nvrx_config.py).
    chart, _ = prod
    argv = [a.replace("/checkpoints", str(tmp_path)) for a in chart.training_argv]
    done = _check_args(["-X", "importtime", *argv], PLATFORM_REHEARSAL="cpu")
    assert done.returncode == 0, done.stderr
    assert "arguments ok: 2000 steps on cpu (gloo)" in done.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "training.nvrx_config" in imported
    assert not {"torch", "transformers", "numpy"} & imported, sorted(imported)


@pytest.mark.parametrize("nodes", [2, 5, 8])
def test_prod_takes_two_to_eight_p5_nodes(nodes: int) -> None:
    chart, objects = _chart("prod", NvrxFsdpJob(nodes=nodes))
    spec = objects["Job/nvrx-fsdp"]["spec"]
    assert spec["completions"] == spec["parallelism"] == chart.nodes == nodes
    assert f"--nnodes={nodes}" in chart.launcher_argv


def test_more_nodes_than_the_group_allows_is_refused_with_the_fix() -> None:
    with pytest.raises(WorkloadError, match=r"nvrx.nodes=9 .*max_size 8.*2 to 8"):
        _chart("prod", NvrxFsdpJob(nodes=9))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: NvrxFsdpJob(nodes=1), r"nvrx.nodes=1 must be at least 2"),
        (lambda: InProcessRestart(soft_timeout_s=90, hard_timeout_s=60), r"soft < hard < barrier"),
        (lambda: InProcessRestart(hard_timeout_s=200, barrier_timeout_s=120), r"soft < hard < barrier"),
        # The training CLI refuses a soft timeout within NVRx's monitoring interval; the chart must not write one.
        (
            lambda: InProcessRestart(soft_timeout_s=1, hard_timeout_s=2, barrier_timeout_s=3),
            r"soft_timeout_s=1 must be longer than NVRx's 1 s monitoring interval",
        ),
        (lambda: CheckpointPolicy(keep=1), r"keep=1 must be at least 2"),
        (lambda: CheckpointPolicy(every_steps=0), r"every_steps=0"),
        (lambda: FtLauncherConfig(rank_heartbeat_timeout_s=1300), r"0 < rank <= initial"),
        (lambda: FtLauncherConfig(rendezvous_read_timeout_s=0), r"0 < read <= join"),
        (lambda: FtLauncherConfig(rendezvous_read_timeout_s=1300), r"0 < read <= join"),
        (lambda: FtLauncherConfig(rendezvous_store_connect_wait_s=0), r"0 < store_connect_wait <= join"),
        (
            lambda: NvrxFsdpJob(
                inprocess=InProcessRestart(enabled=True), ft_launcher=FtLauncherConfig(rank_heartbeat_timeout_s=300)
            ),
            r"rank_heartbeat_timeout_s=300 must exceed nvrx.inprocess.hard_timeout_s=360",
        ),
        (lambda: NvrxFsdpJob(preconditions_timeout_s=5), r"preconditions_timeout_s=5 must be 10 to 3600"),
        (lambda: FtLauncherConfig(rank_termination_signal="SIGHUP"), r"SIGKILL or SIGTERM"),
        (lambda: NvrxFsdpJob(pip=("nvidia-resiliency-ext",)), r"not pinned"),
        (lambda: NvrxFsdpJob(name="NVRX"), r"nvrx.name='NVRX' must be lower-case"),
        # It names the headless Service too, and Service names must start with a letter.
        (lambda: NvrxFsdpJob(name="1nvrx"), r"start with a letter"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(make: Any, message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        make()


@pytest.mark.parametrize("inprocess", [False, True])
def test_every_port_the_pods_listen_on_is_declared_on_the_service_and_the_container(inprocess: bool) -> None:
    from training.nvrx_fsdp import WRAPPER_STORE_PORT_OFFSET

    # rendezvous (c10d), and with in-process restart the per-iteration process-group store (--store-addr) and the
    # Wrapper's own store, which training/nvrx_fsdp.py puts at --store-addr's port + WRAPPER_STORE_PORT_OFFSET.
    assert WRAPPER_STORE_PORT == INPROCESS_STORE_PORT + WRAPPER_STORE_PORT_OFFSET
    expected = {RENDEZVOUS_PORT, *([INPROCESS_STORE_PORT, WRAPPER_STORE_PORT] if inprocess else [])}
    _, objects = _chart("prod", NvrxFsdpJob(inprocess=InProcessRestart(enabled=inprocess)))
    assert {p["port"] for p in objects["Service/nvrx-fsdp"]["spec"]["ports"]} == expected
    assert {p["containerPort"] for p in _container(objects)["ports"]} == expected


def test_unknown_gpu_group_is_refused() -> None:
    with pytest.raises(WorkloadError, match=r"gpu_group='p4'.*allowed: p5, g6"):
        _chart("prod", NvrxFsdpJob(gpu_group="p4"))


def test_every_object_passes_the_schema_and_the_manifest_gate() -> None:
    for env in ("dev", "prod"):
        _, objects = _chart(env)
        for obj in objects.values():
            validate_core(obj)
        assert check_objects([(name, o) for name, o in objects.items()]) == []


def test_synthesis_is_deterministic() -> None:
    assert _chart("prod")[1] == _chart("prod")[1]
    assert os.environ.get("JOB_COMPLETION_INDEX") is None  # nothing leaked into the test process


@pytest.mark.parametrize("inprocess", [False, True])
def test_training_flags_are_accepted_by_the_real_training_cli(inprocess: bool) -> None:
    job = NvrxFsdpJob(inprocess=InProcessRestart(enabled=inprocess))
    chart, _ = _chart("prod", job)
    # argv[0:2] is "-m training.nvrx_fsdp"; the rest is what the module's own parser gets.
    assert chart.training_argv[:2] == ["-m", "training.nvrx_fsdp"]
    parsed = parse_job(chart.training_argv[2:])
    assert parsed.steps == job.steps
    assert parsed.ckpt_every == job.checkpoint.every_steps
    assert parsed.ckpt_mode == job.checkpoint.mode.value
    assert parsed.ckpt_keep == job.checkpoint.keep
    assert parsed.inprocess.enabled is inprocess
    assert parsed.pg_timeout_s == job.collective_timeout_s
    assert str(parsed.ckpt_dir) == job.checkpoint_dir
    if inprocess:
        assert parsed.inprocess.hard_timeout_s == job.inprocess.hard_timeout_s
        assert parsed.store_addr is not None
        # The NCCL watchdog outlasts the Wrapper's hard timeout (NVRx requirement).
        assert parsed.pg_timeout_s > parsed.inprocess.hard_timeout_s
    else:
        assert parsed.store_addr is None


def test_inprocess_soft_timeout_covers_model_load_and_a_restore() -> None:
    """Issue 17 #7: a 60 s soft timeout could fire during model load or a DCP restore from FSx, which run inside
    the Wrapper's first iteration before the first progress ping (InProcessRestart's docstring has the figures)."""
    job = NvrxFsdpJob(inprocess=InProcessRestart(enabled=True))
    chart, _ = _chart("prod", job)
    assert job.inprocess.soft_timeout_s >= 300
    assert f"--inprocess-soft-timeout={job.inprocess.soft_timeout_s}" in chart.training_argv
    # Ordering kept: ft_launcher's per-step heartbeat outlasts the Wrapper's hard timeout.
    assert job.ft_launcher.rank_heartbeat_timeout_s > job.inprocess.hard_timeout_s


def test_checkpoint_interval_from_young_daly() -> None:
    """sqrt(2 x stall x job MTBF) in steps: the one formula trainctl goodput recommends with (issue 15)."""
    import math

    from infra.spec.operating import NODE_MTBF
    from k8s.nvrx_spec import CheckpointMode, CheckpointPolicy

    policy = CheckpointPolicy.young_daly(checkpoint_stall_s=0.2, step_time_s=1.5, nodes=8, mode=CheckpointMode.SYNC)
    expected = math.sqrt(2 * 0.2 * NODE_MTBF.mtbf_node_hours * 3600 / 8) / 1.5
    assert policy.every_steps == round(expected)
    assert policy.mode is CheckpointMode.SYNC
    # More nodes fail more often: checkpoint more often.
    assert (
        CheckpointPolicy.young_daly(checkpoint_stall_s=0.2, step_time_s=1.5, nodes=64).every_steps < policy.every_steps
    )
    with pytest.raises(WorkloadError, match="step_time_s=0"):
        CheckpointPolicy.young_daly(checkpoint_stall_s=0.2, step_time_s=0, nodes=8)


# --- the NVRx image, built, not patched at pod start (issue 22, Also) -------------------------------------------------


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_the_job_runs_the_environments_built_image_and_installs_nothing(env: str) -> None:
    chart, objects = _chart(env)
    image = _container(objects)["image"]
    assert image.split("@")[0] == LOCK.get(f"nvrx-train-{env}").reference
    assert f"/{ENVIRONMENTS[env].cluster.name}/nvrx-train:nvrx-" in image
    assert "pip install" not in chart.script
    assert "nvidia-resiliency-ext==0.7.0" in _container(objects)["command"][-1]  # still checked at each pod start


def test_start_install_is_an_opt_in_dev_allows() -> None:
    chart, objects = _chart("dev", NvrxFsdpJob(start_install=True))
    assert _container(objects)["image"].split("@")[0] == LOCK.get(NVRX_IMAGE).reference
    assert "python -m pip install --no-cache-dir nvidia-resiliency-ext==0.7.0 transformers==5.23.0" in chart.script


def test_prod_refuses_the_start_install() -> None:
    with pytest.raises(ConfigError) as err:
        _chart("prod", NvrxFsdpJob(start_install=True))
    message = str(err.value)
    assert message.startswith("nvrx.start_install=True is invalid; allowed: False. Fix: environment prod runs")
    assert "scripts/build_nvrx_image.sh prod ACCOUNT" in message
    assert "`cdk deploy 'prod/Images'`" in message
    assert "trainctl pin --built prod --account ACCOUNT" in message


def test_synth_without_the_built_image_says_how_to_build_and_pin_it(tmp_path: Path) -> None:
    from k8s.main import ChartsNotWrittenError, synth_all

    built = r"nvrx-train-dev.*cdk deploy 'dev/Images'.*scripts/build_nvrx_image.sh dev"
    with pytest.raises(ChartsNotWrittenError, match=built):
        synth_all(tmp_path, ImageLock.load().with_digest(NVRX_IMAGE, DIGEST).with_digest("ray-train", DIGEST))
    assert (tmp_path / "dev" / "namespaces.k8s.yaml").exists()
