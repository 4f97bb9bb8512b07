"""The first process of a rehearsal pod (PID 1 of its own PID namespace).

Started by the pod runtime (rehearse/pods.py) as
`unshare --mount --uts --ipc --pid [--net] --fork --kill-child --mount-proc python -m rehearse.podinit SPEC`
and does, inside the new namespaces, what the kubelet and the container runtime would:

1. mounts: its own tmpfs on /dev (with the host's null, zero, full, random, urandom, tty and pts bound in),
   /tmp, /dev/shm and /root (HOME), each volume bind-mounted at its mountPath
   (emptyDir, PVC and ConfigMap directories prepared by the runtime; `medium: Memory` gets a tmpfs),
   read-only where asked, and its own /etc/hosts, /etc/hostname and /etc/resolv.conf;
2. tells the runtime it is ready (so the runtime can plug a veth into this network namespace) and
   waits for the go-ahead, then brings up `lo` and `eth0` with the pod address and a default route;
3. sets the hostname, runs the init containers in order, then the containers, restarting them in the same
   pod as the kubelet does (Kubernetes 1.36 docs concepts/workloads/pods/pod-lifecycle #restart-policy,
   #container-restarts; init-containers): restartPolicy Always (the default) restarts a main container
   whenever it exits, OnFailure only after a non-zero exit, Never not at all; an init container that fails is
   run again unless the policy is Never. Each restart waits the kubelet's back-off (`restart_backoff_s`
   doubling, capped at 30 times it: 10 s to 300 s on a node; reset once a container has run 60 times it,
   the kubelet's 10 minutes), restarts counted; the pod stays Running meanwhile;
   an init container with `restartPolicy: Always` is a native sidecar (Kubernetes 1.36 docs
   concepts/workloads/pods/sidecar-containers): started in its turn and left running, restarted when it
   exits (whatever the pod's restartPolicy, with the same back-off), stopped (SIGTERM, SIGKILL after
   terminationGracePeriodSeconds) in reverse order once every main container has ended, and never counted for
   the pod's phase;
4. writes each container's status to the status file: exit code (128 + signal when killed, as the kubelet
   reports it), reason (Completed, Error, or StartError with exit code 128 when the process could not be
   started, e.g. an executable not on PATH), and the termination message (the file at
   terminationMessagePath, a per-container bind mount; with FallbackToLogsOnError the log's tail when the
   file is empty and the container failed); then exits with the first non-zero main exit code. PID 1
   exiting ends every process of the pod. Each container's process is a `Popen` this PID 1 keeps and
   reaps itself; orphans it inherits are reaped by their own pid (`Pod.wait_any`).

Every file the pod writes outside its mounts is opened before /tmp is covered (bind-mounted from
/proc/self/fd), so the run's output directory may itself live under /tmp.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def b(value: str | None) -> bytes | None:
        return None if value is None else value.encode()

    if _libc.mount(b(source), b(target), b(fstype), ctypes.c_ulong(flags), b(data)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target} ({fstype or 'bind'}): {os.strerror(errno)}")


def _make_target(target: Path, is_file: bool) -> None:
    if is_file:
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            target.touch()
    else:
        target.mkdir(parents=True, exist_ok=True)


# A pod's /dev is its own tmpfs with the devices a container runtime gives every container (runc's default
# devices and symlinks, libcontainer/specconv/example.go), bound from the host's: files the pod creates there
# (e.g. the default terminationMessagePath /dev/termination-log) never reach the host's /dev.
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
DEV_LINKS = {
    "fd": "/proc/self/fd",
    "stdin": "/proc/self/fd/0",
    "stdout": "/proc/self/fd/1",
    "stderr": "/proc/self/fd/2",
}


def setup_dev() -> None:
    fds = {name: os.open(f"/dev/{name}", os.O_PATH) for name in DEVICES if os.path.exists(f"/dev/{name}")}
    pts = os.open("/dev/pts", os.O_PATH) if os.path.isdir("/dev/pts") else None
    _mount("tmpfs", "/dev", "tmpfs", 0, "mode=755")
    for name, fd in fds.items():
        Path(f"/dev/{name}").touch()
        _mount(f"/proc/self/fd/{fd}", f"/dev/{name}", None, MS_BIND)
        os.close(fd)
    if pts is not None:
        os.mkdir("/dev/pts")
        _mount(f"/proc/self/fd/{pts}", "/dev/pts", None, MS_BIND | MS_REC)
        os.close(pts)
        os.symlink("pts/ptmx", "/dev/ptmx")
    for name, target in DEV_LINKS.items():
        os.symlink(target, f"/dev/{name}")
    os.mkdir("/dev/shm")


def setup_mounts(spec: dict[str, Any]) -> None:
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    # Sources are opened first: /tmp (where the output directory may be) is covered next.
    binds = []
    for m in spec["mounts"]:
        if m["kind"] == "bind":
            fd = os.open(m["source"], os.O_PATH)
            binds.append((fd, m, os.path.isfile(m["source"])))
    setup_dev()
    for fs in ("/tmp", "/dev/shm", "/root"):
        _mount("tmpfs", fs, "tmpfs", 0, "mode=1777" if fs != "/root" else "mode=0700")
    for m in sorted(spec["mounts"], key=lambda m: m["target"].count("/")):
        target = Path(m["target"])
        if m["kind"] == "tmpfs":
            _make_target(target, is_file=False)
            _mount("tmpfs", str(target), "tmpfs", 0, m.get("options") or None)
            continue
        fd, _, is_file = next(b for b in binds if b[1] is m)
        _make_target(target, is_file)
        _mount(f"/proc/self/fd/{fd}", str(target), None, MS_BIND | MS_REC)
        if m.get("read_only"):
            _mount(None, str(target), None, MS_BIND | MS_REMOUNT | MS_RDONLY)
    for fd, _, _ in binds:
        os.close(fd)


def setup_network(spec: dict[str, Any]) -> None:
    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True)

    ip("link", "set", "lo", "up")
    net = spec.get("network")
    if net:
        ip("addr", "add", f"{net['address']}/{net['prefix']}", "dev", "eth0")
        ip("link", "set", "eth0", "up")
        ip("route", "add", "default", "via", net["gateway"])


def exit_code(returncode: int) -> int:
    """The kubelet's view of a `Popen.returncode`: the exit status, or 128 + signal for a killed process."""
    return 128 - returncode if returncode < 0 else returncode


# Kubernetes 1.36 pkg/kubelet/kuberuntime/kuberuntime_container.go: the message file is read up to 4096 bytes;
# FallbackToLogsOnError takes the log's last 80 lines, at most 2048 bytes (MaxContainerTerminationMessageLength,
# MaxContainerTerminationMessageLogLines, MaxContainerTerminationMessageLogLength in pkg/kubelet/container).
MESSAGE_MAX = 4096
LOG_LINES = 80
LOG_MAX = 2048
CLONE_NEWNS = 0x00020000
MESSAGE_STAGE = "/dev/.rehearsal-termination"


def start_error(container: dict[str, Any], exc: BaseException) -> str:
    """What containerd/runc report for a container whose process could not be started (reason StartError)."""
    prefix = "failed to create containerd task: failed to create shim task: OCI runtime create failed: "
    prefix += "runc create failed: unable to start container process: "
    argv0 = container["argv"][0] if container["argv"] else ""
    if isinstance(exc, OSError) and exc.filename == container["cwd"]:
        return prefix + f"error during container init: chdir to cwd ({container['cwd']!r}) set in config.json failed"
    if isinstance(exc, FileNotFoundError) and "/" not in argv0:
        return prefix + f'exec: "{argv0}": executable file not found in $PATH: unknown'
    if isinstance(exc, OSError):
        return prefix + f'exec: "{argv0}": {os.strerror(exc.errno or 0).lower()}: unknown'
    return prefix + f"{exc}: unknown"


class Container:
    """One container: its process (a Popen this PID 1 owns and reaps itself), its files, its status."""

    def __init__(self, spec: dict[str, Any], log_fd: int, log_read_fd: int, message_fd: int | None) -> None:
        self.spec = spec
        self.name: str = spec["name"]
        self.sidecar: bool = bool(spec.get("sidecar"))
        self.log_fd = log_fd
        self.log_read_fd = log_read_fd
        self.message_fd = message_fd
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.launched_at = 0.0
        # Consecutive restarts without a run long enough to reset the kubelet's back-off.
        self.crash_streak = 0
        # A mount source must be in the mounting process's own namespace: the message file is bound here in
        # the pod's namespace first (stage_message), and from this path into each container's.
        self.staged_message = f"{MESSAGE_STAGE}/{self.name}"

    def stage_message(self) -> None:
        if self.message_fd is None:
            return
        Path(MESSAGE_STAGE).mkdir(exist_ok=True)
        Path(self.staged_message).touch()
        _mount(f"/proc/self/fd/{self.message_fd}", self.staged_message, None, MS_BIND)
        _make_target(Path(self.spec["termination_message_path"]), is_file=True)

    def _enter(self) -> None:
        # In the child, before exec: a mount namespace of its own (a copy of the pod's) in which its own
        # termination-message file is at terminationMessagePath, as the kubelet bind-mounts one per container.
        if _libc.unshare(CLONE_NEWNS) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"unshare(CLONE_NEWNS): {os.strerror(errno)}")
        _mount(self.staged_message, self.spec["termination_message_path"], None, MS_BIND)

    def start(self) -> BaseException | None:
        """Starts the process; the exception when it could not be started (StartError)."""
        if self.message_fd is not None:
            os.ftruncate(self.message_fd, 0)
        try:
            self.proc = subprocess.Popen(
                self.spec["argv"],
                env=self.spec["env"],
                cwd=self.spec["cwd"],
                stdin=subprocess.DEVNULL,
                stdout=self.log_fd,
                stderr=self.log_fd,
                start_new_session=True,
                preexec_fn=self._enter if self.message_fd is not None else None,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            self.proc = None
            return exc
        return None

    def message(self, code: int) -> str:
        text = b""
        if self.message_fd is not None:
            text = os.pread(self.message_fd, MESSAGE_MAX, 0)
        if not text and code != 0 and self.spec.get("termination_message_policy") == "FallbackToLogsOnError":
            size = os.fstat(self.log_read_fd).st_size
            tail = os.pread(self.log_read_fd, 64 * 1024, max(0, size - 64 * 1024))
            text = b"".join(tail.splitlines(keepends=True)[-LOG_LINES:])[-LOG_MAX:]
        return text.decode(errors="replace")


class Pod:
    def __init__(self, spec: dict[str, Any], containers: dict[str, Container], status_fd: int) -> None:
        self.spec = spec
        self.containers = containers
        self.status_fd = status_fd
        self.status: dict[str, Any] = {"init": {}, "containers": {}}
        # Every process this PID 1 started, by pid: only these are reaped through their Popen.
        self.children: dict[int, Container] = {}
        # Container name -> when (time.monotonic) its restart is due: sidecars' and main containers' alike.
        self.restart_at: dict[str, float] = {}

    def write_status(self) -> None:
        data = json.dumps(self.status).encode()
        os.ftruncate(self.status_fd, 0)
        os.pwrite(self.status_fd, data, 0)

    def _section(self, c: Container) -> dict[str, Any]:
        section: dict[str, Any] = self.status["init" if c.spec.get("init") else "containers"]
        return section

    def launch(self, c: Container) -> bool:
        """Starts `c` and records it running, or records its StartError (exit code 128, as the kubelet does)."""
        error = c.start()
        c.launched_at = time.monotonic()
        entry: dict[str, Any] = {
            "exit_code": None,
            "restarts": c.restarts,
            "started": time.time(),
            "sidecar": c.sidecar,
        }
        if error is not None or c.proc is None:
            entry.update(exit_code=128, reason="StartError", message=start_error(c.spec, error or OSError()))
            self._section(c)[c.name] = entry
            self.write_status()
            return False
        self.children[c.proc.pid] = c
        self._section(c)[c.name] = entry
        self.write_status()
        return True

    def record_exit(self, c: Container, code: int) -> None:
        entry = self._section(c)[c.name]
        entry.update(exit_code=code, reason="Completed" if code == 0 else "Error", message=c.message(code))
        self.write_status()

    def wait_any(self, deadline: float | None = None) -> tuple[Container, int] | None:
        """The next of this pod's own containers to end, with its exit code (None: deadline passed).

        Never os.wait(): that would also reap a child a Popen still owns (its __del__ or poll then finds
        nothing, or os.wait raises ChildProcessError). waitid(WNOWAIT) only looks; our own child is reaped
        by its Popen, an orphan the pod's PID 1 inherited from a container by waitpid on its own pid.
        """
        while True:
            flags = os.WEXITED | os.WNOWAIT | (os.WNOHANG if deadline is not None else 0)
            try:
                info = os.waitid(os.P_ALL, 0, flags)
            except ChildProcessError:
                # Nothing running (every container waits for its restart): nothing can end before the deadline.
                if deadline is None:
                    raise
                time.sleep(max(0.0, deadline - time.monotonic()))
                return None
            if info is None:
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                time.sleep(0.02)
                continue
            c = self.children.pop(info.si_pid, None)
            if c is None:
                os.waitpid(info.si_pid, 0)
                continue
            assert c.proc is not None
            code = exit_code(c.proc.wait())
            # The container's other processes end with it (on a node: its cgroup is killed).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(c.proc.pid, signal.SIGKILL)
            return c, code

    def stop(self, running: list[Container]) -> None:
        """Stops sidecars after the main containers, in reverse order: SIGTERM, SIGKILL after the grace period."""
        for c in reversed(running):
            if c.proc is None or c.proc.pid not in self.children:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(c.proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + float(self.spec.get("grace_s", 30))
            while c.proc.pid in self.children:
                ended = self.wait_any(deadline)
                if ended is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(c.proc.pid, signal.SIGKILL)
                    deadline = time.monotonic() + 5
                    continue
                self.record_exit(*ended)

    def backoff(self, c: Container) -> float:
        """Schedules `c`'s restart: the kubelet's delay, doubling with each crash, reset by a long run."""
        base = float(self.spec.get("restart_backoff_s", 0.0))
        if time.monotonic() - c.launched_at >= 60 * base:
            c.crash_streak = 0
        c.crash_streak += 1
        c.restarts += 1
        return float(min(base * 2 ** (c.crash_streak - 1), 30 * base))

    def schedule_restart(self, c: Container) -> None:
        self.restart_at[c.name] = time.monotonic() + self.backoff(c)

    def wait_container(self, deadline: float | None = None) -> tuple[Container, int] | None:
        """The next container other than a sidecar to end, its exit recorded (None: `deadline` passed).

        Meanwhile restarts fall due and are launched: a sidecar that ends is restarted here whatever the pod's
        restartPolicy (Kubernetes 1.36 concepts/workloads/pods/sidecar-containers), with the same back-off; a main
        container that cannot be started again is returned with exit code 128 (its StartError recorded)."""
        while True:
            due = min(self.restart_at.values(), default=None)
            until = min((t for t in (due, deadline) if t is not None), default=None)
            ended = self.wait_any(until)
            if ended is not None:
                c, code = ended
                self.record_exit(c, code)
                if not c.sidecar:
                    return ended
                self.schedule_restart(c)
                continue
            now = time.monotonic()
            for name in sorted(n for n, at in self.restart_at.items() if at <= now):
                del self.restart_at[name]
                c = self.containers[name]
                if self.launch(c):
                    continue
                if not c.sidecar:
                    return c, 128
                self.schedule_restart(c)
            if deadline is not None and now >= deadline:
                return None

    def run(self) -> int:
        policy = self.spec["restart_policy"]
        inits = [self.containers[c["name"]] for c in self.spec["init_containers"]]
        mains = [self.containers[c["name"]] for c in self.spec["containers"]]
        sidecars: list[Container] = []
        for c in inits:
            if c.sidecar:
                # restartPolicy Always on an init container: started, kept running, next init starts.
                if not self.launch(c):
                    self.schedule_restart(c)
                sidecars.append(c)
                continue
            while True:
                code = self._run_to_end(c)
                if code == 0:
                    break
                if policy == "Never":
                    self.stop(sidecars)
                    return code
                # Only sidecars run during an init container's back-off: nothing else can end.
                self.wait_container(time.monotonic() + self.backoff(c))
        first_failure = 0
        running = {c.name for c in mains}

        def ended_with(c: Container, code: int) -> None:
            nonlocal first_failure
            if policy == "Always" or (policy == "OnFailure" and code != 0):
                self.schedule_restart(c)
                return
            if code != 0 and not first_failure:
                first_failure = code
            running.discard(c.name)

        for c in mains:
            if not self.launch(c):
                ended_with(c, 128)
        while running:
            ended = self.wait_container()
            assert ended is not None
            ended_with(*ended)
        self.stop(sidecars)
        return first_failure

    def _run_to_end(self, c: Container) -> int:
        if not self.launch(c):
            return 128
        ended = self.wait_container()
        assert ended is not None
        assert ended[0] is c
        return ended[1]


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    containers: dict[str, Container] = {}
    for c in [*({**c, "init": True} for c in spec["init_containers"]), *spec["containers"]]:
        log_fd = os.open(c["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        log_read_fd = os.open(c["log"], os.O_RDONLY)
        message_fd = (
            os.open(c["termination_file"], os.O_RDWR | os.O_CREAT, 0o644) if c.get("termination_file") else None
        )
        containers[c["name"]] = Container(c, log_fd, log_read_fd, message_fd)
    status_fd = os.open(spec["status_file"], os.O_RDWR | os.O_CREAT, 0o644)
    setup_mounts(spec)
    for c in containers.values():
        c.stage_message()
    # Handshake: the runtime plugs this network namespace into the bridge between the two lines.
    os.write(spec["ready_fd"], b"ready\n")
    os.close(spec["ready_fd"])
    with os.fdopen(spec["go_fd"], "rb") as go:
        if go.readline().strip() != b"go":
            return 125
    setup_network(spec)
    socket.sethostname(spec["hostname"])
    return Pod(spec, containers, status_fd).run()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
