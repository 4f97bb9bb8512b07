"""Log shapes from published NCCL / libfabric logs that the analyzer once misjudged (issue 24), one test each.

The line formats are NCCL's and libfabric's own: `NET/IB : Using [0]rxe0:1/RoCE` (NCCL's IB transport over
soft-RoCE), libfabric's `libfabric:PID:TIME::PROV:SUBSYS:FUNC():LINE<warn> fi_getinfo: provider efa output empty
list`, CloudWatch's console copy that glues the timestamp column to the message (`...208-07:00ip-10-36-29-253...`),
channels `via NET/AWS Libfabric/0/GDRDMA`, NCCL's error traces (`graph/topo.cc:NNN -> 2`)."""

from __future__ import annotations

from training.fabric_analyzer import ExitStatus, Verdict, analyze

HOST = "ip-10-36-29-253"


def nccl(message: str, level: str = "INFO", pid: int = 3117, host: str = HOST, dev: int = 0) -> str:
    return f"{host}:{pid}:{pid + 68} [{dev}] NCCL {level} {message}"


GLUED = "2024-07-10T11:52:04.208-07:00"
EFA_EMPTY = "libfabric:3117:1720637524::core:core:fi_getinfo_():1391<warn> fi_getinfo: provider efa output empty list"


def test_nccl_ib_transport_over_roce_is_a_fallback() -> None:
    report = analyze(
        [
            nccl("NCCL version 2.21.5+cuda12.4"),
            nccl("NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin."),
            nccl("NET/IB : Using [0]rxe0:1/RoCE [RO]; OOB eth0:10.36.29.253<0>"),
        ]
    )
    (rank,) = report.ranks
    assert rank.verdict is Verdict.DEGRADED, rank.reason
    assert rank.network == "IB"
    assert "rxe0:1/RoCE" in rank.reason
    assert report.exit_status is ExitStatus.FALLBACK


def test_ib_init_does_not_override_the_network_nccl_used() -> None:
    report = analyze(
        [
            nccl("NET/IB : Using [0]rxe0:1/RoCE [RO]; OOB eth0:10.36.29.253<0>"),
            nccl("NET/OFI Selected provider is efa, fabric is efa (found 4 nics)"),
            nccl("Using network Libfabric"),
        ]
    )
    assert report.ranks[0].verdict is Verdict.EFA


def test_cloudwatch_glued_timestamp_makes_no_phantom_host() -> None:
    report = analyze(
        [
            GLUED + nccl("NET/OFI Selected provider is efa, fabric is efa (found 32 nics)"),
            GLUED + nccl("Using network Libfabric"),
        ]
    )
    assert [(r.host, r.pid) for r in report.ranks] == [(HOST, 3117)]
    assert report.ranks[0].verdict is Verdict.EFA


def test_libfabric_efa_empty_list_is_decisive_in_a_glued_cloudwatch_copy() -> None:
    report = analyze(
        [
            GLUED + nccl("NCCL version 2.21.5+cuda12.4"),
            GLUED + nccl("NET/Plugin: Loaded net plugin Libfabric (v8)"),
            GLUED + EFA_EMPTY,
            GLUED + nccl("NET/OFI aws-ofi-nccl initialization failed", "WARN"),
        ]
    )
    (rank,) = report.ranks
    assert (rank.host, rank.pid) == (HOST, 3117)
    assert rank.verdict is not Verdict.UNKNOWN, rank.reason
    assert report.exit_status is ExitStatus.FALLBACK
    assert rank.plugin_error is not None
    assert "provider efa output empty list" in rank.plugin_error


def test_libfabric_efa_empty_list_then_sockets_is_socket() -> None:
    report = analyze([GLUED + EFA_EMPTY, GLUED + nccl("NET/Socket : Using [0]eth0:10.36.29.253<0>")])
    (rank,) = report.ranks
    assert rank.verdict is Verdict.SOCKET
    assert any("empty list" in e.text for e in rank.evidence)


def test_unprefixed_lines_of_several_ranks_are_not_folded_into_one_passing_row() -> None:
    lines = []
    for rank in range(2):
        lines += [
            "NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 4 nics)",
            "NCCL INFO Using network Libfabric",
            f"NCCL INFO comm 0x55d7 rank {rank} nranks 2 cudaDev {rank} busId 101c0 - Init COMPLETE",
        ]
    report = analyze(lines, source="job.log")
    assert len(report.ranks) == 2, report.ranks
    assert report.verdict is not Verdict.EFA
    assert sorted(r.rank for r in report.ranks if r.rank is not None) == [0, 1]
    assert all("host:pid" in r.reason for r in report.ranks)


def test_gdrdma_channels_through_the_plugin_are_efa_evidence() -> None:
    report = analyze(
        [
            nccl("Channel 00/0 : 1[1] -> 0[0] [receive] via NET/AWS Libfabric/0/GDRDMA"),
            nccl("Channel 01/0 : 0[0] -> 1[1] [send] via NET/AWS Libfabric/0/GDRDMA"),
        ]
    )
    (rank,) = report.ranks
    assert rank.verdict is Verdict.EFA, rank.reason
    assert "GDRDMA" in rank.reason


def test_topology_failure_gets_its_own_advice() -> None:
    report = analyze(
        [
            nccl("NCCL version 2.21.5+cuda12.4"),
            nccl("Bootstrap : Using eth0:10.36.29.253<0>"),
            nccl(
                "graph/xml.cc:332 Could not find real path of /sys/class/pci_bus/0000:00/../../0000:00:1e.0",
                "WARN",
            ),
            nccl("graph/topo.cc:683 -> 2"),
            nccl("init.cc:1181 -> 2"),
        ]
    )
    (rank,) = report.ranks
    assert rank.verdict is Verdict.UNKNOWN
    assert "topology" in rank.reason
    assert "set NCCL_DEBUG=INFO" not in rank.reason
    assert "topology" in report.summary()
    assert "set NCCL_DEBUG=INFO" not in report.summary()


def test_truncated_info_log_gets_its_own_advice() -> None:
    report = analyze(
        [
            nccl("NCCL version 2.21.5+cuda12.4"),
            nccl("Bootstrap : Using eth0:10.36.29.253<0>"),
            nccl("NET/Plugin: Loaded net plugin Libfabric (v8)"),
        ]
    )
    (rank,) = report.ranks
    assert rank.verdict is Verdict.UNKNOWN
    assert "truncated" in rank.reason
    assert "set NCCL_DEBUG=INFO" not in rank.reason
    assert "truncated" in report.summary()
