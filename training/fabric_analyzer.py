"""Did NCCL use EFA? A per-rank verdict from `NCCL_DEBUG=INFO` logs.

    python -m training.fabric_analyzer [FILE ...|-] [--json]

Reads NCCL logs (files, or stdin when no file or `-` is given) and decides, for every process
that wrote NCCL lines (a "rank", identified by host and pid), which network NCCL really used:

    efa       aws-ofi-nccl loaded, selected the libfabric `efa` provider, and NCCL used the plugin's
              network ("Using network AWS Libfabric" / "Libfabric", channels "via NET/AWS Libfabric/...")
    degraded  not EFA and not plain sockets: aws-ofi-nccl selected another provider (tcp, sockets,
              tcp;ofi_rxm, shm, ...), NCCL used another network of its own (NET/IB, e.g. soft-RoCE
              `NET/IB : Using [0]rxe0:1/RoCE`), or libfabric's efa provider found no device
              (`fi_getinfo: provider efa output empty list`): on this platform anything but EFA through
              aws-ofi-nccl is a fallback
    socket    aws-ofi-nccl failed or was absent and NCCL used its internal socket transport
              ("Using network Socket", "via NET/Socket/...", "Initialized NET plugin Socket", or
              "NET/Socket : Using ..." after the plugin failed / "NET/IB : No device found.")
    unknown   no line says which network was used: set NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=INIT,NET

The overall verdict is `efa` only if there is at least one rank and every rank is `efa`; any
`socket` or `degraded` rank makes it a fallback. Exit status (ExitStatus, mapped in EXIT_STATUS):

    0  every rank used EFA
    1  fallback detected: at least one rank on sockets or on a degraded provider
    2  could not run: an unreadable file, bad arguments
    3  no evidence: no rank, a rank without network-selection lines, or fewer ranks in the input than
       NCCL's `nRanks` says the communicator has (and no fallback)

Lines are recognised by the NCCL prefix `host:pid:tid [cudaDev] NCCL INFO|WARN`, wherever it is
in the line, so the wrappers logs carry in practice do not matter: `mpirun --tag-output`
(`[1,0]<stdout>:`), Ray (`(RayTrainWorker pid=1234, ip=10.0.1.5) `), `kubectl logs --prefix`
(`[pod/NAME/CONTAINER] `), timestamps (kubectl --timestamps, CloudWatch, NCCL's own `[date]`),
tab-separated exports, and JSON lines from log shippers (`{"log": "...", "kubernetes": {...}}`).
A rank is named by the host:pid of its NCCL lines; a line without that prefix falls back to
the wrapper's identity (Ray pid/ip, pod name, MPI rank), then to the input's name.

Standard library only: it also runs inside training containers.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum, StrEnum
from typing import Any, BinaryIO, TextIO


class Verdict(StrEnum):
    EFA = "efa"
    DEGRADED = "degraded"
    SOCKET = "socket"
    UNKNOWN = "unknown"


class ExitStatus(IntEnum):
    EFA = 0
    """Every rank used EFA through aws-ofi-nccl."""
    FALLBACK = 1
    """At least one rank fell back: NCCL's socket transport or a non-efa provider."""
    ERROR = 2
    """Could not run: an unreadable file, bad arguments."""
    NO_EVIDENCE = 3
    """No rank, ranks without network-selection lines, or fewer ranks than NCCL reported (and no fallback)."""


EXIT_STATUS: dict[Verdict, ExitStatus] = {
    Verdict.EFA: ExitStatus.EFA,
    Verdict.SOCKET: ExitStatus.FALLBACK,
    Verdict.DEGRADED: ExitStatus.FALLBACK,
    Verdict.UNKNOWN: ExitStatus.NO_EVIDENCE,
}
"""The one place where an overall verdict becomes an exit status."""

DEBUG_HINT = "set NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=INIT,NET on every worker and run again"

OFI_NETWORKS = frozenset({"aws libfabric", "libfabric", "ofi"})
"""Names aws-ofi-nccl registers its network under (`AWS Libfabric` before 1.11, `Libfabric` since)."""
SOCKET_NETWORK = "socket"
EFA_PROVIDERS = frozenset({"efa", "efa-direct"})

MAX_EVIDENCE = 6
EVIDENCE_CHARS = 400

# --- line parsing -----------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# host:pid:tid [cudaDev] NCCL INFO ...; WARN lines carry `file:line` or `func(args):line` before NCCL. The
# level is found first and the prefix looked for only in a window before it, so long lines stay linear.
_LEVEL = re.compile(r"NCCL (?:INFO|WARN|TRACE|ABORT)\b ?")
_PREFIX = re.compile(r"(?P<host>[A-Za-z0-9][A-Za-z0-9_.\-]*):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] ")
_PREFIX_WINDOW = 400
_LINE_BREAKS = re.compile(r"[\r\n]+")
_RAY_DEDUP = re.compile(r"\s*\[repeated \d+x across cluster\].*$")

# Wrappers before the NCCL line, stripped repeatedly from the start of a line.
_TIMESTAMP = re.compile(
    r"\[?\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?: ?(?:Z|UTC|[+-]\d{2}:?\d{2}))?\]?[\s|]+"
)
# A copy from the CloudWatch console glues the timestamp column to the message: `...04.208-07:00ip-10-36-29-253:...`.
# Only a timestamp with a zone ends unambiguously, so only that one is stripped when a letter follows directly.
_GLUED_TIMESTAMP = re.compile(
    r"\[?\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:\d{2})\]?(?=[A-Za-z])"
)
_KUBECTL = re.compile(r"\[pod/(?P<pod>[^/\]\s]+)/(?P<container>[^\]\s]+)\]\s+")
_MPIRUN = re.compile(r"\[(?P<job>\d+),(?P<rank>\d+)\]<(?:stdout|stderr|stddiag)>:")
_RAY = re.compile(r"\((?P<actor>[^()\s]*)\s*pid=(?P<pid>\d+)(?:, ip=(?P<ip>[0-9A-Fa-f.:]+))?[^()]*\)\s+")

# What a message says (matched against the text after `NCCL INFO `/`NCCL WARN `).
_NCCL_VERSION = re.compile(r"^NCCL version (?P<version>\S+)")
_OFI_VERSION = re.compile(r"NET/OFI (?:Using|Initializing) aws-ofi-nccl (?P<version>\S+)")
_PROVIDER = re.compile(
    r"NET/OFI Selected [Pp]rovider is (?P<provider>[^\s,]+)"
    r"(?:, fabric is (?P<fabric>[^\s,]+))?(?:.*?\(found (?P<nics>\d+) nics?\))?"
)
_PLUGIN_LOADED = re.compile(
    r"NET/Plugin ?: ?Loaded net plugin (?P<name>.+?) \(v\d+\)|Successfully loaded external (?:network )?plugin"
)
_USING_NETWORK = re.compile(r"^Using network (?P<name>.+?)\s*$")
_ASSIGNED = re.compile(r"^Assigned NET plugin (?P<name>.+?) to comm")
_INITIALIZED = re.compile(r"^Initialized NET plugin (?P<name>.+?)\s*$")
_CHANNEL = re.compile(r"^(?:Channel|Ring|Tree) \d+(?:/\d+)? : .*?\bvia NET/(?P<name>[^/]+?)/")
_PLUGIN_MISSING = re.compile(
    r"NET/Plugin ?: ?(?:No plugin found|Could not find|Plugin load returned|dlerror=|Using internal network plugin"
    r"|.*cannot open shared object file)"
    r"|Failed to open (?:\S*/)?lib[nr]ccl-net\S*"
    r"|ncclOsDlopen\(\S*lib[nr]ccl-net[^)]*\) failed"
)
_OFI_FAILED = re.compile(
    r"NET/OFI .*?(?:initialization failed|Initializing plugin failed|No eligible providers"
    r"|Unable to find a protocol that worked|Only EFA provider is supported|Couldn't find any optimal provider"
    r"|fi_getinfo\(\) call failed)"
    r"|Failed to initialize NET plugin (?:AWS )?Libfabric"
)
_NO_NETWORK = re.compile(r"Failed to initialize any NET plugin|Error: network .+ not found")
_IB_NO_DEVICE = re.compile(r"NET/IB ?: ?No device found")
_IB_INIT = re.compile(r"NET/IB ?: ?Using (?P<devices>\[\d+\]\S+(?: \[\d+\]\S+)*)")
# libfabric's own log line (FI_LOG_LEVEL=warn), not NCCL's:
# `libfabric:PID:TIME::core:core:fi_getinfo_():1391<warn> ...`.
_EFA_EMPTY = re.compile(r"fi_getinfo: provider efa output empty list")
_LIBFABRIC_PID = re.compile(r"libfabric:(?P<pid>\d+):\d+:")
_GDR_CHANNEL = re.compile(r"^(?:Channel|Ring|Tree) \d+(?:/\d+)? : .*?\bvia NET/(?P<name>[^/]+?)/\d+/GDRDMA")
# NCCL's error traces (`graph/topo.cc:683 -> 2`) and warnings while it reads the node's PCI/NVLink topology.
_TOPO_FAILED = re.compile(
    r"\bgraph/(?:topo|xml|search|paths|connect|tuning)\.cc:\d+ -> \d+|Could not find real path of|ncclTopo\w+.* failed"
)
_INIT_STARTED = re.compile(r"^NCCL version |^Bootstrap ?: ?Using")
_INIT_COMPLETE = re.compile(r"Init COMPLETE")
_SOCKET_INIT = re.compile(r"NET/Socket ?: ?Using \[")
_RANK = re.compile(r"\brank (?P<rank>\d+) n[Rr]anks (?P<nranks>\d+)")
_CUDA_DEV = re.compile(r"\bcudaDev (?P<dev>\d+)")


class Signal(StrEnum):
    """What one NCCL line tells about the network; a rank's verdict is decided from these."""

    USING_NETWORK = "using-network"  # "Using network X"
    ASSIGNED = "assigned"  # "Assigned NET plugin X to comm"
    CHANNEL = "channel"  # "Channel ... via NET/X/..."
    INITIALIZED = "initialized"  # "Initialized NET plugin X"
    PROVIDER = "provider"  # "NET/OFI Selected provider is P"
    PLUGIN_LOADED = "plugin-loaded"
    OFI_VERSION = "ofi-version"
    PLUGIN_MISSING = "plugin-missing"
    OFI_FAILED = "ofi-failed"
    NO_NETWORK = "no-network"
    IB_NO_DEVICE = "ib-no-device"
    SOCKET_INIT = "socket-init"
    IB_INIT = "ib-init"  # "NET/IB : Using [0]dev:port/RoCE": NCCL's own IB transport came up
    EFA_EMPTY = "efa-empty"  # libfabric: "fi_getinfo: provider efa output empty list"
    GDR_CHANNEL = "gdr-channel"  # "Channel ... via NET/X/N/GDRDMA"
    TOPO_FAILED = "topo-failed"
    INIT_STARTED = "init-started"
    INIT_COMPLETE = "init-complete"


NETWORK_IN_USE = (Signal.USING_NETWORK, Signal.ASSIGNED, Signal.CHANNEL)
"""Lines that say which network NCCL used (Initialized NET plugin only says one came up)."""


@dataclass(frozen=True)
class Evidence:
    """One log line that supports a verdict: where it is and what it says."""

    source: str
    line: int
    text: str
    order: int = field(default=0, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "line": self.line, "text": self.text}

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.text}"


@dataclass(frozen=True)
class RankVerdict:
    host: str
    pid: int | None
    rank: int | None
    """The NCCL rank in the largest communicator this process joined, when a line says it."""
    nranks: int | None
    cuda_dev: int | None
    verdict: Verdict
    reason: str
    evidence: tuple[Evidence, ...]
    network: str | None = None
    provider: str | None = None
    nccl_version: str | None = None
    ofi_nccl_version: str | None = None
    plugin_error: str | None = None
    """Why aws-ofi-nccl was not used, in its own or NCCL's words, when a line says it."""
    advice: str | None = field(default=None, compare=False)
    """For an unknown rank: what to do instead of the generic NCCL_DEBUG hint (topology failure, truncated log)."""

    @property
    def name(self) -> str:
        return self.host if self.pid is None else f"{self.host}:{self.pid}"

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "pid": self.pid,
            "rank": self.rank,
            "nranks": self.nranks,
            "cuda_dev": self.cuda_dev,
            "verdict": self.verdict.value,
            "reason": self.reason,
            "network": self.network,
            "provider": self.provider,
            "nccl_version": self.nccl_version,
            "ofi_nccl_version": self.ofi_nccl_version,
            "plugin_error": self.plugin_error,
            "evidence": [e.to_json() for e in self.evidence],
        }


@dataclass
class FabricReport:
    ranks: list[RankVerdict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Caveats about the input (ranks missing, lines hidden by Ray's deduplication)."""
    errors: list[str] = field(default_factory=list)
    """Inputs that could not be read; any error makes the exit status ERROR."""
    sources: list[str] = field(default_factory=list)
    world_size: int | None = None
    """The rank count of the largest communicator NCCL reported (its `rank R nRanks N` lines), if any."""
    ranks_seen: int = 0
    """How many of that communicator's ranks have lines in the input."""

    @property
    def missing_ranks(self) -> int:
        return 0 if self.world_size is None else max(0, self.world_size - self.ranks_seen)

    @property
    def verdict(self) -> Verdict:
        found = {r.verdict for r in self.ranks}
        for worst in (Verdict.SOCKET, Verdict.DEGRADED, Verdict.UNKNOWN):
            if worst in found:
                return worst
        # Ranks NCCL counted but the input does not show (Ray's deduplication, a missing pod log) are unjudged:
        # every rank shown on EFA is not evidence that the job was.
        if self.missing_ranks:
            return Verdict.UNKNOWN
        return Verdict.EFA if self.ranks else Verdict.UNKNOWN

    @property
    def exit_status(self) -> ExitStatus:
        return ExitStatus.ERROR if self.errors else EXIT_STATUS[self.verdict]

    def counts(self) -> dict[str, int]:
        return {v.value: sum(1 for r in self.ranks if r.verdict is v) for v in Verdict}

    def summary(self) -> str:
        n = len(self.ranks)
        counts = self.counts()
        verdict = self.verdict
        if self.errors:
            return f"could not run: {len(self.errors)} input(s) could not be read; see the errors"
        if verdict is Verdict.EFA:
            return f"PASS: all {n} rank(s) used EFA (aws-ofi-nccl, provider efa)"
        if verdict in (Verdict.SOCKET, Verdict.DEGRADED):
            bad = counts[Verdict.SOCKET] + counts[Verdict.DEGRADED]
            parts = ", ".join(f"{counts[v]} {v.value}" for v in (Verdict.SOCKET, Verdict.DEGRADED) if counts[v])
            hints = []
            if counts[Verdict.SOCKET]:
                hints.append(
                    "socket: NCCL ran over TCP because aws-ofi-nccl did not load or found no EFA device "
                    "(is libnccl-net*.so on LD_LIBRARY_PATH, does the pod request vpc.amazonaws.com/efa?); "
                    "NCCL_NET='AWS Libfabric' makes NCCL fail instead of falling back"
                )
            if counts[Verdict.DEGRADED]:
                hints.append(
                    "degraded: libfabric picked a non-EFA provider (check FI_PROVIDER=efa and `fi_info -p efa` "
                    "in the pod) or NCCL used a network other than aws-ofi-nccl"
                )
            return f"FAIL: {bad} of {n} rank(s) fell back from EFA ({parts}). " + "; ".join(hints)
        if not n:
            return f"UNKNOWN: no NCCL log lines in the input; {DEBUG_HINT}"
        if self.missing_ranks and not any(r.verdict is Verdict.UNKNOWN for r in self.ranks):
            return (
                f"UNKNOWN: the input shows {self.ranks_seen} of the {self.world_size} ranks NCCL reported "
                f"({counts[Verdict.EFA]} shown used EFA); the others are not judged. Collect every rank's log: "
                "RAY_DEDUP_LOGS=0 for Ray jobs (or the worker session logs), every pod of the job"
            )
        unknown = [r for r in self.ranks if r.verdict is Verdict.UNKNOWN]
        advice = {r.advice for r in unknown}
        if len(advice) == 1 and None not in advice:
            return f"UNKNOWN: {len(unknown)} of {n} rank(s) have no line saying which network NCCL used: {advice.pop()}"
        stopped = [r for r in unknown if r.plugin_error]
        if len(stopped) == len(unknown):
            return (
                f"UNKNOWN: on {len(stopped)} of {n} rank(s) aws-ofi-nccl did not work and no line says NCCL used "
                "any network (with NCCL_NET set, NCCL stops instead of falling back): EFA is not usable there, "
                "see the reasons"
            )
        return (
            f"UNKNOWN: {len(unknown)} of {n} rank(s) have no line saying which network NCCL used "
            f"({counts[Verdict.EFA]} used EFA); {DEBUG_HINT}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "exit_code": int(self.exit_status),
            "summary": self.summary(),
            "counts": self.counts(),
            "world_size": self.world_size,
            "ranks_seen": self.ranks_seen,
            "ranks": [r.to_json() for r in self.ranks],
            "notes": list(self.notes),
            "errors": list(self.errors),
            "sources": list(self.sources),
        }

    def render(self) -> tuple[str, str]:
        """(stdout, stderr) for people: a table, the evidence of failing ranks, notes, the summary."""
        out: list[str] = []
        if self.ranks:
            rows = [
                [
                    r.host,
                    "-" if r.pid is None else str(r.pid),
                    "-" if r.rank is None else f"{r.rank}/{r.nranks}",
                    "-" if r.cuda_dev is None else str(r.cuda_dev),
                    r.verdict.value,
                    r.reason,
                ]
                for r in self.ranks
            ]
            out.append(_table(["HOST", "PID", "RANK", "DEV", "VERDICT", "REASON"], rows))
            failing = [r for r in self.ranks if r.verdict is not Verdict.EFA and r.evidence]
            if failing:
                out.append("")
                out.append("evidence:")
                for r in failing:
                    rank = "" if r.rank is None else f" rank {r.rank}"
                    out.append(f"  {r.name}{rank} ({r.verdict.value}):")
                    out.extend(f"    {e}" for e in r.evidence)
            out.append("")
        out.extend(f"note: {note}" for note in self.notes)
        out.append(self.summary())
        err = "".join(f"error: {message}\n" for message in self.errors)
        return "\n".join(out) + "\n", err


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns two spaces apart (the layout of trainctl.output.table)."""
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(headers)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in [headers, *rows]
    )


# --- collecting -------------------------------------------------------------------------------

Key = tuple[str, int | None]
"""(host, pid) of a rank; pid is None when only a pod or an input's name identifies it."""


@dataclass
class _Tally:
    count: int = 0
    first: list[Evidence] = field(default_factory=list)

    def add(self, evidence: Evidence) -> None:
        self.count += 1
        if len(self.first) < 3:
            self.first.append(evidence)

    def merge(self, other: _Tally) -> None:
        self.count += other.count
        self.first = sorted([*self.first, *other.first], key=lambda e: e.order)[:3]

    @property
    def order(self) -> int:
        return self.first[0].order


Found = tuple[Signal, str, _Tally]
"""A signal, its value (network, provider, version; the matched words for flags) and the lines that said it."""


@dataclass
class _RankState:
    host: str
    pid: int | None
    order: int
    cuda_dev: int | None = None
    nccl_version: str | None = None
    ofi_version: str | None = None
    comms: dict[int, set[int]] = field(default_factory=dict)
    """nranks -> the ranks this process holds in communicators of that size."""
    signals: dict[tuple[Signal, str], _Tally] = field(default_factory=dict)

    def note(self, signal: Signal, value: str, evidence: Evidence) -> None:
        self.signals.setdefault((signal, value), _Tally()).add(evidence)

    def merge(self, other: _RankState) -> None:
        self.order = min(self.order, other.order)
        self.cuda_dev = self.cuda_dev if self.cuda_dev is not None else other.cuda_dev
        self.nccl_version = self.nccl_version or other.nccl_version
        self.ofi_version = self.ofi_version or other.ofi_version
        for nranks, ranks in other.comms.items():
            self.comms.setdefault(nranks, set()).update(ranks)
        for key, tally in other.signals.items():
            self.signals.setdefault(key, _Tally()).merge(tally)

    def of(self, *kinds: Signal) -> list[Found]:
        """The given signals, in log order."""
        found = [(kind, value, tally) for (kind, value), tally in self.signals.items() if kind in kinds]
        return sorted(found, key=lambda item: item[2].order)


@dataclass(frozen=True)
class _Parsed:
    nccl: Key | None
    wrapper: Key | None
    dev: int | None
    message: str
    text: str


def _strip_wrappers(line: str) -> tuple[str, Key | None]:
    """The line without leading wrappers (timestamps, kubectl, mpirun, Ray), and the identity they give."""
    identity: Key | None = None
    position = 0
    while True:
        while position < len(line) and line[position] in " \t":
            position += 1
        for pattern in (_TIMESTAMP, _GLUED_TIMESTAMP, _KUBECTL, _MPIRUN, _RAY):
            match = pattern.match(line, position)
            if match:
                break
        else:
            return line[position:], identity
        position = match.end()
        if pattern is _KUBECTL:
            identity = (match["pod"], None)
        elif pattern is _MPIRUN:
            identity = identity or (f"mpi-rank-{match['rank']}", None)
        elif pattern is _RAY:
            identity = (match["ip"] or "ray", int(match["pid"]))


def _unwrap_json(line: str) -> tuple[str, Key | None] | None:
    """The message and pod of a JSON log record ({"log"|"message": ..., "kubernetes": {"pod_name": ...}})."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    message = next((record[k] for k in ("log", "message", "msg") if isinstance(record.get(k), str)), None)
    if message is None:
        return None
    kubernetes = record.get("kubernetes")
    host = kubernetes.get("pod_name") if isinstance(kubernetes, dict) else record.get("host")
    return message, ((host, None) if isinstance(host, str) and host else None)


def parse_line(line: str) -> Iterator[_Parsed]:
    """The NCCL lines in one physical line (several when carriage returns joined them)."""
    line = _ANSI.sub("", line)
    wrapper: Key | None = None
    stripped = line.strip()
    if stripped.startswith("{") and stripped.endswith("}"):
        unwrapped = _unwrap_json(stripped)
        if unwrapped is not None:
            line, wrapper = unwrapped
    for segment in _LINE_BREAKS.split(line):
        if "NCCL " not in segment:
            if _EFA_EMPTY.search(segment):
                yield _libfabric_line(segment, wrapper)
            continue
        rest, identity = _strip_wrappers(segment)
        split = split_nccl(rest)
        if split is None:
            continue
        prefix, message = split
        yield _Parsed(
            nccl=None if prefix is None else (prefix["host"], int(prefix["pid"])),
            wrapper=identity or wrapper,
            dev=None if prefix is None else int(prefix["dev"]),
            message=_RAY_DEDUP.sub("", message).strip(),
            text=segment.strip(),
        )


def pid_key(pid: int) -> Key:
    """The identity of a line known only by its process id (libfabric's own lines); joins the one NCCL rank with it."""
    return ("<pid>", pid)


def _libfabric_line(segment: str, wrapper: Key | None) -> _Parsed:
    rest, identity = _strip_wrappers(segment)
    pid = _LIBFABRIC_PID.search(rest)
    key = pid_key(int(pid["pid"])) if pid else identity or wrapper
    return _Parsed(nccl=None, wrapper=key, dev=None, message=rest.strip(), text=segment.strip())


def split_nccl(text: str) -> tuple[re.Match[str] | None, str] | None:
    """(the `host:pid:tid [dev]` prefix if any, the message after `NCCL INFO `), or None for other lines."""
    level = _LEVEL.search(text)
    if level is None:
        return None
    start = max(0, level.start() - _PREFIX_WINDOW)
    prefix = _PREFIX.search(text, start, level.start())
    return prefix, text[level.end() :]


_NAMED = (
    (_USING_NETWORK, Signal.USING_NETWORK, "name"),
    (_ASSIGNED, Signal.ASSIGNED, "name"),
    (_CHANNEL, Signal.CHANNEL, "name"),
    (_INITIALIZED, Signal.INITIALIZED, "name"),
    (_PROVIDER, Signal.PROVIDER, "provider"),
    (_PLUGIN_LOADED, Signal.PLUGIN_LOADED, "name"),
    (_OFI_VERSION, Signal.OFI_VERSION, "version"),
    (_IB_INIT, Signal.IB_INIT, "devices"),
    (_GDR_CHANNEL, Signal.GDR_CHANNEL, "name"),
)
_FLAGS = (
    (_PLUGIN_MISSING, Signal.PLUGIN_MISSING),
    (_OFI_FAILED, Signal.OFI_FAILED),
    (_NO_NETWORK, Signal.NO_NETWORK),
    (_IB_NO_DEVICE, Signal.IB_NO_DEVICE),
    (_SOCKET_INIT, Signal.SOCKET_INIT),
    (_EFA_EMPTY, Signal.EFA_EMPTY),
    (_TOPO_FAILED, Signal.TOPO_FAILED),
    (_INIT_STARTED, Signal.INIT_STARTED),
    (_INIT_COMPLETE, Signal.INIT_COMPLETE),
)


def signals(message: str) -> Iterator[tuple[Signal, str]]:
    """What an NCCL message (the text after `NCCL INFO `) says about the network."""
    for pattern, signal, group in _NAMED:
        match = pattern.search(message)
        if match:
            yield signal, (match[group] or "external").strip()
    for pattern, signal in _FLAGS:
        match = pattern.search(message)
        if match:
            yield signal, match[0]


def _source_key(source: str) -> Key:
    """The identity of lines that only their input names ('<' never starts a host name)."""
    return (f"<{source}>", None)


class Analyzer:
    """Feed it lines (one or more inputs), then ask for the report."""

    def __init__(self) -> None:
        self._ranks: dict[Key, _RankState] = {}
        self._pending: dict[Key, _RankState] = {}
        """Ranks known only by a wrapper (Ray pid/ip, pod, MPI rank) or by their input's name."""
        self._aliases: dict[Key, set[Key]] = {}
        """Wrapper or input identity -> the NCCL identities (host:pid) seen under it."""
        self._order = 0
        self._dedup = False
        self.sources: list[str] = []

    def feed(self, lines: Iterable[str], source: str = "<input>") -> Analyzer:
        self.sources.append(source)
        for number, line in enumerate(lines, start=1):
            for parsed in parse_line(line):
                self._dedup = self._dedup or bool(_RAY_DEDUP.search(parsed.text))
                self._order += 1
                self._add(parsed, Evidence(source, number, _clip(parsed.text), self._order), source)
        return self

    def _add(self, parsed: _Parsed, evidence: Evidence, source: str) -> None:
        if parsed.nccl is not None:
            key, table = parsed.nccl, self._ranks
            pid = parsed.nccl[1]
            for alias in (parsed.wrapper, _source_key(source), None if pid is None else pid_key(pid)):
                if alias is not None:
                    self._aliases.setdefault(alias, set()).add(parsed.nccl)
        else:
            key, table = parsed.wrapper or _source_key(source), self._pending
        state = table.get(key)
        if state is None:
            host = key[0] if key[0][:1] != "<" else source
            state = table[key] = _RankState(host, key[1], evidence.order)
        if state.cuda_dev is None and parsed.dev is not None:
            state.cuda_dev = parsed.dev
        message = parsed.message
        version = _NCCL_VERSION.search(message)
        if version and state.nccl_version is None:
            state.nccl_version = version["version"]
        rank = _RANK.search(message)
        if rank:
            state.comms.setdefault(int(rank["nranks"]), set()).add(int(rank["rank"]))
            dev = _CUDA_DEV.search(message)
            if dev and state.cuda_dev is None:
                state.cuda_dev = int(dev["dev"])
        for signal, value in signals(message):
            if signal is Signal.OFI_VERSION and state.ofi_version is None:
                state.ofi_version = value
            state.note(signal, value, evidence)

    def report(self) -> FabricReport:
        """Lines known only by a wrapper or input join the one NCCL rank seen under it; else they stand alone."""
        ranks = {key: _copy(state) for key, state in self._ranks.items()}
        alone: list[_RankState] = []
        for key, state in self._pending.items():
            candidates = self._aliases.get(key, set())
            if len(candidates) == 1:
                ranks[next(iter(candidates))].merge(state)
            else:
                alone.append(_copy(state))
        states = [*ranks.values(), *alone]
        verdicts = sorted(
            (verdict for state in states for verdict in _judge_rows(state)),
            key=lambda r: (r.rank is None, r.rank or 0, r.host, -1 if r.pid is None else r.pid),
        )
        notes = []
        if self._dedup:
            notes.append(
                "Ray deduplicated NCCL lines ('[repeated Nx across cluster]'), so lines of some ranks are hidden; "
                "collect the logs with RAY_DEDUP_LOGS=0 to see every rank"
            )
        world = max((n for s in states for n in s.comms), default=0)
        seen = {r for s in states for r in s.comms.get(world, set())}
        if world and len(seen) < world:
            notes.append(
                f"the input shows {len(seen)} of the {world} ranks of the largest communicator; "
                "the verdict covers only the ranks shown"
            )
        return FabricReport(
            ranks=verdicts,
            notes=notes,
            sources=list(self.sources),
            world_size=world or None,
            ranks_seen=len(seen),
        )


def _judge_rows(state: _RankState) -> list[RankVerdict]:
    """One row per rank. Lines without a host:pid prefix that say they come from several ranks (`rank R nranks N`)
    cannot be told apart: a fallback among them stays one row (some rank fell back), anything else becomes one
    unknown row per rank, never one row that passes for all of them."""
    verdict = judge(state)
    world = max(state.comms, default=None)
    ranks = sorted(state.comms[world]) if world is not None else []
    if state.pid is not None or len(ranks) < 2:
        return [verdict]
    listed = ", ".join(str(r) for r in ranks)
    why = f"lines of ranks {listed} carry no host:pid prefix"
    if verdict.verdict in (Verdict.SOCKET, Verdict.DEGRADED):
        return [replace(verdict, reason=f"{why}; at least one of them: {verdict.reason}")]
    advice = (
        f"{why}, so which rank used which network cannot be told ({verdict.verdict.value} for their lines together); "
        "keep NCCL's host:pid:tid prefix in the log (a wrapper or log shipper stripped it), or collect one log per rank"
    )
    return [
        replace(verdict, rank=rank, verdict=Verdict.UNKNOWN, reason=advice, advice=advice, cuda_dev=None)
        for rank in ranks
    ]


def _copy(state: _RankState) -> _RankState:
    fresh = _RankState(state.host, state.pid, state.order)
    fresh.merge(state)
    return fresh


def _clip(text: str) -> str:
    return text if len(text) <= EVIDENCE_CHARS else text[: EVIDENCE_CHARS - 3] + "..."


# --- judging ----------------------------------------------------------------------------------


def _is_ofi(network: str) -> bool:
    return network.lower() in OFI_NETWORKS


def _is_socket(network: str) -> bool:
    return network.lower() == SOCKET_NETWORK


def _is_efa(provider: str) -> bool:
    return provider.lower() in EFA_PROVIDERS


def judge(state: _RankState) -> RankVerdict:
    """The verdict of one rank: the network NCCL used decides; the plugin's lines explain why."""
    used = state.of(*NETWORK_IN_USE) or state.of(Signal.INITIALIZED)
    networks = list(dict.fromkeys(value for _, value, _ in used))
    provider_lines = state.of(Signal.PROVIDER)
    providers = list(dict.fromkeys(value for _, value, _ in provider_lines))
    bad_providers = [p for p in providers if not _is_efa(p)]
    cause = _plugin_trouble(state)
    context = cause or _plugin_context(state)
    picked: list[Found] = []
    advice: str | None = None

    def how(accept: Callable[[str], bool]) -> str:
        lines = [found for found in used if accept(found[1])]
        picked.extend(lines[:2])
        return _describe(lines)

    socket = [n for n in networks if _is_socket(n)]
    other = [n for n in networks if not _is_socket(n) and not _is_ofi(n)]
    ofi = [n for n in networks if _is_ofi(n)]
    network: str | None = None
    if socket:
        verdict, network = Verdict.SOCKET, socket[0]
        reason = f"NCCL used its internal socket transport ({how(_is_socket)})" + (f"; {context}" if context else "")
        picked.extend(_trouble_lines(state))
    elif other:
        verdict, network = Verdict.DEGRADED, other[0]
        reason = f"NCCL used its own {network} transport, not aws-ofi-nccl ({how(lambda n: n in other)})"
        picked.extend(_trouble_lines(state))
    elif ofi:
        network = ofi[0]
        described = how(_is_ofi)
        picked.extend(provider_lines[:2])
        gdr = [found for found in state.of(Signal.GDR_CHANNEL) if _is_ofi(found[1])]
        if bad_providers:
            verdict = Verdict.DEGRADED
            reason = f"aws-ofi-nccl selected provider {bad_providers[0]!r}, not efa ({described})"
        elif providers:
            verdict = Verdict.EFA
            reason = f"{_provider_detail(state)}; {described}"
        elif gdr:
            # GPUDirect RDMA through aws-ofi-nccl: on AWS only libfabric's efa provider registers GPU memory
            # with the NIC, so GDRDMA channels are EFA even where no 'Selected provider' line survived.
            verdict = Verdict.EFA
            reason = f"{gdr[0][2].count} GPUDirect RDMA channel line(s) via NET/{gdr[0][1]}/N/GDRDMA; {described}"
            picked.extend(gdr[:1])
        else:
            verdict = Verdict.UNKNOWN
            reason = (
                f"NCCL used the aws-ofi-nccl network ({described}) but no 'NET/OFI Selected provider' line "
                f"says which libfabric provider; {DEBUG_HINT}"
            )
    elif state.of(Signal.IB_INIT):
        # NCCL's own IB transport (here often soft-RoCE, rxe0): on this platform anything but EFA through
        # aws-ofi-nccl is a fallback.
        ib = state.of(Signal.IB_INIT)
        verdict, network = Verdict.DEGRADED, "IB"
        reason = f"NCCL brought up its own IB transport on {ib[0][1]} (NET/IB : Using ...), not aws-ofi-nccl" + (
            f"; {context}" if context else ""
        )
        picked.extend(ib[:1])
        picked.extend(_trouble_lines(state))
    elif state.of(Signal.SOCKET_INIT) and (cause or state.of(Signal.IB_NO_DEVICE)):
        verdict, network = Verdict.SOCKET, "Socket"
        reason = "NCCL brought up only its socket transport (NET/Socket : Using ...)" + (
            f"; {context}" if context else ""
        )
        picked.extend(state.of(Signal.SOCKET_INIT)[:1])
        picked.extend(_trouble_lines(state))
    elif bad_providers:
        verdict = Verdict.DEGRADED
        reason = f"aws-ofi-nccl selected provider {bad_providers[0]!r}, not efa (no line says which network NCCL used)"
        picked.extend(provider_lines[:2])
    elif providers:
        verdict = Verdict.UNKNOWN
        reason = (
            f"aws-ofi-nccl selected provider {providers[0]!r} but no line says which network NCCL then used "
            f"('Using network ...', channels via NET/...); {DEBUG_HINT}"
        )
        picked.extend(provider_lines[:1])
    elif state.of(Signal.EFA_EMPTY):
        verdict = Verdict.DEGRADED
        reason = (
            "libfabric's efa provider found no device in this process (fi_getinfo: provider efa output empty list): "
            "it cannot use EFA, whatever NCCL did next"
        )
        picked.extend(_trouble_lines(state))
    elif cause:
        verdict = Verdict.UNKNOWN
        reason = f"{cause}; no line says which network NCCL used"
        if state.of(Signal.NO_NETWORK):
            reason += " (NCCL found no usable network and stopped, as NCCL_NET makes it do instead of falling back)"
        picked.extend(_trouble_lines(state))
        picked.extend(state.of(Signal.NO_NETWORK)[:1])
    else:
        verdict = Verdict.UNKNOWN
        loaded = state.of(Signal.PLUGIN_LOADED, Signal.OFI_VERSION)
        reason = "no network-selection lines" + (" (aws-ofi-nccl loaded, then nothing)" if loaded else "")
        advice = _unknown_advice(state)
        reason += f"; {advice or DEBUG_HINT}"
        picked.extend(loaded[:1])
        picked.extend(state.of(Signal.TOPO_FAILED)[:2])
    picked.extend(state.of(Signal.OFI_VERSION)[:1])
    evidence = sorted({tally.first[0] for _, _, tally in picked}, key=lambda e: e.order)
    world = max(state.comms, default=None)
    return RankVerdict(
        host=state.host,
        pid=state.pid,
        rank=None if world is None else min(state.comms[world]),
        nranks=world,
        cuda_dev=state.cuda_dev,
        verdict=verdict,
        reason=reason,
        evidence=tuple(evidence[:MAX_EVIDENCE]),
        network=network,
        provider=next(iter(bad_providers or providers), None),
        nccl_version=state.nccl_version,
        ofi_nccl_version=state.ofi_version,
        plugin_error=cause or None,
        advice=advice,
    )


TOPOLOGY_ADVICE = (
    "NCCL failed while detecting the node's topology (GPUs, PCI, NICs under /sys), before it chose a network: "
    "check what the pod sees (the NVIDIA device plugin's GPUs, /sys mounted, NCCL_TOPO_FILE if set), not the "
    "network settings"
)
TRUNCATED_ADVICE = (
    "NCCL_DEBUG=INFO is in effect (NCCL's initialization lines are there) but the log stops before NCCL chose a "
    "network and before 'Init COMPLETE': the capture is truncated (a log tail, a size or retention limit) or the "
    "process died during init; collect the whole log (kubectl logs --previous for a restarted container)"
)


def _unknown_advice(state: _RankState) -> str | None:
    """Advice more specific than DEBUG_HINT for a rank whose log says why there is no network line."""
    if state.of(Signal.TOPO_FAILED):
        return TOPOLOGY_ADVICE
    if state.of(Signal.INIT_STARTED) and not state.of(Signal.INIT_COMPLETE):
        return TRUNCATED_ADVICE
    return None


def _describe(lines: list[Found]) -> str:
    """'Using network X, 12 channel line(s) via NET/X' for the network lines that decided."""
    parts = []
    for signal, value, tally in lines:
        if signal is Signal.CHANNEL:
            parts.append(f"{tally.count} channel line(s) via NET/{value}")
        elif signal is Signal.USING_NETWORK:
            parts.append(f"Using network {value}")
        elif signal is Signal.ASSIGNED:
            parts.append(f"Assigned NET plugin {value}")
        else:
            parts.append(f"Initialized NET plugin {value}")
    return ", ".join(dict.fromkeys(parts))


def _provider_detail(state: _RankState) -> str:
    """'aws-ofi-nccl 1.16.0, provider efa (fabric efa-direct, 32 nics)'."""
    lines = state.of(Signal.PROVIDER)
    detail = f"provider {lines[0][1]}"
    match = _PROVIDER.search(lines[0][2].first[0].text)
    if match and (match["fabric"] or match["nics"]):
        extra = [
            f"fabric {match['fabric']}" if match["fabric"] else "",
            f"{match['nics']} nics" if match["nics"] else "",
        ]
        detail += f" ({', '.join(x for x in extra if x)})"
    return f"aws-ofi-nccl {state.ofi_version}, {detail}" if state.ofi_version else detail


def _plugin_trouble(state: _RankState) -> str:
    """Why the plugin was not used, from its own lines (empty when nothing says)."""
    empty = state.of(Signal.EFA_EMPTY)
    if empty:
        return f"libfabric found no EFA device: {_message(empty[0][2])}"
    failed = state.of(Signal.OFI_FAILED)
    if failed:
        return f"aws-ofi-nccl failed: {_message(failed[0][2])}"
    missing = state.of(Signal.PLUGIN_MISSING)
    if missing:
        return f"no net plugin loaded: {_message(missing[0][2])}"
    return ""


def _plugin_context(state: _RankState) -> str:
    """What the plugin's lines say when none of them is a failure (for the reason, not plugin_error)."""
    if state.of(Signal.PROVIDER):
        return ""
    if state.of(Signal.PLUGIN_LOADED, Signal.OFI_VERSION):
        return "aws-ofi-nccl loaded but no line says it selected a provider"
    return "no aws-ofi-nccl line" + (", and NET/IB found no device" if state.of(Signal.IB_NO_DEVICE) else "")


def _trouble_lines(state: _RankState) -> list[Found]:
    return [
        *state.of(Signal.EFA_EMPTY)[:1],
        *state.of(Signal.OFI_FAILED)[:2],
        *state.of(Signal.PLUGIN_MISSING)[:1],
        *state.of(Signal.IB_NO_DEVICE)[:1],
    ]


def _message(tally: _Tally) -> str:
    """The NCCL message of a tally's first line, without the host:pid:tid prefix."""
    text = tally.first[0].text
    split = split_nccl(text)
    return _RAY_DEDUP.sub("", split[1]).strip() if split else text


def analyze(lines: Iterable[str], source: str = "<input>") -> FabricReport:
    """The verdict of every rank whose NCCL lines are in `lines`."""
    return Analyzer().feed(lines, source).report()


# --- command line -----------------------------------------------------------------------------


def _decoded(stream: BinaryIO) -> Iterator[str]:
    for raw in stream:
        yield raw.decode("utf-8", errors="replace")


def analyze_paths(paths: Sequence[str], stdin: BinaryIO | None = None) -> FabricReport:
    """Analyze files together (`-` is stdin; no path at all means stdin); unreadable files become errors."""
    analyzer = Analyzer()
    errors: list[str] = []
    for path in paths or ["-"]:
        if path == "-":
            analyzer.feed(_decoded(stdin if stdin is not None else sys.stdin.buffer), "<stdin>")
            continue
        try:
            with open(path, "rb") as handle:
                analyzer.feed(_decoded(handle), path)
        except OSError as exc:
            errors.append(f"cannot read {path}: {exc.strerror or exc}")
    report = analyzer.report()
    report.errors.extend(errors)
    return report


def check(
    paths: Sequence[str],
    *,
    as_json: bool = False,
    stdin: BinaryIO | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> ExitStatus:
    """Analyze, print (a table for people, or JSON) and return the exit status; shared by both CLIs."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    report = analyze_paths(paths, stdin)
    if as_json:
        stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
    else:
        out, err = report.render()
        stdout.write(out)
        stderr.write(err)
    stdout.flush()
    return report.exit_status


EPILOG = (
    "exit codes: 0 every rank used EFA, 1 fallback detected (a rank on sockets or a non-efa provider), "
    "2 could not run (unreadable file, bad arguments), 3 no evidence (no rank, or no network-selection lines)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="*", metavar="FILE", help="NCCL_DEBUG=INFO logs; '-' or no FILE reads stdin")
    parser.add_argument("--json", action="store_true", help="print the report as JSON (for machines)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training.fabric_analyzer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG,
    )
    add_arguments(parser)
    args = parser.parse_args(argv)  # argparse exits 2 (ExitStatus.ERROR) on bad arguments
    return int(check(args.files, as_json=args.json))


if __name__ == "__main__":
    raise SystemExit(main())
