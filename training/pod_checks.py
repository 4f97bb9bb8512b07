"""A pod's own preconditions, checked before any training starts: fail in seconds with a named reason instead of
hours later (or never) with a symptom.

    python -m training.pod_checks --python 3.12 --package nvidia-resiliency-ext==0.7.0 --package torch>=2.9 \\
        --nccl-net-plugin ofi --efa-devices 32 --memlock unlimited \\
        --shared-dir /checkpoints --peers 2 --index 0 --run-id "$JOB_UID" \\
        --restart ft_launcher --min-aws-ofi-nccl 1.21.0 --restart inprocess --inprocess-bad-nccl 2.28.3-2.28.8

Each check prints one line, `ok   NAME: what was found` or `FAIL NAME: what was found; fix: ...`. Exit status:

    0  every precondition holds
    2  a precondition does not hold (a Job's podFailurePolicy fails the Job on exit 2: retrying the same pod spec
       on the same image cannot fix any of these), a shared directory included once it is proven not shared
    3  only peers were missing: another pod of the job never appeared within --shared-timeout (a late image pull,
       no node for it yet). Retrying can fix that, so no podFailurePolicy rule makes it permanent.

Standard library only: it runs inside the training images before anything else is imported.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import importlib.metadata
import os
import re
import resource
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

PRECONDITION_FAILED = 2
PEERS_MISSING = 3
# A peer whose name has resolved this long (its pod is running: a headless Service publishes ready pods only) while
# its marker stays invisible proves the directory is not shared. Capped at half the wait for short test waits.
PEER_RUNNING_PROOF_S = 120.0
# training/rehearsal.py's switch, spelled here too: this module imports nothing beyond the standard library.
REHEARSAL_ENV = "PLATFORM_REHEARSAL"
REHEARSAL_CPU = "cpu"
REHEARSAL_SKIP = "the image and the node's devices are not in a rehearsal"

# The EFA device plugin mounts one uverbs character device per EFA interface it allocates into the container
# (aws-efa-k8s-device-plugin: /dev/infiniband/uverbsN); libfabric's efa provider opens them.
UVERBS_GLOB = "/dev/infiniband/uverbs*"

_SPEC = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:(?P<op>==|>=)\s*(?P<version>[0-9][0-9A-Za-z.+-]*))?$")


@dataclass(frozen=True)
class Result:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    skipped: bool = False
    # A failure that a later attempt of the same pod can pass (exit PEERS_MISSING instead of PRECONDITION_FAILED).
    retryable: bool = False

    def line(self) -> str:
        if self.skipped:
            return f"skip {self.name}: {self.detail}"
        if self.ok:
            return f"ok   {self.name}: {self.detail}"
        return f"FAIL {self.name}: {self.detail}" + (f"; fix: {self.fix}" if self.fix else "")


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a PEP 440 version ('2.9.0+cu130' -> (2, 9, 0)); enough to order pinned releases."""
    numbers = re.match(r"^\d+(?:\.\d+)*", version)
    if numbers is None:
        raise ValueError(f"not a version: {version!r}")
    parts = [int(p) for p in numbers.group(0).split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def check_python(wanted: str, actual: Sequence[int] = sys.version_info[:2]) -> Result:
    found = ".".join(str(p) for p in actual[:2])
    if release(found) == release(wanted):
        return Result("python", True, f"Python {found}")
    return Result(
        "python",
        False,
        f"Python {found}, the workload needs {wanted} (its packages have wheels for {wanted})",
        "use the image the lock names for this workload (k8s/images.lock.json), or rebuild it on Python " + wanted,
    )


def check_package(spec: str, version_of: Callable[[str], str] = importlib.metadata.version) -> Result:
    match = _SPEC.match(spec.strip())
    if match is None:
        raise ValueError(f"--package {spec!r}: expected NAME, NAME==VERSION or NAME>=VERSION")
    name, op, wanted = match["name"], match["op"], match["version"]
    try:
        found = version_of(name)
    except importlib.metadata.PackageNotFoundError:
        return Result(f"package {name}", False, "not installed", f"use an image that ships {spec}")
    if op is None:
        return Result(f"package {name}", True, found)
    assert wanted is not None
    ok = release(found) == release(wanted) if op == "==" else release(found) >= release(wanted)
    if ok:
        return Result(f"package {name}", True, f"{found} ({op}{wanted})")
    return Result(f"package {name}", False, f"{found}, the workload needs {op}{wanted}", f"use an image with {spec}")


def check_nccl_net_plugin(plugin: str, load: Callable[[str], object] | None = None) -> Result:
    """NCCL >= 2.19 loads `libnccl-net-<NCCL_NET_PLUGIN>.so`, then `libnccl-net.so` (NCCL env docs); try the same
    names with the dynamic loader's own search (LD_LIBRARY_PATH, ld.so.cache), as NCCL's dlopen would."""
    opener = load if load is not None else (lambda name: ctypes.CDLL(name, mode=os.RTLD_LAZY))
    tried = []
    for name in (f"libnccl-net-{plugin}.so", "libnccl-net.so"):
        try:
            opener(name)
        except OSError as exc:
            tried.append(f"{name}: {exc}")
            continue
        return Result("nccl net plugin", True, f"{name} loads")
    return Result(
        "nccl net plugin",
        False,
        "no NCCL net plugin library loads (" + "; ".join(tried) + ")",
        "use an image with aws-ofi-nccl (the EFA installer puts it in /opt/amazon/ofi-nccl/lib) on LD_LIBRARY_PATH",
    )


# Where the EFA installer puts the plugin (aws/deep-learning-containers install_efa_amzn2023.sh: lib64/ from 1.44.0 on,
# lib/ before), after LD_LIBRARY_PATH's directories, which NCCL's dlopen searches first.
OFI_PLUGIN_DIRS = ("/opt/amazon/ofi-nccl/lib64", "/opt/amazon/ofi-nccl/lib")
OFI_PLUGIN_NAMES = ("libnccl-net-ofi.so", "libnccl-net.so")
# aws-ofi-nccl logs "Initializing " PACKAGE_STRING at init (src/nccl_ofi_net.cpp; AC_INIT([aws-ofi-nccl], ...) in
# configure.ac), so the library carries its own name and version as one string.
_OFI_VERSION = re.compile(rb"aws-ofi-nccl (\d+\.\d+\.\d+)")


def find_ofi_plugin(environ: dict[str, str] | None = None) -> Path | None:
    env = os.environ if environ is None else environ
    directories = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d] + list(OFI_PLUGIN_DIRS)
    for directory in directories:
        for name in OFI_PLUGIN_NAMES:
            if (Path(directory) / name).is_file():
                return Path(directory) / name
    return None


def aws_ofi_nccl_version(library: Path) -> str | None:
    try:
        match = _OFI_VERSION.search(library.read_bytes())
    except OSError:
        return None
    return match.group(1).decode() if match else None


def check_aws_ofi_nccl(
    minimum: str, mechanisms: Sequence[str], find: Callable[[], Path | None] = find_ofi_plugin
) -> Result:
    """aws-ofi-nccl before 1.21.0 leaks a receive-buffer registration on every communicator teardown (aws/aws-ofi-nccl
    RELEASENOTES.md v1.21.0), and every restart (`mechanisms`) tears them down: the plugin this pod loads must be
    `minimum` or later (k8s/ofi_nccl.py passes it)."""
    using = " and ".join(mechanisms)
    fix = (
        f"use an image with aws-ofi-nccl >= {minimum} (EFA installer >= 1.50.0): the environment's built image "
        "(images/nvrx/Dockerfile; rebuild it), or turn the job's restarts off"
    )
    library = find()
    found = aws_ofi_nccl_version(library) if library is not None else None
    if found is None:
        where = (
            f"{library}"
            if library is not None
            else "no plugin library in LD_LIBRARY_PATH or " + ", ".join(OFI_PLUGIN_DIRS)
        )
        return Result(
            "aws-ofi-nccl",
            False,
            f"could not read the aws-ofi-nccl version ({where}); {using} restarts need >= {minimum}",
            fix,
        )
    if release(found) < release(minimum):
        return Result(
            "aws-ofi-nccl",
            False,
            f"aws-ofi-nccl {found} ({library}) leaks host memory on every communicator teardown, which each {using} "
            f"restart does; the job needs >= {minimum}",
            fix,
        )
    return Result("aws-ofi-nccl", True, f"{found} ({library}; >= {minimum} with {using} restarts)")


def read_nccl_version() -> tuple[str | None, str]:
    """The NCCL torch loads (torch.cuda.nccl.version(): a tuple in current PyTorch, NCCL_VERSION_CODE as an int in old
    ones), with what was tried when it cannot be read. torch is imported here only, when in-process restart asks."""
    try:
        import torch

        version = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
    except Exception as exc:
        return None, f"torch.cuda.nccl.version() failed: {type(exc).__name__}: {exc}"
    if isinstance(version, int):  # NCCL_VERSION_CODE: X*10000 + Y*100 + Z from 2.9 on, X*1000 + Y*100 + Z before
        major, rest = divmod(version, 10000) if version >= 10000 else divmod(version, 1000)
        return f"{major}.{rest // 100}.{rest % 100}", "torch.cuda.nccl.version()"
    return ".".join(str(part) for part in tuple(version)[:3]), "torch.cuda.nccl.version()"


def check_inprocess_nccl(bad: str, read: Callable[[], tuple[str | None, str]] = read_nccl_version) -> Result:
    """NVRx in-process restart crashes on NCCL `bad` (LOW-HIGH, inclusive: k8s/nvrx_support.py passes it)."""
    low, _, high = bad.partition("-")
    found, how = read()
    fix = "use an image with another NCCL (the environment's built image), or turn nvrx.inprocess off"
    if found is None:
        return Result("nccl for in-process restart", False, f"could not read NCCL's version ({how})", fix)
    if release(low) <= release(found) <= release(high):
        return Result(
            "nccl for in-process restart",
            False,
            f"NCCL {found} ({how}) crashes with NVRx in-process restart (NCCL {low} to {high})",
            fix,
        )
    return Result("nccl for in-process restart", True, f"NCCL {found} ({how}; not {low} to {high})")


def check_efa_devices(wanted: int, pattern: str = UVERBS_GLOB) -> Result:
    found = sorted(glob.glob(pattern))
    if len(found) >= wanted:
        return Result("efa devices", True, f"{len(found)} uverbs device(s) ({wanted} requested)")
    return Result(
        "efa devices",
        False,
        f"{len(found)} of the {wanted} EFA device(s) the pod requested are visible ({pattern})",
        "check that the EFA device plugin runs on this node (kubectl -n kube-system get pods -o wide) and that "
        "the node's launch template attaches the EFA interfaces",
    )


# Linux capability number of CAP_IPC_LOCK (linux/capability.h).
CAP_IPC_LOCK = 14


def has_ipc_lock(status: str | None = None) -> bool:
    """Whether this process holds CAP_IPC_LOCK in its effective set (CapEff in /proc/self/status)."""
    if status is None:
        try:
            status = Path("/proc/self/status").read_text(encoding="utf-8")
        except OSError:
            return False
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_IPC_LOCK & 1)
    return False


def check_memlock(wanted: str, limits: tuple[int, int] | None = None, ipc_lock: bool | None = None) -> Result:
    """libfabric's efa provider registers (pins) memory for RDMA; a low RLIMIT_MEMLOCK makes registration fail
    under load, unless the process holds CAP_IPC_LOCK (the kernel's ib_umem_get then does not hold pinned pages to
    the limit). `wanted` is 'unlimited' or a size in bytes."""
    soft, _hard = limits if limits is not None else resource.getrlimit(resource.RLIMIT_MEMLOCK)

    def show(value: int) -> str:
        return "unlimited" if value == resource.RLIM_INFINITY else f"{value} bytes"

    need = resource.RLIM_INFINITY if wanted == "unlimited" else int(wanted)
    ok = soft == resource.RLIM_INFINITY or (need != resource.RLIM_INFINITY and soft >= need)
    if ok:
        return Result("memlock", True, show(soft))
    if ipc_lock if ipc_lock is not None else has_ipc_lock():
        return Result("memlock", True, f"{show(soft)}, with CAP_IPC_LOCK (pinned memory is not held to the limit)")
    return Result(
        "memlock",
        False,
        f"RLIMIT_MEMLOCK is {show(soft)}, EFA needs {show(need)}",
        "add the IPC_LOCK capability to the container (securityContext.capabilities.add), or run the node's "
        "container runtime with LimitMEMLOCK=infinity (containerd's systemd unit; containers inherit it)",
    )


def _markers(directory: Path) -> Iterator[int]:
    for path in directory.glob("pod-*"):
        suffix = path.name.removeprefix("pod-")
        if suffix.isdigit():
            yield int(suffix)


def resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None)
    except OSError:
        return False
    return True


def check_shared_dir(
    directory: Path,
    *,
    peers: int,
    index: int,
    run_id: str,
    timeout_s: float,
    poll_s: float = 0.5,
    peer_host: str | None = None,
    resolve: Callable[[str], bool] = resolves,
) -> Result:
    """Every pod of the job writes `pod-<index>` under DIR/.shared-check/<run id>/ and waits until it sees all
    `peers` markers: only a directory every pod mounts (a shared claim) passes; a per-pod emptyDir shows one.

    A missing marker means either a peer that has not started yet or a directory that is not shared. With
    `peer_host` (a DNS name with `{index}`, e.g. the Indexed Job's `job-{index}.job`), a peer whose name resolves
    while its marker stays invisible proves the directory unshared; a peer whose name never resolved is retryable."""
    where = directory / ".shared-check" / run_id
    try:
        where.mkdir(parents=True, exist_ok=True)
        (where / f"pod-{index}").write_text(f"{socket.gethostname()} {time.time():.3f}\n", encoding="utf-8")
    except OSError as exc:
        return Result("shared dir", False, f"cannot write to {directory}: {exc}", "mount the checkpoint claim")
    start = time.monotonic()
    deadline = start + timeout_s
    proof_s = min(PEER_RUNNING_PROOF_S, timeout_s / 2)
    running_since: dict[int, float] = {}
    while True:
        seen = set(_markers(where))
        if len(seen) >= peers:
            return Result("shared dir", True, f"{directory} is seen by all {peers} pods")
        now = time.monotonic()
        missing = sorted(set(range(peers)) - seen)
        if peer_host is not None:
            for peer in missing:
                if peer not in running_since and resolve(peer_host.format(index=peer)):
                    running_since[peer] = now
        if now >= deadline:
            proven = [peer for peer in missing if now - running_since.get(peer, now) >= proof_s]
            if proven:
                names = ", ".join(peer_host.format(index=peer) for peer in proven) if peer_host else ""
                return Result(
                    "shared dir",
                    False,
                    f"{directory} is not shared: after {timeout_s:.0f} s this pod sees the markers of pods "
                    f"{sorted(seen)} but not {missing}, although pods {proven} are running ({names} resolve)",
                    "put checkpoints on a ReadWriteMany claim that every pod mounts (FSx for Lustre), never a "
                    "per-pod emptyDir or node disk",
                )
            return Result(
                "shared dir",
                False,
                f"pods {missing} never appeared: after {timeout_s:.0f} s this pod sees the markers of pods "
                f"{sorted(seen)} and "
                + (
                    f"{', '.join(peer_host.format(index=peer) for peer in missing)} do not resolve"
                    if peer_host
                    else "cannot tell a late peer from an unshared directory (no --peer-host)"
                ),
                "a peer that starts late (image pull, no node yet) is retried; if it never starts, check the "
                "Pending pods (kubectl describe pod) and the node group's size",
                retryable=True,
            )
        time.sleep(poll_s)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training.pod_checks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--python", metavar="X.Y", help="the Python minor version the workload's packages are built for")
    add("--package", action="append", default=[], metavar="SPEC", help="NAME, NAME==VERSION or NAME>=VERSION")
    add("--nccl-net-plugin", metavar="NAME", help="the NCCL_NET_PLUGIN value whose library must load (e.g. ofi)")
    add("--efa-devices", type=int, metavar="N", help="EFA interfaces the pod requested (vpc.amazonaws.com/efa)")
    add("--memlock", metavar="BYTES|unlimited", help="the RLIMIT_MEMLOCK EFA needs")
    add("--shared-dir", type=Path, metavar="DIR", help="a directory every pod of the job must see")
    add("--peers", type=int, default=1, help="pods of the job (with --shared-dir)")
    add("--index", type=int, default=0, help="this pod's index (with --shared-dir)")
    add("--run-id", default="", help="an id unique to this run of the job, e.g. the Job's uid (with --shared-dir)")
    add("--shared-timeout", type=float, default=600.0, metavar="S", help="how long to wait for the other pods")
    add("--restart", action="append", default=[], metavar="MECHANISM", help="a restart mechanism of the job")
    add("--min-aws-ofi-nccl", metavar="X.Y.Z", help="the aws-ofi-nccl a restarting job needs (with --restart)")
    add("--inprocess-bad-nccl", metavar="LOW-HIGH", help="NCCL releases in-process restart crashes on")
    add(
        "--peer-host",
        metavar="PATTERN",
        help="the other pods' DNS name with {index} (e.g. job-{index}.job): tells a late peer from an unshared dir",
    )
    return parser


def skipped(name: str) -> Result:
    return Result(name, True, f"CPU rehearsal ({REHEARSAL_ENV}={REHEARSAL_CPU}): {REHEARSAL_SKIP}", skipped=True)


def run_checks(args: argparse.Namespace) -> list[Result]:
    results = []
    # A rehearsal runs the pod's command with this machine's Python environment and no GPU or EFA device
    # (rehearse/pods.py): the image and hardware facts are not there to check; the shared directory is.
    rehearsal = os.environ.get(REHEARSAL_ENV) == REHEARSAL_CPU
    if args.python:
        results.append(skipped("python") if rehearsal else check_python(args.python))
    results.extend(skipped(f"package {spec}") if rehearsal else check_package(spec) for spec in args.package)
    if args.nccl_net_plugin and args.nccl_net_plugin != "none":
        results.append(skipped("nccl net plugin") if rehearsal else check_nccl_net_plugin(args.nccl_net_plugin))
    if args.efa_devices:
        results.append(skipped("efa devices") if rehearsal else check_efa_devices(args.efa_devices))
    if args.memlock:
        results.append(skipped("memlock") if rehearsal else check_memlock(args.memlock))
    if args.min_aws_ofi_nccl and args.restart:
        results.append(
            skipped("aws-ofi-nccl") if rehearsal else check_aws_ofi_nccl(args.min_aws_ofi_nccl, args.restart)
        )
    if args.inprocess_bad_nccl and "inprocess" in args.restart:
        results.append(
            skipped("nccl for in-process restart") if rehearsal else check_inprocess_nccl(args.inprocess_bad_nccl)
        )
    if args.shared_dir is not None:
        results.append(
            check_shared_dir(
                args.shared_dir,
                peers=args.peers,
                index=args.index,
                run_id=args.run_id or "default",
                timeout_s=args.shared_timeout,
                peer_host=args.peer_host,
            )
        )
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.shared_dir is not None and not (0 <= args.index < args.peers):
        parser.error(f"--index {args.index} must be in 0..{args.peers - 1} (--peers {args.peers})")
    if args.peer_host is not None and "{index}" not in args.peer_host:
        parser.error(f"--peer-host {args.peer_host!r} must contain {{index}}, e.g. job-{{index}}.job")
    try:
        results = run_checks(args)
    except ValueError as exc:
        parser.error(str(exc))
    for result in results:
        print(result.line(), flush=True)
    failed = [r for r in results if not r.ok]
    if failed:
        print(f"pod preconditions failed: {', '.join(r.name for r in failed)}", file=sys.stderr, flush=True)
        return PEERS_MISSING if all(r.retryable for r in failed) else PRECONDITION_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
