"""The first process of a rehearsal pod (PID 1 of its own PID namespace).

Started by the pod runtime (rehearse/pods.py) as
`unshare --mount --uts --ipc --pid [--net] --fork --kill-child --mount-proc python -m rehearse.podinit SPEC`
and does, inside the new namespaces, what the kubelet and the container runtime would:

1. mounts: its own tmpfs on /tmp, /dev/shm and /root (HOME), each volume bind-mounted at its mountPath
   (emptyDir, PVC and ConfigMap directories prepared by the runtime; `medium: Memory` gets a tmpfs),
   read-only where asked, and its own /etc/hosts, /etc/hostname and /etc/resolv.conf;
2. tells the runtime it is ready (so the runtime can plug a veth into this network namespace) and
   waits for the go-ahead, then brings up `lo` and `eth0` with the pod address and a default route;
3. sets the hostname, runs the init containers in order, then the containers; with
   restartPolicy OnFailure a failed container is started again in the same pod (restarts counted);
4. writes each container's exit code (128 + signal when killed, as the kubelet reports it) to the
   status file and exits with the first non-zero one. PID 1 exiting ends every process of the pod.

Every file the pod writes outside its mounts is opened before /tmp is covered (bind-mounted from
/proc/self/fd), so the run's output directory may itself live under /tmp.
"""

from __future__ import annotations

import ctypes
import json
import os
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


def setup_mounts(spec: dict[str, Any]) -> None:
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    # Sources are opened first: /tmp (where the output directory may be) is covered next.
    binds = []
    for m in spec["mounts"]:
        if m["kind"] == "bind":
            fd = os.open(m["source"], os.O_PATH)
            binds.append((fd, m, os.path.isfile(m["source"])))
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


def exit_code(status: int) -> int:
    """The kubelet's view: the exit status, or 128 + signal for a killed process."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status)


class Pod:
    def __init__(self, spec: dict[str, Any], logs: dict[str, int], status_fd: int) -> None:
        self.spec = spec
        self.logs = logs
        self.status_fd = status_fd
        self.status: dict[str, Any] = {"init": {}, "containers": {}}

    def write_status(self) -> None:
        data = json.dumps(self.status).encode()
        os.ftruncate(self.status_fd, 0)
        os.pwrite(self.status_fd, data, 0)

    def start(self, container: dict[str, Any]) -> int:
        log = self.logs[container["name"]]
        proc = subprocess.Popen(
            container["argv"],
            env=container["env"],
            cwd=container["cwd"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        return proc.pid

    def wait_for(self, pids: dict[int, str]) -> tuple[str, int]:
        """Reaps every child (PID 1 inherits the orphans) until one of `pids` ends."""
        while True:
            pid, status = os.wait()
            if pid in pids:
                return pids.pop(pid), exit_code(status)

    def run(self) -> int:
        restart_on_failure = self.spec["restart_policy"] == "OnFailure"
        for container in self.spec["init_containers"]:
            restarts = 0
            while True:
                pid = self.start(container)
                _, code = self.wait_for({pid: container["name"]})
                self.status["init"][container["name"]] = {"exit_code": code, "restarts": restarts}
                self.write_status()
                if code == 0:
                    break
                if not restart_on_failure:
                    return code
                restarts += 1
        by_name = {c["name"]: c for c in self.spec["containers"]}
        running = {self.start(c): c["name"] for c in self.spec["containers"]}
        for name in by_name:
            self.status["containers"][name] = {"exit_code": None, "restarts": 0, "started": time.time()}
        self.write_status()
        first_failure = 0
        while running:
            name, code = self.wait_for(running)
            entry = self.status["containers"][name]
            entry["exit_code"] = code
            if code != 0 and restart_on_failure:
                entry["restarts"] += 1
                entry["exit_code"] = None
                running[self.start(by_name[name])] = name
            elif code != 0 and not first_failure:
                first_failure = code
            self.write_status()
        return first_failure


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    logs = {
        c["name"]: os.open(c["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        for c in [*spec["init_containers"], *spec["containers"]]
    }
    status_fd = os.open(spec["status_file"], os.O_RDWR | os.O_CREAT, 0o644)
    setup_mounts(spec)
    # Handshake: the runtime plugs this network namespace into the bridge between the two lines.
    os.write(spec["ready_fd"], b"ready\n")
    os.close(spec["ready_fd"])
    with os.fdopen(spec["go_fd"], "rb") as go:
        if go.readline().strip() != b"go":
            return 125
    setup_network(spec)
    socket.sethostname(spec["hostname"])
    return Pod(spec, logs, status_fd).run()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
