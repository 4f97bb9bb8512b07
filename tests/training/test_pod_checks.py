"""training.pod_checks run as the pods run it: real subprocesses, real dlopen, real rlimits, real directories."""

from __future__ import annotations

import ctypes
import errno
import importlib.metadata
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from training import pod_checks
from training.pod_checks import (
    CAP_IPC_LOCK,
    check_efa_devices,
    check_memlock,
    check_package,
    check_python,
    check_shared_dir,
    has_ipc_lock,
    release,
)

ROOT = Path(__file__).resolve().parents[2]
CLI = (sys.executable, "-m", "training.pod_checks")


def run(*args: str, env: dict[str, str] | None = None, preexec=None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        preexec_fn=preexec,
    )


def test_release_orders_versions_numerically() -> None:
    assert release("2.9.0+cu130") == release("2.9") == (2, 9)
    assert release("2.13.0") > release("2.9.1")
    with pytest.raises(ValueError, match="not a version"):
        release("main")


def test_python_version() -> None:
    assert check_python("3.12", (3, 12)).ok
    failed = check_python("3.12", (3, 13))
    assert not failed.ok
    assert failed.line().startswith("FAIL python: Python 3.13, the workload needs 3.12")
    assert "k8s/images.lock.json" in failed.fix


def test_packages_against_what_is_installed_here() -> None:
    torch = importlib.metadata.version("torch")
    assert check_package(f"torch=={torch}").ok
    assert check_package("torch>=2.0").ok
    too_new = check_package("torch>=99")
    assert (too_new.ok, too_new.detail) == (False, f"{torch}, the workload needs >=99")
    missing = check_package("nvidia-resiliency-ext-not-a-package")
    assert (missing.ok, missing.detail) == (False, "not installed")
    with pytest.raises(ValueError, match="expected NAME"):
        check_package("torch<2")


def test_efa_devices(tmp_path: Path) -> None:
    for n in range(2):
        (tmp_path / f"uverbs{n}").touch()
    assert check_efa_devices(2, str(tmp_path / "uverbs*")).ok
    short = check_efa_devices(32, str(tmp_path / "uverbs*"))
    assert not short.ok
    assert short.detail.startswith("2 of the 32 EFA device(s) the pod requested are visible")


def test_memlock() -> None:
    assert check_memlock("unlimited", (resource.RLIM_INFINITY, resource.RLIM_INFINITY)).ok
    assert check_memlock("65536", (1 << 20, 1 << 20)).ok
    low = check_memlock("unlimited", (8 << 20, 8 << 20), ipc_lock=False)
    assert not low.ok
    assert low.detail == f"RLIMIT_MEMLOCK is {8 << 20} bytes, EFA needs unlimited"
    assert "add the IPC_LOCK capability" in low.fix


def test_memlock_with_ipc_lock_is_enough() -> None:
    """Issue 17 #7: with CAP_IPC_LOCK the kernel does not hold pinned (registered) memory to RLIMIT_MEMLOCK, which
    on the AL2023 AMI is systemd's default for containerd's children; the EFA pods add the capability."""
    capped = check_memlock("unlimited", (8 << 20, 8 << 20), ipc_lock=True)
    assert capped.ok
    assert capped.detail == f"{8 << 20} bytes, with CAP_IPC_LOCK (pinned memory is not held to the limit)"


@pytest.mark.parametrize(
    ("cap_eff", "expected"),
    [("000001ffffffffff", True), ("00000000a80425fb", False), ("0000000000004000", True)],
)
def test_ipc_lock_read_from_the_effective_capabilities(cap_eff: str, expected: bool) -> None:
    # a80425fb: the container runtime's default set (no IPC_LOCK, bit 14); 4000: IPC_LOCK alone.
    assert has_ipc_lock(f"Name:\tpython\nCapInh:\t0000000000000000\nCapEff:\t{cap_eff}\n") is expected
    assert has_ipc_lock("Name:\tpython\n") is False


def test_a_cpu_rehearsal_skips_the_image_and_device_checks_but_not_the_shared_dir(tmp_path: Path) -> None:
    argv = ["--python", "2.7", "--package", "no-such-package==1", "--nccl-net-plugin", "ofi", "--efa-devices", "32"]
    argv += ["--memlock", "unlimited", "--shared-dir", str(tmp_path), "--peers", "2", "--shared-timeout", "1"]
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "PLATFORM_REHEARSAL": "cpu"}
    result = subprocess.run(
        [sys.executable, "-m", "training.pod_checks", *argv], env=env, capture_output=True, text=True, timeout=60
    )
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "skip python",
        "skip package no-such-package==1",
        "skip nccl net plugin",
        "skip efa devices",
        "skip memlock",
        "FAIL shared dir",
    ]
    # Only the peer is missing, and without --peer-host nothing proves the directory unshared: retryable.
    assert result.returncode == 3


def test_shared_dir_seen_by_every_pod_passes(tmp_path: Path) -> None:
    shared = tmp_path / "claim"
    pods = [
        subprocess.Popen(
            [
                *CLI,
                "--shared-dir",
                str(shared),
                "--peers",
                "2",
                "--index",
                str(i),
                "--run-id",
                "u1",
                "--shared-timeout",
                "30",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=60)[0] for p in pods]
    assert [p.returncode for p in pods] == [0, 0]
    assert all(f"ok   shared dir: {shared} is seen by all 2 pods" in out for out in outputs)


def test_per_pod_directories_fail_with_the_fix(tmp_path: Path) -> None:
    """Each pod has its own directory (what a per-pod emptyDir is): pod 0 never sees pod 1's marker although
    pod 1 is running (its name resolves): proven unshared, not retryable."""
    result = check_shared_dir(
        tmp_path / "pod0",
        peers=2,
        index=0,
        run_id="r",
        timeout_s=1.0,
        poll_s=0.1,
        peer_host="j-{index}.j",
        resolve=lambda host: host == "j-1.j",
    )
    assert not result.ok
    assert not result.retryable
    assert result.detail == (
        f"{tmp_path / 'pod0'} is not shared: after 1 s this pod sees the markers of pods [0] but not [1], "
        "although pods [1] are running (j-1.j resolve)"
    )
    assert "ReadWriteMany" in result.fix


def test_a_peer_that_never_appeared_is_retryable_not_a_verdict_on_the_directory(tmp_path: Path) -> None:
    """Issue 22 #6: a late peer (image pull, no node yet) used to exit 2, which the Job's FailJob rule made
    permanent before Kueue's waitForPodsReady could requeue the workload."""
    result = check_shared_dir(
        tmp_path,
        peers=3,
        index=0,
        run_id="r",
        timeout_s=0.5,
        poll_s=0.1,
        peer_host="j-{index}.j",
        resolve=lambda host: False,
    )
    assert (result.ok, result.retryable) == (False, True)
    assert result.detail == (
        "pods [1, 2] never appeared: after 0 s this pod sees the markers of pods [0] and j-1.j, j-2.j do not resolve"
    )


def test_the_cli_exits_3_for_a_missing_peer_and_2_for_a_proven_unshared_directory(tmp_path: Path) -> None:
    common = ["--shared-dir", str(tmp_path), "--peers", "2", "--index", "0", "--shared-timeout", "1"]
    late = run(*common, "--peer-host", "no-such-peer-{index}.invalid")
    assert late.returncode == 3, late.stdout + late.stderr
    assert "FAIL shared dir: pods [1] never appeared" in late.stdout
    # 127.0.0.1 always resolves: a running peer whose marker this pod cannot see.
    unshared = run(*["--shared-dir", str(tmp_path / "own"), *common[2:]], "--peer-host", "127.0.0.{index}")
    assert unshared.returncode == 2, unshared.stdout + unshared.stderr
    assert "is not shared" in unshared.stdout
    assert run(*common, "--peer-host", "no-placeholder").returncode == 2


def test_a_previous_runs_markers_do_not_count(tmp_path: Path) -> None:
    old = tmp_path / ".shared-check" / "old-job-uid"
    old.mkdir(parents=True)
    (old / "pod-1").write_text("old\n")
    assert not check_shared_dir(tmp_path, peers=2, index=0, run_id="new-job-uid", timeout_s=0.5, poll_s=0.1).ok


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build a stand-in plugin library")
def test_nccl_net_plugin_is_loaded_with_the_dynamic_loader(tmp_path: Path) -> None:
    missing = run("--nccl-net-plugin", "ofi", env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(tmp_path)})
    assert missing.returncode == pod_checks.PRECONDITION_FAILED
    assert "FAIL nccl net plugin: no NCCL net plugin library loads (libnccl-net-ofi.so:" in missing.stdout
    source = tmp_path / "plugin.c"
    source.write_text("int ncclNetPlugin_v8 = 0;\n")
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-o", str(tmp_path / "libnccl-net-ofi.so"), str(source)], check=True, timeout=60
    )
    found = run("--nccl-net-plugin", "ofi", env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(tmp_path)})
    assert (found.returncode, found.stdout.strip()) == (0, "ok   nccl net plugin: libnccl-net-ofi.so loads")


def test_cli_exit_2_names_every_failed_check(tmp_path: Path) -> None:
    def low_memlock() -> None:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 << 10, resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]))
        # Without CAP_IPC_LOCK after exec (root keeps every capability otherwise, and the limit would not bind).
        pr_capbset_drop = 24
        if ctypes.CDLL(None, use_errno=True).prctl(pr_capbset_drop, CAP_IPC_LOCK, 0, 0, 0) != 0:
            assert ctypes.get_errno() == errno.EPERM  # not root: the capability was never there

    done = run(
        "--python",
        "3.12" if sys.version_info[:2] != (3, 12) else "3.13",
        "--package",
        "torch",
        "--memlock",
        "unlimited",
        preexec=low_memlock,
    )
    assert done.returncode == 2
    lines = done.stdout.splitlines()
    assert lines[0].startswith("FAIL python: Python ")
    assert lines[1].startswith("ok   package torch: ")
    assert lines[2] == f"FAIL memlock: RLIMIT_MEMLOCK is {64 << 10} bytes, EFA needs unlimited; fix: " + (
        "add the IPC_LOCK capability to the container (securityContext.capabilities.add), or run the node's "
        "container runtime with LimitMEMLOCK=infinity (containerd's systemd unit; containers inherit it)"
    )
    assert done.stderr.strip() == "pod preconditions failed: python, memlock"


def test_cli_passes_when_everything_holds() -> None:
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    done = run("--python", version, "--package", "torch>=2.0", "--package", "numpy")
    assert (done.returncode, done.stderr) == (0, "")
    assert len(done.stdout.splitlines()) == 3


def test_bad_arguments_exit_2_from_argparse() -> None:
    assert run("--package", "torch<2").returncode == 2
    assert run("--shared-dir", "/tmp/x", "--peers", "2", "--index", "2").returncode == 2


# --- the restart facts the pod reads itself: aws-ofi-nccl's leak, NCCL with in-process restart ----------------------


def _plugin(tmp_path: Path, version: str | None) -> Path:
    library = tmp_path / "libnccl-net-ofi.so"
    text = b"\x7fELF..." + (f"\x00Initializing aws-ofi-nccl {version}\x00".encode() if version else b"\x00nothing")
    library.write_bytes(text)
    return library


def test_aws_ofi_nccl_version_is_read_from_the_plugin_library(tmp_path: Path) -> None:
    assert pod_checks.aws_ofi_nccl_version(_plugin(tmp_path, "1.22.0")) == "1.22.0"
    assert pod_checks.aws_ofi_nccl_version(_plugin(tmp_path, None)) is None


def test_a_leaking_aws_ofi_nccl_with_restarts_fails_and_names_the_fix(tmp_path: Path) -> None:
    library = _plugin(tmp_path, "1.20.0")
    bad = pod_checks.check_aws_ofi_nccl("1.21.0", ["ft_launcher"], find=lambda: library)
    assert not bad.ok
    assert "aws-ofi-nccl 1.20.0" in bad.detail
    assert "ft_launcher" in bad.detail
    assert "EFA installer >= 1.50.0" in bad.fix
    good = pod_checks.check_aws_ofi_nccl("1.21.0", ["ft_launcher"], find=lambda: _plugin(tmp_path, "1.22.0"))
    assert good.ok
    assert "1.22.0" in good.detail


def test_an_unreadable_aws_ofi_nccl_version_is_named_not_passed(tmp_path: Path) -> None:
    missing = pod_checks.check_aws_ofi_nccl("1.21.0", ["inprocess"], find=lambda: None)
    assert not missing.ok
    assert "could not read" in missing.detail
    unversioned = pod_checks.check_aws_ofi_nccl("1.21.0", ["inprocess"], find=lambda: _plugin(tmp_path, None))
    assert not unversioned.ok
    assert "could not read" in unversioned.detail


def test_inprocess_restart_on_a_crashing_nccl_fails() -> None:
    bad = pod_checks.check_inprocess_nccl("2.28.3-2.28.8", read=lambda: ("2.28.5", "torch.cuda.nccl.version()"))
    assert not bad.ok
    assert "NCCL 2.28.5" in bad.detail
    assert pod_checks.check_inprocess_nccl("2.28.3-2.28.8", read=lambda: ("2.29.7", "torch")).ok
    unknown = pod_checks.check_inprocess_nccl("2.28.3-2.28.8", read=lambda: (None, "no torch here"))
    assert not unknown.ok
    assert "could not read" in unknown.detail
    assert "no torch here" in unknown.detail


def test_the_restart_checks_follow_the_flags_and_skip_in_a_cpu_rehearsal(monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["--restart", "ft_launcher", "--min-aws-ofi-nccl", "1.21.0", "--restart", "inprocess",
            "--inprocess-bad-nccl", "2.28.3-2.28.8"]  # fmt: skip
    monkeypatch.setenv(pod_checks.REHEARSAL_ENV, pod_checks.REHEARSAL_CPU)
    lines = [r.line() for r in pod_checks.run_checks(pod_checks.build_parser().parse_args(args))]
    assert [line.split(":")[0] for line in lines] == ["skip aws-ofi-nccl", "skip nccl for in-process restart"]
    # No restart mechanism: nothing to check; ft_launcher alone: no NCCL read.
    assert pod_checks.run_checks(pod_checks.build_parser().parse_args(args[2:4])) == []
    only_ft = pod_checks.run_checks(pod_checks.build_parser().parse_args([*args[:4], *args[6:]]))
    assert [r.name for r in only_ft] == ["aws-ofi-nccl"]
