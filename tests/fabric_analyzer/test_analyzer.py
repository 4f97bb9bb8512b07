"""training.fabric_analyzer line by line: each wording, each prefix style, rank identity, the report's shape."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

from training.fabric_analyzer import (
    EXIT_STATUS,
    Analyzer,
    ExitStatus,
    FabricReport,
    RankVerdict,
    Verdict,
    analyze,
)

HOST, PID = "ip-10-1-34-71", 4519


def nccl(message: str, host: str = HOST, pid: int = PID, dev: int = 0, level: str = "INFO") -> str:
    where = "nccl_net_ofi_create_plugin:380 " if level == "WARN" else ""
    return f"{host}:{pid}:{pid + 70} [{dev}] {where}NCCL {level} {message}"


def only(report: FabricReport) -> RankVerdict:
    assert len(report.ranks) == 1, report.ranks
    return report.ranks[0]


EFA_OLD = [
    "NET/OFI Using aws-ofi-nccl 1.7.4-aws",
    "NET/OFI Selected Provider is efa (found 4 nics)",
    "Using network AWS Libfabric",
    "Channel 00/0 : 3[1] -> 0[0] [receive] via NET/AWS Libfabric/0/GDRDMA",
    "comm 0x55d7869cef50 rank 0 nranks 4 cudaDev 0 nvmlDev 0 busId 101c0 commId 0x52e965372ad155ed - Init COMPLETE",
]


# --- wordings ---------------------------------------------------------------------------------

CASES: dict[str, tuple[list[str], Verdict, str | None, str | None]] = {
    # name: (messages, verdict, network, provider)
    "old provider wording, AWS Libfabric": (EFA_OLD, Verdict.EFA, "AWS Libfabric", "efa"),
    "bare old provider wording": (
        ["NET/OFI Selected Provider is efa", "Using network AWS Libfabric"],
        Verdict.EFA,
        "AWS Libfabric",
        "efa",
    ),
    "new provider wording, Libfabric": (
        [
            "NET/Plugin: Loaded net plugin Libfabric (v8)",
            "NET/OFI Initializing aws-ofi-nccl 1.13.2-aws",
            "NET/OFI Selected provider is efa, fabric is efa (found 4 nics)",
            "Using network Libfabric",
        ],
        Verdict.EFA,
        "Libfabric",
        "efa",
    ),
    "efa-direct fabric": (
        ["NET/OFI Selected provider is efa, fabric is efa-direct (found 32 nics)", "Using network Libfabric"],
        Verdict.EFA,
        "Libfabric",
        "efa",
    ),
    "network named OFI": (
        ["NET/OFI Selected Provider is efa (found 1 nics)", "Using network OFI"],
        Verdict.EFA,
        "OFI",
        "efa",
    ),
    "only channel lines say the network": (
        [
            "NET/OFI Selected provider is efa, fabric is efa (found 4 nics)",
            "Channel 00/0 : 0[0] -> 8[0] [send] via NET/AWS Libfabric/0/GDRDMA",
            "Channel 01/0 : 0[0] -> 8[0] [send] via NET/Libfabric/1/GDRDMA/Shared",
        ],
        Verdict.EFA,
        "AWS Libfabric",
        "efa",
    ),
    "Assigned/Initialized NET plugin Libfabric (2.27+)": (
        [
            "NET/OFI Selected provider is efa, fabric is efa (found 1 nics)",
            "Initialized NET plugin Libfabric",
            "Assigned NET plugin Libfabric to comm",
        ],
        Verdict.EFA,
        "Libfabric",
        "efa",
    ),
    "a failed RDMA probe before the provider is selected does not count": (
        [
            "NET/OFI OFI fi_getinfo() call failed: No data available",
            "NET/OFI Selected provider is efa, fabric is efa (found 4 nics)",
            "Using network Libfabric",
        ],
        Verdict.EFA,
        "Libfabric",
        "efa",
    ),
    "Using network Socket": (["Using network Socket"], Verdict.SOCKET, "Socket", None),
    "older channel formats": (
        [
            "NET/OFI Selected Provider is efa",
            "Channel 00 : 1[1] -> 2[0] [send] via NET/AWS Libfabric/0/GDRDMA",
            "Ring 01 : 7 -> 8 [send] via NET/AWS Libfabric/1/GDRDMA",
        ],
        Verdict.EFA,
        "AWS Libfabric",
        "efa",
    ),
    "old ring line via NET/Socket": (["Ring 00 : 7 -> 8 [send] via NET/Socket/0"], Verdict.SOCKET, "Socket", None),
    "channel via NET/Socket": (
        ["Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0"],
        Verdict.SOCKET,
        "Socket",
        None,
    ),
    "Initialized NET plugin Socket": (["Initialized NET plugin Socket"], Verdict.SOCKET, "Socket", None),
    "IB without a device, then the socket transport": (
        ["NET/IB : No device found.", "NET/Socket : Using [0]eth0:10.1.22.250<0>"],
        Verdict.SOCKET,
        "Socket",
        None,
    ),
    "plugin loaded and efa selected, but NCCL used sockets": (
        ["NET/OFI Selected provider is efa, fabric is efa (found 4 nics)", "Using network Socket"],
        Verdict.SOCKET,
        "Socket",
        "efa",
    ),
    "one communicator on the plugin, one on sockets": (
        [
            "NET/OFI Selected provider is efa, fabric is efa (found 4 nics)",
            "Using network Libfabric",
            "Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0",
        ],
        Verdict.SOCKET,
        "Socket",
        "efa",
    ),
    "NCCL's own IB transport": (
        ["NET/IB : Using [0]rdmap16s27:1/IB", "Using network IB"],
        Verdict.DEGRADED,
        "IB",
        None,
    ),
    "OFI network, no provider line": (["Using network AWS Libfabric"], Verdict.UNKNOWN, "AWS Libfabric", None),
    "efa provider, no network line": (
        ["NET/OFI Selected provider is efa, fabric is efa (found 4 nics)"],
        Verdict.UNKNOWN,
        None,
        "efa",
    ),
    "plugin loaded, nothing else": (
        ["NET/Plugin: Loaded net plugin AWS Libfabric (v6)", "NET/OFI Using aws-ofi-nccl 1.7.4-aws"],
        Verdict.UNKNOWN,
        None,
        None,
    ),
    "no network lines at all": (
        ["Bootstrap : Using eth0:10.1.34.71<0>", "cudaDriverVersion 12040", "NCCL version 2.23.4+cuda12.6"],
        Verdict.UNKNOWN,
        None,
        None,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_wording(case: str) -> None:
    messages, verdict, network, provider = CASES[case]
    rank = only(analyze([nccl(m) for m in messages]))
    assert (rank.verdict, rank.network, rank.provider) == (verdict, network, provider)
    assert (rank.host, rank.pid) == (HOST, PID)
    if verdict is Verdict.UNKNOWN:
        assert "NCCL_DEBUG" in rank.reason or "NCCL_DEBUG_SUBSYS" in rank.reason


@pytest.mark.parametrize(
    "provider", ["tcp", "sockets", "tcp;ofi_rxm", "shm", "udp;ofi_rxd", "verbs;ofi_rxm", "cxi", "EFA-but-not-quite"]
)
@pytest.mark.parametrize(
    "template",
    [
        "NET/OFI Selected Provider is {provider} (found 1 nics)",
        "NET/OFI Selected provider is {provider}, fabric is 10.1.0.0/16 (found 1 nics)",
        "NET/OFI Selected Provider is {provider}",
    ],
)
@pytest.mark.parametrize("network", ["AWS Libfabric", "Libfabric"])
def test_any_provider_but_efa_is_degraded(provider: str, template: str, network: str) -> None:
    rank = only(analyze([nccl(template.format(provider=provider)), nccl(f"Using network {network}")]))
    assert (rank.verdict, rank.provider, rank.network) == (Verdict.DEGRADED, provider, network)
    assert repr(provider) in rank.reason


def test_a_non_efa_provider_is_degraded_even_without_a_network_line() -> None:
    rank = only(analyze([nccl("NET/OFI Selected provider is tcp, fabric is 10.1.0.0/16 (found 1 nics)")]))
    assert rank.verdict is Verdict.DEGRADED


PLUGIN_MISSING = [
    "NET/Plugin : Plugin load returned 2 : libnccl-net.so: cannot open shared object file: No such file or directory.",
    "NET/Plugin : No plugin found (libnccl-net.so), using internal implementation",
    "NET/Plugin: No plugin found (libnccl-net.so)",
    "NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.",
    "NET/Plugin: Could not find: ofi libnccl-net-ofi.so. Using internal network plugin.",
    "NET/Plugin: Failed to open libnccl-net-ofi.so",
    "NET/Plugin: libfabric.so.1: cannot open shared object file: No such file or directory",
]
OFI_FAILED = [
    "NET/OFI aws-ofi-nccl initialization failed",
    "NET/OFI No eligible providers were found",
    "NET/OFI OFI fi_getinfo() call failed: No data available",
    "NET/OFI Unable to find a protocol that worked.  Failing initialization.",
    "NET/OFI Only EFA provider is supported",
]


@pytest.mark.parametrize("failure", PLUGIN_MISSING + OFI_FAILED)
@pytest.mark.parametrize("then", ["Using network Socket", "NET/Socket : Using [0]eth0:10.1.34.71<0>"])
def test_plugin_failure_then_sockets_is_socket_and_names_the_failure(failure: str, then: str) -> None:
    level = "WARN" if failure in OFI_FAILED[:1] else "INFO"
    rank = only(analyze([nccl(failure, level=level), nccl(then)]))
    assert rank.verdict is Verdict.SOCKET
    assert rank.plugin_error is not None
    assert failure in rank.plugin_error
    assert any(failure in e.text for e in rank.evidence)


@pytest.mark.parametrize("failure", PLUGIN_MISSING + OFI_FAILED)
def test_plugin_failure_alone_decides_nothing(failure: str) -> None:
    rank = only(analyze([nccl(failure)]))
    assert rank.verdict is Verdict.UNKNOWN
    assert rank.plugin_error is not None


def test_plugin_lines_that_are_not_failures() -> None:
    lines = [
        "NET/Plugin: Failed to find ncclNetPlugin_v8 symbol.",
        "NET/Plugin: Failed to find ncclCollNetPlugin_v8 symbol.",
        "NET/Plugin: Plugin name set by env to libnccl-net-ofi.so",
        "Failed to open libibverbs.so[.1]",
        "PROFILER/Plugin: Could not find: libnccl-profiler.so.",
        "ENV/Plugin: Could not find: libnccl-env.so",
        "Bootstrap : Using eth0:10.1.34.71<0>",
    ]
    rank = only(analyze([nccl(m) for m in lines]))
    assert (rank.verdict, rank.plugin_error) == (Verdict.UNKNOWN, None)


def test_nccl_net_forced_and_plugin_failed_is_unknown_with_the_cause() -> None:
    rank = only(
        analyze(
            [
                nccl("NET/OFI No eligible providers were found"),
                nccl("NET/OFI aws-ofi-nccl initialization failed", level="WARN"),
                nccl("Error: network AWS Libfabric not found.", level="WARN"),
            ]
        )
    )
    assert rank.verdict is Verdict.UNKNOWN
    assert "No eligible providers" in (rank.plugin_error or "")
    assert "stopped" in rank.reason


# --- prefixes ---------------------------------------------------------------------------------

RAY = "(RayTrainWorker pid=4519, ip=10.1.34.71) "
PREFIXES: dict[str, Callable[[str], str]] = {
    "plain": lambda line: line,
    "mpirun --tag-output": lambda line: f"[1,0]<stdout>:{line}",
    "mpirun --tag-output stderr": lambda line: f"[1,0]<stderr>:{line}",
    "Ray worker": lambda line: RAY + line,
    "Ray worker, colored": lambda line: f"\x1b[36m{RAY.rstrip()}\x1b[0m {line}",
    "kubectl --prefix": lambda line: f"[pod/ray-training-worker-p5-48xlarge-7kq2x/ray-worker] {line}",
    "kubectl --prefix --timestamps": lambda line: f"[pod/w-0/ray-worker] 2026-11-29T10:00:00.123456789Z {line}",
    "kubectl --timestamps": lambda line: f"2026-11-29T10:00:00.123456789Z {line}",
    "CloudWatch timestamp": lambda line: f"2026-11-29T10:00:00.123Z {line}",
    "ISO timestamp with offset and stream": lambda line: f"2026-11-29T10:00:00.123000+00:00 eks/ml/w-0 {line}",
    "tab-separated export": lambda line: f"2026-11-29 10:00:00.123\tpretrain/worker-0\t{line}",
    "NCCL's own [date]": lambda line: f"[2026-11-29 10:00:00] {line}",
    "torchrun --tee": lambda line: f"[default0]:{line}",
    "JSON log record": lambda line: json.dumps(
        {"log": line + "\n", "stream": "stdout", "kubernetes": {"pod_name": "w-0"}}
    ),
    "CRLF": lambda line: line + "\r\n",
    "Ray, deduplicated": lambda line: RAY + line + " [repeated 7x across cluster]",
}


@pytest.mark.parametrize("style", sorted(PREFIXES))
@pytest.mark.parametrize(
    ("messages", "verdict"),
    [
        (EFA_OLD, Verdict.EFA),
        (
            ["NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.", "Using network Socket"],
            Verdict.SOCKET,
        ),
        (["NET/OFI Selected Provider is tcp;ofi_rxm (found 1 nics)", "Using network AWS Libfabric"], Verdict.DEGRADED),
    ],
)
def test_prefix_style_keeps_identity_and_verdict(style: str, messages: list[str], verdict: Verdict) -> None:
    wrap = PREFIXES[style]
    rank = only(analyze([wrap(nccl(m, dev=1)) for m in messages]))
    assert (rank.host, rank.pid, rank.cuda_dev, rank.verdict) == (HOST, PID, 1, verdict)


def test_carriage_returns_of_progress_bars_do_not_hide_lines() -> None:
    line = "Epoch 1:  3%|▎         | 2/64 [00:04<02:13]\r" + nccl("Using network Socket") + "\n"
    assert only(analyze([line])).verdict is Verdict.SOCKET


@pytest.mark.timeout(30)
def test_long_lines_stay_linear() -> None:
    blob = "QUJD" * 500_000  # a 2 MB base64 line, as some loggers print tensors or configs
    lines = [blob, f"{blob} NCCL INFO {blob}", nccl("Using network Socket"), f"{'a' * 1_000_000}:1:2 NCCL INFO x"]
    started = time.monotonic()
    report = analyze(lines)
    assert time.monotonic() - started < 5
    assert any(r.verdict is Verdict.SOCKET and r.pid == PID for r in report.ranks)


def test_warn_lines_with_function_locations_count() -> None:
    line = (
        "[2026-01-02 10:24:27] ip-172-31-3-153:35115:35469 [2] int nccl_net_ofi_create_plugin"
        "(nccl_net_ofi_plugin_t**):353 NCCL WARN NET/OFI aws-ofi-nccl initialization failed"
    )
    rank = only(analyze([line, "ip-172-31-3-153:35115:35469 [2] NCCL INFO Using network Socket"]))
    assert (rank.host, rank.pid, rank.cuda_dev, rank.verdict) == ("ip-172-31-3-153", 35115, 2, Verdict.SOCKET)
    assert "initialization failed" in (rank.plugin_error or "")


# --- rank identity ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "rank", "nranks"),
    [
        ("comm 0x7f2c5c002f70 rank 5 nranks 16 cudaDev 5 busId 901c0 - Init COMPLETE", 5, 16),
        (
            "ncclCommInitRank comm 0x55d7869cef50 rank 5 nranks 16 cudaDev 5 nvmlDev 5 busId 901c0 "
            "commId 0x52e965372ad155ed - Init COMPLETE",
            5,
            16,
        ),
        ("comm 0x55d7869cef50 rank 5 nRanks 16 nNodes 2 localRanks 8 localRank 5 MNNVL 0", 5, 16),
        (
            "[Rank 1] ncclCommInitRank comm 0x5a08c708f110 rank 1 nranks 2 cudaDev 0 nvmlDev 0 busId 30000 "
            "- Init START",
            1,
            2,
        ),
        ("Init timings - ncclCommInitRank: rank 1 nranks 2 total 0.26 (kernels 0.18, alloc 0.06)", 1, 2),
    ],
)
def test_rank_lines(message: str, rank: int, nranks: int) -> None:
    found = only(analyze([nccl(message, dev=5)]))
    assert (found.rank, found.nranks) == (rank, nranks)


def test_rank_is_taken_from_the_largest_communicator() -> None:
    lines = [
        nccl("comm 0x1 rank 1 nRanks 8 nNodes 1 localRanks 8 localRank 1 MNNVL 0", dev=1),
        nccl("comm 0x2 rank 9 nRanks 16 nNodes 2 localRanks 8 localRank 1 MNNVL 0", dev=1),
        nccl("comm 0x3 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0", dev=1),
    ]
    found = only(analyze(lines))
    assert (found.rank, found.nranks, found.cuda_dev) == (9, 16, 1)


def test_two_ranks_on_one_host_interleaved_line_by_line() -> None:
    one = [nccl(m, pid=4519, dev=0) for m in EFA_OLD]
    two = [
        nccl(m, pid=4520, dev=1)
        for m in [
            "NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.",
            "Using network Socket",
            "Channel 00/0 : 1[1] -> 2[0] [send] via NET/Socket/0",
            "comm 0x55 rank 1 nranks 4 cudaDev 1 nvmlDev 1 busId 101d0 commId 0x52 - Init COMPLETE",
            "Connected all rings",
        ]
    ]
    lines = [line for pair in zip(one, two, strict=True) for line in pair]
    report = analyze(lines)
    assert [(r.host, r.pid, r.rank, r.cuda_dev, r.verdict) for r in report.ranks] == [
        (HOST, 4519, 0, 0, Verdict.EFA),
        (HOST, 4520, 1, 1, Verdict.SOCKET),
    ]
    assert report.verdict is Verdict.SOCKET
    for rank in report.ranks:
        assert all(f":{rank.pid}:" in e.text for e in rank.evidence)


def test_same_pid_on_two_hosts_are_two_ranks() -> None:
    lines = [nccl("Using network Socket", host="worker-0", pid=1), nccl("Using network Socket", host="worker-1", pid=1)]
    assert [(r.host, r.pid) for r in analyze(lines).ranks] == [("worker-0", 1), ("worker-1", 1)]


def test_lines_without_nccl_prefix_fall_back_to_the_ray_prefix() -> None:
    report = analyze(
        [
            "(RayTrainWorker pid=2451, ip=10.1.18.44) NCCL INFO NET/OFI Selected provider is efa, fabric is efa "
            "(found 1 nics)",
            "(RayTrainWorker pid=2451, ip=10.1.18.44) NCCL INFO Using network Libfabric",
            "(RayTrainWorker pid=2452, ip=10.1.18.44) NCCL INFO Using network Socket",
        ]
    )
    assert [(r.host, r.pid, r.verdict) for r in report.ranks] == [
        ("10.1.18.44", 2451, Verdict.EFA),
        ("10.1.18.44", 2452, Verdict.SOCKET),
    ]


def test_bare_lines_join_the_nccl_rank_seen_under_the_same_prefix() -> None:
    report = analyze(
        [
            f"{RAY}{nccl('NET/OFI Selected provider is efa, fabric is efa (found 4 nics)')}",
            f"{RAY}NCCL INFO Using network Libfabric",
        ]
    )
    rank = only(report)
    assert (rank.host, rank.pid, rank.verdict) == (HOST, PID, Verdict.EFA)


def test_bare_lines_under_a_pod_with_several_ranks_stand_alone() -> None:
    pod = "[pod/w-0/trainer] "
    report = analyze(
        [
            pod + nccl("Using network Libfabric", pid=10),
            pod + nccl("Using network Libfabric", pid=11),
            pod + "NCCL INFO Using network Socket",
        ]
    )
    by_name = {r.name: r.verdict for r in report.ranks}
    assert by_name["w-0"] is Verdict.SOCKET
    assert len(report.ranks) == 3


def test_bare_lines_under_mpirun_and_without_any_prefix() -> None:
    mpi = only(analyze(["[1,3]<stdout>:NCCL INFO Using network Socket"]))
    assert (mpi.host, mpi.pid) == ("mpi-rank-3", None)
    bare = only(analyze(["NCCL INFO Using network Socket"], source="node-4.log"))
    assert (bare.host, bare.pid, bare.verdict) == ("node-4.log", None, Verdict.SOCKET)


def test_bare_lines_of_one_input_join_its_only_rank() -> None:
    analyzer = Analyzer()
    analyzer.feed([nccl("NET/OFI Selected Provider is efa (found 4 nics)")], "node-0.log")
    analyzer.feed(["NCCL INFO Using network AWS Libfabric"], "node-0.log")
    assert only(analyzer.report()).verdict is Verdict.EFA


def test_noise_is_ignored() -> None:
    lines = [
        "INFO:train:step 1/200 loss 2.4817 tokens/s 18231",
        "#  Rank  0 Group  0 Pid  11749 on ip-172-31-47-132 device  0 [0x10] NVIDIA A100-SXM4-40GB",
        "NCCL version 2.21.5+cuda12.4",
        "",
        "libfabric:1234:1700000000::efa:core:efa_device_init():123<warn> No EFA devices found",
    ]
    assert analyze(lines).ranks == []


# --- the report -------------------------------------------------------------------------------


def test_exit_status_mapping_is_one_table() -> None:
    assert {v: int(s) for v, s in EXIT_STATUS.items()} == {
        Verdict.EFA: 0,
        Verdict.SOCKET: 1,
        Verdict.DEGRADED: 1,
        Verdict.UNKNOWN: 3,
    }
    assert int(ExitStatus.ERROR) == 2


def test_overall_verdict() -> None:
    efa = [nccl(m, pid=1) for m in EFA_OLD]
    socket = [nccl("Using network Socket", pid=2)]
    degraded = [nccl("NET/OFI Selected Provider is tcp (found 1 nics)", pid=3), nccl("Using network Libfabric", pid=3)]
    silent = [nccl("cudaDriverVersion 12040", pid=4)]
    assert analyze([]).verdict is Verdict.UNKNOWN
    assert analyze([]).exit_status is ExitStatus.NO_EVIDENCE
    every_rank = [
        nccl(m.replace("rank 0 nranks 4", f"rank {r} nranks 4"), pid=10 + r) for r in range(4) for m in EFA_OLD
    ]
    assert analyze(every_rank).exit_status is ExitStatus.EFA
    assert analyze(efa).exit_status is ExitStatus.NO_EVIDENCE  # 1 of the 4 ranks NCCL reported
    assert analyze(every_rank + silent).exit_status is ExitStatus.NO_EVIDENCE
    assert analyze(efa + degraded).verdict is Verdict.DEGRADED
    assert analyze(efa + degraded + silent).exit_status is ExitStatus.FALLBACK
    assert analyze(efa + degraded + socket).verdict is Verdict.SOCKET
    assert analyze(efa + socket).exit_status is ExitStatus.FALLBACK


def test_an_unreadable_input_makes_it_an_error() -> None:
    report = analyze([nccl(m) for m in EFA_OLD])
    report.errors.append("cannot read missing.log: No such file or directory")
    assert report.exit_status is ExitStatus.ERROR
    assert report.to_json()["exit_code"] == 2


def test_json_shape() -> None:
    lines = [nccl(m, pid=1) for m in EFA_OLD] + [nccl("Using network Socket", pid=2)]
    document = json.loads(json.dumps(analyze(lines, source="job.log").to_json()))
    assert set(document) == {
        "verdict",
        "exit_code",
        "summary",
        "counts",
        "world_size",
        "ranks_seen",
        "ranks",
        "notes",
        "errors",
        "sources",
    }
    assert (document["verdict"], document["exit_code"]) == ("socket", 1)
    assert document["counts"] == {"efa": 1, "degraded": 0, "socket": 1, "unknown": 0}
    assert document["sources"] == ["job.log"]
    assert document["errors"] == []
    assert [("1 of the 4 ranks" in note) for note in document["notes"]] == [True]
    first, second = document["ranks"]
    assert set(first) == {
        "host",
        "pid",
        "rank",
        "nranks",
        "cuda_dev",
        "verdict",
        "reason",
        "network",
        "provider",
        "nccl_version",
        "ofi_nccl_version",
        "plugin_error",
        "evidence",
    }
    assert (first["host"], first["pid"], first["rank"], first["nranks"], first["verdict"]) == (HOST, 1, 0, 4, "efa")
    assert (first["network"], first["provider"], first["ofi_nccl_version"]) == ("AWS Libfabric", "efa", "1.7.4-aws")
    assert (second["pid"], second["rank"], second["verdict"], second["network"]) == (2, None, "socket", "Socket")
    for evidence in first["evidence"]:
        assert set(evidence) == {"source", "line", "text"}
        assert evidence["source"] == "job.log"
        assert evidence["text"] == lines[evidence["line"] - 1]


def test_table_for_people() -> None:
    lines = [nccl(m, pid=1) for m in EFA_OLD] + [nccl("Using network Socket", pid=2)]
    out, err = analyze(lines, source="job.log").render()
    assert err == ""
    header, efa, socket = out.splitlines()[:3]
    assert header.split() == ["HOST", "PID", "RANK", "DEV", "VERDICT", "REASON"]
    assert efa.split()[:5] == [HOST, "1", "0/4", "0", "efa"]
    assert socket.split()[:5] == [HOST, "2", "-", "0", "socket"]
    assert f"  {HOST}:2 (socket):" in out
    assert f"    job.log:{len(lines)}: {lines[-1]}" in out
    assert out.rstrip().splitlines()[-1].startswith("FAIL: 1 of 2 rank(s) fell back from EFA (1 socket)")


def test_unknown_summary_tells_how_to_get_evidence() -> None:
    assert "NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=INIT,NET" in analyze([]).summary()
    assert "NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=INIT,NET" in analyze([nccl("cudaDriverVersion 1")]).summary()


def test_missing_ranks_are_noted() -> None:
    lines = [nccl(m) for m in EFA_OLD]
    (note,) = analyze(lines).notes
    assert "1 of the 4 ranks" in note


def test_fewer_ranks_than_nccl_reported_is_no_evidence_never_pass() -> None:
    """One rank on EFA out of the 4 its communicator has: the other 3 are unjudged, so the job is not shown to be
    on EFA (Ray's log deduplication hides ranks exactly like this)."""
    report = analyze([nccl(m) for m in EFA_OLD])
    assert [r.verdict for r in report.ranks] == [Verdict.EFA]
    assert report.verdict is Verdict.UNKNOWN
    assert report.exit_status is ExitStatus.NO_EVIDENCE
    assert report.summary().startswith("UNKNOWN: the input shows 1 of the 4 ranks NCCL reported")
    assert "RAY_DEDUP_LOGS=0" in report.summary()
    assert (report.to_json()["world_size"], report.to_json()["ranks_seen"]) == (4, 1)


def test_all_ranks_of_the_communicator_seen_is_a_pass() -> None:
    lines = [nccl(m.replace("rank 0 nranks 4", f"rank {r} nranks 4"), pid=10 + r) for r in range(4) for m in EFA_OLD]
    report = analyze(lines)
    assert report.exit_status is ExitStatus.EFA
    assert (report.to_json()["world_size"], report.to_json()["ranks_seen"]) == (4, 4)


def test_a_fallback_outranks_missing_ranks() -> None:
    lines = [nccl(m, pid=1) for m in EFA_OLD] + [nccl("Using network Socket", pid=2)]
    assert analyze(lines).exit_status is ExitStatus.FALLBACK
