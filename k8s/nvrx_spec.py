"""Typed settings of the NVRx fault-tolerant FSDP job and the command lines built from them.

Layers of recovery, fastest first, and the timeouts that keep them in that order (NVRx 0.7.0):

1. in-process restart (`nvidia_resiliency_ext.inprocess.Wrapper`), an explicit option, off by default: an exception
   or a hung collective is handled inside the same processes within seconds (soft < hard < barrier). Deprecated
   upstream since NVRx 0.6.0 (docs/source/release-notes.md "Deprecations & Removals": no new features, use in-job
   restart); its APIs work unchanged in 0.7.0;
2. `ft_launcher` (torchrun plus a rank monitor per rank, barrier rendezvous): a dead or silent rank (SIGKILL, OOM,
   an exception, a hang) restarts every worker of every node from the last complete checkpoint (any-failed, the only
   policy from 0.6.0 on);
3. Kubernetes: a failed pod is replaced by the Job controller (node loss, eviction).

The PyTorch NCCL watchdog must not fire before layer 1 has had its chance: with in-process restart its collective
timeout and its heartbeat monitor are set above the Wrapper's hard timeout.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from infra.spec.environments import DNS_LABEL
from infra.spec.operating import NODE_MTBF, FailureRate
from k8s.nvrx_support import NVRX_DISTRIBUTION
from k8s.ray_spec import CHECKPOINT_MOUNT, WorkloadError
from k8s.workloads import require_pinned_packages
from training.nvrx_config import TimeoutNames, inprocess_timeout_problem

# The job's image in k8s/images.lock.json.
NVRX_IMAGE = "nvrx-train"

RENDEZVOUS_PORT = 29500
# The store behind each in-process iteration's process group (training/nvrx_fsdp.py: a PrefixStore per iteration
# over one TCPStore hosted by rank 0; --store-addr).
INPROCESS_STORE_PORT = 29501
# The NVRx Wrapper's own TCPStore (restart barriers, rank assignment): training/nvrx_fsdp.py build_wrapper puts it
# at --store-addr's port + 1.
WRAPPER_STORE_PORT = INPROCESS_STORE_PORT + 1
# Parse and validate the training arguments, then exit: 0 valid, 2 not (training/nvrx_fsdp.py).
CHECK_ARGS_FLAG = "--check-args"
# Hot spares (NvrxFsdpJob.spares): what ft_launcher reads as a node's infrastructure rank when no SLURM variable is
# set (nvidia-resiliency-ext 0.7.0 fault_tolerance/utils.py:225 get_infrastructure_rank: SLURM_PROCID, else
# GROUP_RANK). The barrier rendezvous makes the `min` lowest infrastructure ranks active, in that order
# (ft_rendezvous_barrier.py:954-991 _assign_group_ranks), so pinning it to the pod's index keeps pod 0, which hosts
# the rendezvous store and the in-process stores (--store-addr), at group rank 0 in every round; unset, the ranks
# are drawn from the sorted node addresses (ft_rendezvous_barrier.py:858-877) and rank 0 may land on any pod.
INFRA_RANK_ENV = "GROUP_RANK"
# The most hot spares one job may hold (each is a whole idle GPU node in the queue's quota).
MAX_SPARES = 4
# The first NVRx whose ft_launcher keeps MIN:MAX nodes as standbys (the barrier rendezvous, checked in 0.7.0). 0.4.1's
# rendezvous (fault_tolerance/_ft_rendezvous.py, torch's dynamic one) admits up to MAX nodes into the world instead:
# the spares would train, at a world size the checkpoints and batch sizes were not set for.
SPARES_MIN_NVRX = (0, 7, 0)


def nnodes_arg(active: int, spares: int = 0) -> str:
    """ft_launcher's `--nnodes`: the active node count, or `active:active+spares` with hot spares. With MIN:MAX the
    barrier rendezvous trains on `min` nodes (WORLD_SIZE = min x nproc-per-node, nvidia-resiliency-ext 0.7.0
    fault_tolerance/launcher.py:2952-2959) and keeps the others as standbys that wait at Step 0 of the rendezvous until
    a failure opens the next round (ft_rendezvous_barrier.py:1902-1906, 2029-2043)."""
    return f"{active}:{active + spares}" if spares else str(active)


class CheckpointMode(Enum):
    ASYNC = "async"
    SYNC = "sync"


@dataclass(frozen=True, kw_only=True)
class CheckpointPolicy:
    # 600: with no measured step time (k8s/checkpoint_writes.py takes the fastest step the GPUs could run), the 18.5 GB
    # state must be written within WRITE_FRACTION of the interval on both environments' file systems: prod's
    # 2 x p5.48xlarge (0.0767 s a step, written in 15.8 s) needs 413 steps, dev's 2 x g6.12xlarge (0.627 s a step,
    # written in 158.1 s on SCRATCH_2) 505. Far below the Young-Daly interval either way (trainctl goodput).
    every_steps: int = 600
    mode: CheckpointMode = CheckpointMode.ASYNC
    keep: int = 3

    @classmethod
    def young_daly(
        cls,
        *,
        checkpoint_stall_s: float,
        step_time_s: float,
        nodes: int,
        failures: FailureRate = NODE_MTBF,
        **kwargs: Any,
    ) -> CheckpointPolicy:
        """The interval that minimises expected lost time from measured figures (`trainctl goodput` prints them):
        sqrt(2 x stall x the job's MTBF) in steps of `step_time_s`, at least 1."""
        if step_time_s <= 0:
            raise WorkloadError(f"nvrx.checkpoint step_time_s={step_time_s} must be > 0 (a measured step time)")
        interval = failures.checkpoint_interval_s(checkpoint_stall_s=checkpoint_stall_s, nodes=nodes)
        return cls(every_steps=max(1, round(interval / step_time_s)), **kwargs)

    def __post_init__(self) -> None:
        if self.every_steps < 1:
            raise WorkloadError(f"nvrx.checkpoint.every_steps={self.every_steps} must be at least 1")
        if self.keep < 2:
            # While a new checkpoint is being written the previous one is the only complete one.
            raise WorkloadError(f"nvrx.checkpoint.keep={self.keep} must be at least 2 (one may be in flight)")


@dataclass(frozen=True, kw_only=True)
class InProcessRestart:
    """NVRx `inprocess.Wrapper` settings: off unless asked for.

    Deprecated upstream from NVRx 0.6.0 (release-notes.md: "no longer the focus of the fast-restart solution; use
    in-job restart via ft_launcher"; inprocess/ is the same in 0.7.0 and gets no new features). Under ft_launcher 0.7.0
    the only restart policy is any-failed (fault_tolerance/launcher.py `--ft-restart-policy` choices), which needs no
    flag: a rank the Wrapper cannot recover exits, and ft_launcher restarts every worker; 0.6's
    docs/source/fault_tolerance/integration/inprocess.rst asks only that ft_launcher's heartbeat timeouts exceed the
    in-process ones (checked by NvrxFsdpJob).

    The Wrapper's soft timeout runs from the start of each iteration, not from the first step: its automatic
    progress timestamp advances only while the main thread runs Python (NVRx 0.7.0 progress_watchdog.py, a
    Py_AddPendingCall every interval), and the manual one starts at the first `ping()` (wrap.py CallWrapper.ping),
    which training/nvrx_fsdp.py sends from the step loop. So model load, FSDP sharding and a DCP restore all count:
    a rank blocked in a C call there (a collective waiting for a rank that is still reading) looks hung. 300 s
    covers a restore of the 1.5B model with AdamW state (~18 GB of fp32 shards) from the dev SCRATCH_2 file system
    (1.2 TiB x 200 MB/s/TiB baseline = 240 MB/s, ~75 s) four times over, and a first model download into HF_HOME.
    """

    enabled: bool = False
    # No progress for soft_timeout: a restart of the wrapped function on every rank.
    soft_timeout_s: int = 300
    # No progress for hard_timeout: the rank is killed (ft_launcher takes over).
    hard_timeout_s: int = 360
    barrier_timeout_s: int = 420
    # Runs of the training function (the first included) before the Wrapper gives up and the
    # process exits, leaving the restart to ft_launcher.
    max_iterations: int = 5

    def __post_init__(self) -> None:
        # The rule the training CLI applies to the flags this writes (training/nvrx_config.py), in field names.
        names = TimeoutNames("soft_timeout_s", "hard_timeout_s", "barrier_timeout_s", separator="=")
        problem = inprocess_timeout_problem(self.soft_timeout_s, self.hard_timeout_s, self.barrier_timeout_s, names)
        if problem is not None:
            raise WorkloadError(f"nvrx.inprocess.{problem}")
        if self.max_iterations < 1:
            raise WorkloadError(f"nvrx.inprocess.max_iterations={self.max_iterations} must be at least 1")


@dataclass(frozen=True, kw_only=True)
class FtLauncherConfig:
    """`ft_launcher` flags (nvidia-resiliency-ext 0.7.0 spellings: tests/k8s/test_nvrx_chart.py parses the emitted
    command line with 0.7.0's own parser)."""

    max_restarts: int = 3
    monitor_interval_s: int = 5
    # Model download/load from FSx and FSDP sharding happen before the first heartbeat.
    initial_rank_heartbeat_timeout_s: int = 1200
    # Between heartbeats (one per step): above the in-process hard timeout (checked by NvrxFsdpJob), or ft_launcher
    # would kill a hung rank before the in-process restart had its chance.
    rank_heartbeat_timeout_s: int = 600
    # c10d rendezvous (`--rdzv-conf`, NVRx 0.7.0 fault_tolerance/launcher.py LaunchConfig.__post_init__ has the
    # defaults): a pod that is not the store's host first probes pod 0's store for store_connect_wait (default 120 s,
    # c10d_monkey_patch.py), which a pod whose image pulled minutes before pod 0's exceeds on fresh p5 nodes (the DLC
    # is many GB and no layer is cached); read_timeout (default 60 s) then bounds each store operation; join_timeout
    # (default 300 s) the whole rendezvous. By then the pods' shared-dir check has seen every pod.
    rendezvous_store_connect_wait_s: int = 900
    rendezvous_read_timeout_s: int = 900
    rendezvous_join_timeout_s: int = 1200
    rank_termination_signal: str = "SIGKILL"
    # The NIC monitor reads InfiniBand `link_downed` counters; EFA devices are not known to
    # expose them (unverified on p5), so it stays off rather than raising false alarms.
    enable_nic_monitor: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.max_restarts <= 100:
            raise WorkloadError(f"nvrx.ft_launcher.max_restarts={self.max_restarts} must be 0 to 100")
        if not 0 < self.rank_heartbeat_timeout_s <= self.initial_rank_heartbeat_timeout_s:
            raise WorkloadError(
                "nvrx.ft_launcher heartbeat timeouts must satisfy 0 < rank <= initial; got "
                f"rank={self.rank_heartbeat_timeout_s} initial={self.initial_rank_heartbeat_timeout_s}"
            )
        if not 0 < self.rendezvous_read_timeout_s <= self.rendezvous_join_timeout_s or not (
            0 < self.rendezvous_store_connect_wait_s <= self.rendezvous_join_timeout_s
        ):
            raise WorkloadError(
                "nvrx.ft_launcher rendezvous timeouts must satisfy 0 < read <= join and 0 < store_connect_wait <= "
                f"join; got read={self.rendezvous_read_timeout_s} store_connect_wait="
                f"{self.rendezvous_store_connect_wait_s} join={self.rendezvous_join_timeout_s}"
            )
        if self.rank_termination_signal not in ("SIGKILL", "SIGTERM"):
            raise WorkloadError(
                f"nvrx.ft_launcher.rank_termination_signal={self.rank_termination_signal!r}: use SIGKILL or SIGTERM"
            )

    def argv(
        self, *, nodes: int, gpus_per_node: int, rendezvous_host: str, rendezvous_id: str, spares: int = 0
    ) -> list[str]:
        """ft_launcher and its flags, up to (not including) the training module; `nodes` active, `spares` standby.

        `--rdzv-conf` is added per pod by `launch_script` (only pod 0 hosts the store: is_host).
        """
        return [
            "ft_launcher",
            f"--nnodes={nnodes_arg(nodes, spares)}",
            f"--nproc-per-node={gpus_per_node}",
            "--rdzv-backend=c10d",
            # Barrier-based rendezvous: the default and, in 0.7.0, the only choice (launcher.py --ft-rdzv-impl).
            "--ft-rdzv-impl=barrier",
            f"--rdzv-endpoint={rendezvous_host}:{RENDEZVOUS_PORT}",
            f"--rdzv-id={rendezvous_id}",
            f"--max-restarts={self.max_restarts}",
            f"--monitor-interval={self.monitor_interval_s}",
            f"--ft-initial-rank-heartbeat-timeout={self.initial_rank_heartbeat_timeout_s}",
            f"--ft-rank-heartbeat-timeout={self.rank_heartbeat_timeout_s}",
            f"--ft-rank-termination-signal={self.rank_termination_signal}",
            f"--ft-enable-nic-monitor={self.enable_nic_monitor}",
        ]

    def rendezvous_conf(self) -> str:
        """The `--rdzv-conf` value after `is_host=<0|1>` (comma-separated key=value, torch's format)."""
        return (
            f"store_connect_wait_seconds={self.rendezvous_store_connect_wait_s},"
            f"read_timeout={self.rendezvous_read_timeout_s},join_timeout={self.rendezvous_join_timeout_s}"
        )


@dataclass(frozen=True, kw_only=True)
class NvrxFsdpJob:
    """The fault-tolerant FSDP fine-tune (training/nvrx_fsdp.py) as an Indexed Job."""

    name: str = "nvrx-fsdp"
    model: str = "Qwen/Qwen2.5-1.5B"
    steps: int = 2000
    batch_size: int = 4
    seq_len: int = 2048
    seed: int = 0
    # The GPU node group; None: the environment's first.
    gpu_group: str | None = None
    # Nodes (one pod each); None: the group's desired size. Always 2 or more: one node has no
    # fabric to lose and nothing for ft_launcher's rendezvous to coordinate.
    nodes: int | None = None
    checkpoint: CheckpointPolicy = field(default_factory=CheckpointPolicy)
    inprocess: InProcessRestart = field(default_factory=InProcessRestart)
    ft_launcher: FtLauncherConfig = field(default_factory=FtLauncherConfig)
    # The packages the job needs beyond the PyTorch DLC, pinned: baked into the built image (images/nvrx/Dockerfile,
    # infra/images.py) and checked at each pod's start; installed at start only with start_install.
    pip: tuple[str, ...] = ("nvidia-resiliency-ext==0.7.0", "transformers==5.23.0")
    # Run on the lock's PyTorch DLC (nvrx-train) and pip-install `pip` at every pod start instead of the environment's
    # built image (nvrx-train-<env>): an explicit opt-in for a first try, refused where the environment does not
    # allow it (infra/spec/images.py NvrxImageConfig; never prod).
    start_install: bool = False
    active_deadline_seconds: int = 24 * 3600
    ttl_seconds_after_finished: int = 86400
    # Losses of pod 0's node the Job survives. Pod 0 hosts the c10d rendezvous store (is_host) and the in-process
    # stores, so when it goes the ft_launcher of every other pod fails too, on a healthy node (no DisruptionTarget):
    # the Job counts nodes - 1 failures per loss (tests/rehearse/test_nvrx_faults.py). The lost pods themselves,
    # and any other pod lost with its node, carry DisruptionTarget and count nothing (the Ignore rule).
    store_host_losses: int = 2
    # The Job's backoffLimit; None: backoff_limit_for(nodes), sized from store_host_losses.
    backoff_limit: int | None = None
    # How long each pod waits for the other pods' markers in the checkpoint directory (training/pod_checks.py):
    # pods start as far apart as their image pulls finish. Longer than Kueue's waitForPodsReady timeout (20 min,
    # infra/addons/kueue.py), so a peer that cannot start (no node) gets the workload evicted and requeued by Kueue
    # before this pod gives up; a pod that does give up on a missing peer exits 3, which no FailJob rule matches.
    preconditions_timeout_s: int = 1500
    # The fabric gate before step 1 (training/fabric_gate.py): on for every emitted job.
    fabric_gate: bool = True
    # Hot spares: pods beyond `nodes` that join ft_launcher's rendezvous as standbys (`--nnodes=nodes:nodes+spares`)
    # and take a lost node's ranks at the next rendezvous round, in seconds, instead of the job waiting for Kubernetes
    # to evict and replace the lost pod (infra/spec/node_loss.py: 50 + 300 s before a replacement even exists). Each
    # is a whole GPU node the Job holds idle: parallelism, completions and the Kueue Workload count nodes + spares.
    # They do not cover the loss of pod 0 (the rendezvous store's host: every launcher fails with it, see
    # store_host_losses). docs/nvrx.md "Hot spares".
    spares: int = 0
    # One training step's measured time, seconds (trainctl goodput prints it): required on a Capacity Block group,
    # where each rank stops one step before the block's stop point (k8s/capacity_deadline.py, training/deadline.py).
    step_seconds: float | None = None
    # From the job's admission to its first step, seconds: image pulls, the pods' preconditions, model load and the
    # fabric gate. On a Capacity Block group Kueue stops admitting once startup plus the steps to the first checkpoint
    # no longer fit before the block's stop point (capacity_hold/, k8s/capacity_deadline.py first_checkpoint_lead).
    # None: Kueue's waitForPodsReady timeout (infra/spec/kueue.py), the longest a workload's pods may take to start.
    startup_seconds: float | None = None

    def __post_init__(self) -> None:
        if not DNS_LABEL.match(self.name):
            raise WorkloadError(
                f"nvrx.name={self.name!r} must be lower-case letters, digits and '-', start with a letter, 1-32 chars"
            )
        for name, value in (("steps", self.steps), ("batch_size", self.batch_size), ("seq_len", self.seq_len)):
            if value < 1:
                raise WorkloadError(f"nvrx.{name}={value} must be at least 1")
        if self.nodes is not None and self.nodes < 2:
            raise WorkloadError(f"nvrx.nodes={self.nodes} must be at least 2 (a multi-node job)")
        require_pinned_packages("nvrx.pip", self.pip)
        if self.active_deadline_seconds < 600:
            raise WorkloadError(f"nvrx.active_deadline_seconds={self.active_deadline_seconds} is below 600")
        if self.backoff_limit is not None and not 0 <= self.backoff_limit <= 100:
            raise WorkloadError(f"nvrx.backoff_limit={self.backoff_limit} must be 0 to 100, or None to size it")
        if not 0 <= self.store_host_losses <= 10:
            raise WorkloadError(f"nvrx.store_host_losses={self.store_host_losses} must be 0 to 10")
        if self.inprocess.enabled and self.ft_launcher.rank_heartbeat_timeout_s <= self.inprocess.hard_timeout_s:
            raise WorkloadError(
                f"nvrx.ft_launcher.rank_heartbeat_timeout_s={self.ft_launcher.rank_heartbeat_timeout_s} must exceed "
                f"nvrx.inprocess.hard_timeout_s={self.inprocess.hard_timeout_s}: ft_launcher would kill a hung rank "
                "before the in-process restart could handle it"
            )
        if not 10 <= self.preconditions_timeout_s <= 3600:
            raise WorkloadError(f"nvrx.preconditions_timeout_s={self.preconditions_timeout_s} must be 10 to 3600")
        if self.step_seconds is not None and not 0 < self.step_seconds <= 3600:
            raise WorkloadError(f"nvrx.step_seconds={self.step_seconds} must be > 0 and at most 3600")
        if self.startup_seconds is not None and not 0 < self.startup_seconds <= 6 * 3600:
            raise WorkloadError(f"nvrx.startup_seconds={self.startup_seconds} must be > 0 and at most 21600 (6 h)")
        self.check_spares(self.nodes)

    def nvrx_version(self) -> tuple[int, ...] | None:
        """The NVRx version pinned in `pip` (None when it is not pinned there)."""
        for requirement in self.pip:
            name, _, version = requirement.partition("==")
            if name.strip().lower() == NVRX_DISTRIBUTION and version:
                return tuple(int(part) for part in version.strip().split(".")[:3] if part.isdigit())
        return None

    def check_spares(self, nodes: int | None) -> None:
        """Refuses a spares count outside 0..min(MAX_SPARES, nodes) (`nodes` active, when known), and spares on an
        NVRx without standbys."""
        most = MAX_SPARES if nodes is None else min(MAX_SPARES, nodes)
        if not 0 <= self.spares <= most:
            why = f"at most {MAX_SPARES}" + ("" if nodes is None else f" and at most nvrx.nodes={nodes}")
            raise WorkloadError(
                f"nvrx.spares={self.spares} must be 0 (no hot spares) to {most} ({why}: a spare only replaces an "
                "active node, and each holds a whole idle GPU node); use 0 to turn hot spares off"
            )
        version = self.nvrx_version()
        if self.spares and (version is None or version < SPARES_MIN_NVRX):
            pinned = ".".join(map(str, version)) if version else "unpinned"
            needed = ".".join(map(str, SPARES_MIN_NVRX))
            raise WorkloadError(
                f"nvrx.spares={self.spares} needs {NVRX_DISTRIBUTION} {needed} or later in "
                f"nvrx.pip (pinned: {pinned}): before it, ft_launcher's --nnodes=MIN:MAX admits the spares into the "
                "training world instead of keeping them standby; pin the newer NVRx (and its image) or use spares=0"
            )

    def pods(self, nodes: int) -> int:
        """The Indexed Job's pods for `nodes` active nodes: the active ones and the hot spares."""
        return nodes + self.spares

    def success_policy(self) -> dict[str, Any] | None:
        """With hot spares, the Job is complete once pod 0 succeeds. Pod 0 is always group rank 0 (INFRA_RANK_ENV),
        and its ft_launcher exits 0 only after its workers finished the last step, which ends with a barrier of every
        rank (training/nvrx_fsdp.py), and after waiting for the other active launchers (launcher.py:671-679, the exit
        barrier). Without it every index must succeed: a standby exits 0 when it sees the rendezvous closed
        (ft_rendezvous_barrier.py:1347-1350, launcher.py:1694), but a replacement pod for a lost standby or active
        node that starts after pod 0 has gone finds no rendezvous store, fails, and is retried into backoffLimit."""
        if not self.spares:
            return None
        return {"rules": [{"succeededIndexes": "0"}]}

    def backoff_limit_for(self, nodes: int) -> int:
        """backoffLimit for `nodes` pods: nodes - 1 counted failures per loss of pod 0, store_host_losses times
        (Kubernetes fails the Job once its counted failures exceed backoffLimit)."""
        if self.backoff_limit is not None:
            return self.backoff_limit
        return (nodes - 1) * self.store_host_losses

    @property
    def checkpoint_dir(self) -> str:
        return f"{CHECKPOINT_MOUNT}/{self.name}"

    @property
    def collective_timeout_s(self) -> int:
        """NCCL collective (watchdog) timeout: it tears the process down, so it must outlast the
        Wrapper's hard timeout (NVRx requirement); hard + barrier, as training/nvrx_fsdp.py derives."""
        if self.inprocess.enabled:
            return self.inprocess.hard_timeout_s + self.inprocess.barrier_timeout_s
        return 1800

    @property
    def ports(self) -> dict[str, int]:
        """The ports the pods listen on, by name (at most 15 characters, IANA_SVC_NAME): the c10d rendezvous, and with
        in-process restart the store behind its process groups and the NVRx Wrapper's own store."""
        ports = {"rendezvous": RENDEZVOUS_PORT}
        if self.inprocess.enabled:
            ports |= {"inprocess-store": INPROCESS_STORE_PORT, "wrapper-store": WRAPPER_STORE_PORT}
        return ports

    @property
    def fabric_gate_dir(self) -> str:
        """Where the gate counts its failures per run: on the claim every pod mounts."""
        return f"{self.checkpoint_dir}/fabric-gate"

    def training_argv(self, *, store_host: str, gate_flags: list[str] | None = None) -> list[str]:
        """The training module and its flags (the CLI of training/nvrx_fsdp.py); `gate_flags` from
        k8s/fabric_gate_spec.py when the job is gated."""
        argv = [
            "-m",
            "training.nvrx_fsdp",
            f"--model={self.model}",
            f"--steps={self.steps}",
            f"--batch-size={self.batch_size}",
            f"--seq-len={self.seq_len}",
            f"--seed={self.seed}",
            "--device=cuda",
            f"--ckpt-dir={self.checkpoint_dir}",
            f"--ckpt-every={self.checkpoint.every_steps}",
            f"--ckpt-mode={self.checkpoint.mode.value}",
            f"--ckpt-keep={self.checkpoint.keep}",
            f"--metrics-file={self.checkpoint_dir}/metrics.json",
            f"--pg-timeout={self.collective_timeout_s}",
        ]
        if self.inprocess.enabled:
            argv += [
                "--inprocess",
                f"--inprocess-soft-timeout={self.inprocess.soft_timeout_s}",
                f"--inprocess-hard-timeout={self.inprocess.hard_timeout_s}",
                f"--inprocess-barrier-timeout={self.inprocess.barrier_timeout_s}",
                f"--inprocess-max-iterations={self.inprocess.max_iterations}",
                # ft_launcher sets MASTER_ADDR=localhost in every worker; the Wrapper's store
                # must be the one on pod 0, named explicitly.
                f"--store-addr={store_host}:{INPROCESS_STORE_PORT}",
            ]
        return argv + list(gate_flags or [])

    def watchdog_env(self) -> dict[str, str]:
        """PyTorch/NCCL settings NVRx needs, beside the fabric env (NVRx in-process usage guide)."""
        env = {
            # The monitoring thread aborts a process whose NCCL watchdog is stuck; after the
            # Wrapper's hard timeout, so that in-process restart is tried first.
            "TORCH_NCCL_ENABLE_MONITORING": "1",
            "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": str(self.collective_timeout_s),
            # Tear the process down on a watchdog-detected NCCL error (PyTorch's default, written
            # out): ft_launcher then restarts the workers instead of a rank hanging.
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
            # The Wrapper's store polling times out by design; keep c10d's warnings out of the logs.
            "TORCH_CPP_LOG_LEVEL": "error",
        }
        if self.inprocess.enabled:
            env |= {
                # A rethrown CUDA/NCCL error in the watchdog kills the process and defeats the
                # in-process restart (NVRx known issue); the Wrapper handles it instead.
                "TORCH_NCCL_RETHROW_CUDA_ERRORS": "0",
                # NVLink SHARP communicators cannot be aborted and re-created in-process
                # (NVRx known issue); p5's NVSwitch would otherwise enable NVLS.
                "NCCL_NVLS_ENABLE": "0",
            }
        return env


def launch_script(
    job: NvrxFsdpJob, *, launcher_argv: list[str], training_argv: list[str], preconditions: str, supervised: bool
) -> str:
    """The container's shell script: pinned NVRx if the image lacks it (start_install only); the training arguments
    validated and the pod's preconditions checked, each exiting 2 on failure (the Job's podFailurePolicy fails the
    Job at once: ft_launcher turns any worker failure into its own exit 1, so a bad flag must be caught before it
    starts);
    then exec ft_launcher, under the pod's supervisor when `supervised` (the job is gated, or on a Capacity Block): it
    exits the pod with the gate's or the deadline's code (training/deadline.py), which ft_launcher would turn into 1."""
    pip = shlex.join(["python", "-m", "pip", "install", "--no-cache-dir", *job.pip])
    rdzv_conf = f'"--rdzv-conf=is_host=$is_host,{job.ft_launcher.rendezvous_conf()}"'
    supervisor = "python -m training.fabric_gate supervise -- " if supervised else ""
    # With hot spares the pod's index is its infrastructure rank: the lowest indexes train, pod 0 is rank 0.
    infra_rank = [f'export {INFRA_RANK_ENV}="$JOB_COMPLETION_INDEX"'] if job.spares else []
    return "\n".join(
        [
            "set -euo pipefail",
            # Pod 0 hosts the c10d rendezvous store; the others connect to it. The endpoint is a
            # DNS name, which torch cannot reliably match against the pod's own addresses.
            'if [ "$JOB_COMPLETION_INDEX" = 0 ]; then is_host=1; else is_host=0; fi',
            *infra_rank,
            *([f"python -c 'import nvidia_resiliency_ext' 2>/dev/null || {pip}"] if job.start_install else []),
            f"mkdir -p {shlex.quote(job.checkpoint_dir)}",
            f"python {shlex.join(training_argv)} {CHECK_ARGS_FLAG}",
            preconditions,
            f"exec {supervisor}{shlex.join(launcher_argv)} {rdzv_conf} {shlex.join(training_argv)}",
        ]
    )
