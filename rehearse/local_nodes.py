"""ft_launcher "nodes" on one machine's loopback, as the NVRx Job's pods run them, for the CPU tests and the bench.

Each node is one ft_launcher (`--nproc-per-node` ranks of training.nvrx_fsdp on gloo) in its own session with its own
address (127.0.0.<index+1>, `--local-addr`: NVRx refuses two launchers of one address in a round unless told it is a
simulation), node 0 hosting the c10d rendezvous store (`is_host=1`), and, with hot spares, the node's index as its
infrastructure rank (k8s/nvrx_spec.py INFRA_RANK_ENV), as each pod exports it from JOB_COMPLETION_INDEX. `--nnodes`
is k8s/nvrx_spec.py `nnodes_arg`, the chart's spelling.

`lose(index)` is a lost node: every process of the node (the launcher, its rank monitors, and the workers, which
torch starts in sessions of their own) is stopped, then killed, so none of them outlives the others or reacts first.
`start(index)` starts a node's launcher again: a replacement pod.

Which nodes train is NVRx's choice: the first round closes once `active` nodes have joined (the store host, node 0,
always among them: it closes the rounds), so the standbys are the nodes that came last; `node_of` finds a rank's node.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from k8s.nvrx_spec import INFRA_RANK_ENV, nnodes_arg


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def process_tree(root: int) -> list[int]:
    """`root` and every process descended from it (from /proc), parents first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the fields after the last ')' are fixed.
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def _signal_all(pids: Sequence[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


@dataclass
class LocalNodes:
    """`active` + `spares` ft_launcher nodes over training.nvrx_fsdp with `training` flags."""

    launcher: str
    training: Sequence[str]
    logs: Path
    active: int
    spares: int = 0
    nproc_per_node: int = 1
    max_restarts: int = 3
    # The rendezvous's join timeout: how long survivors wait for a replacement before giving up.
    join_timeout_s: int = 120
    cwd: Path | None = None
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    port: int = field(default_factory=free_port)
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    _files: list[IO[bytes]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return self.active + self.spares

    def argv(self, index: int) -> list[str]:
        return [
            self.launcher,
            f"--nnodes={nnodes_arg(self.active, self.spares)}",
            f"--nproc-per-node={self.nproc_per_node}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{self.port}",
            "--rdzv-id=local-nodes",
            f"--rdzv-conf=is_host={int(index == 0)},join_timeout={self.join_timeout_s}",
            f"--local-addr=127.0.0.{index + 1}",
            f"--max-restarts={self.max_restarts}",
            "--monitor-interval=1",
            "-m",
            "training.nvrx_fsdp",
            *self.training,
        ]

    def start(self, index: int) -> subprocess.Popen[bytes]:
        """Starts node `index`'s launcher (again: a replacement), its output appended to LOGS/node<index>.log."""
        if not 0 <= index < self.count:
            raise ValueError(f"node {index} is not one of the {self.count} nodes")
        env = {**self.env, "TORCH_CPP_LOG_LEVEL": "ERROR"}
        env.pop(INFRA_RANK_ENV, None)
        if self.spares:
            env[INFRA_RANK_ENV] = str(index)
        self.logs.mkdir(parents=True, exist_ok=True)
        log = (self.logs / f"node{index}.log").open("ab")
        self._files.append(log)
        proc = subprocess.Popen(
            self.argv(index), cwd=self.cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.procs[index] = proc
        return proc

    def start_all(self) -> None:
        for index in range(self.count):
            self.start(index)

    def lose(self, index: int) -> float:
        """Node `index` is lost: all its processes stopped, then killed. Returns the time (time.time()) of the loss."""
        proc = self.procs[index]
        stopped: list[int] = []
        # Stop until no new process appears (a launcher may be starting a worker right now), then kill them all.
        while True:
            tree = [pid for pid in process_tree(proc.pid) if pid not in stopped]
            if not tree:
                break
            _signal_all(tree, signal.SIGSTOP)
            stopped += tree
        lost = time.time()
        _signal_all(stopped, signal.SIGKILL)
        proc.wait()
        return lost

    def node_of(self, pid: int) -> int | None:
        """The node whose processes include `pid` (a worker's, from the training journal), None if none does."""
        for index, proc in self.procs.items():
            if proc.poll() is None and pid in process_tree(proc.pid):
                return index
        return None

    def wait(self, indexes: Sequence[int], timeout_s: float) -> dict[int, int | None]:
        """Waits for the launchers of `indexes` to exit; their exit codes (None: still running at the timeout)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(self.procs[i].poll() is None for i in indexes):
            time.sleep(0.2)
        return {i: self.procs[i].poll() for i in indexes}

    def log(self, index: int) -> str:
        path = self.logs / f"node{index}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        """Kills whatever still runs (every node's whole tree)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                tree = process_tree(proc.pid)
                _signal_all(tree, signal.SIGKILL)
                proc.wait()
        for log in self._files:
            log.close()
        self._files.clear()

    def __enter__(self) -> LocalNodes:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
