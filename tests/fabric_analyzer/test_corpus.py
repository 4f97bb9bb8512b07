"""Every rank of every corpus file gets the verdict written here by hand; the corpus keeps covering every wording."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from training.fabric_analyzer import ExitStatus, FabricReport, RankVerdict, Verdict, analyze_paths

CORPUS = Path(__file__).resolve().parent / "corpus"

EFA, SOCKET, DEGRADED, UNKNOWN = Verdict.EFA, Verdict.SOCKET, Verdict.DEGRADED, Verdict.UNKNOWN


@dataclass(frozen=True)
class Expected:
    verdict: Verdict
    exit_status: ExitStatus
    ranks: dict[tuple[str, int], tuple[int | None, Verdict]]
    """(host, pid) -> (NCCL rank, verdict)."""
    network: str | None = None
    """The network every rank used (None: not checked)."""
    provider: str | None = None
    notes: tuple[str, ...] = ()
    """Words each note must contain, one note per entry."""


def four(
    host_a: str, pids_a: tuple[int, int], host_b: str, pids_b: tuple[int, int], verdict: Verdict
) -> dict[tuple[str, int], tuple[int | None, Verdict]]:
    """Two hosts, two ranks each (ranks 0-1 on host_a, 2-3 on host_b), all with one verdict."""
    return {
        (host_a, pids_a[0]): (0, verdict),
        (host_a, pids_a[1]): (1, verdict),
        (host_b, pids_b[0]): (2, verdict),
        (host_b, pids_b[1]): (3, verdict),
    }


P5 = "ray-training-worker-p5-48xlarge-"
G6 = "ray-training-worker-g6-12xlarge-"
P4D = "ray-training-worker-p4d-24xlarge-"

EXPECTED: dict[str, Expected] = {
    "efa_ofi1.7_old_wording_plain.log": Expected(
        EFA,
        ExitStatus.EFA,
        four("ip-10-1-34-71", (4519, 4520), "ip-10-1-47-202", (3877, 3878), EFA),
        network="AWS Libfabric",
        provider="efa",
    ),
    "efa_ofi1.9_mpirun_tag_output.log": Expected(
        EFA,
        ExitStatus.EFA,
        four("ip-172-31-47-132", (11749, 11750), "ip-172-31-38-17", (10412, 10413), EFA),
        network="AWS Libfabric",
        provider="efa",
    ),
    "efa_ofi1.13_new_wording_kubectl_prefix.log": Expected(
        EFA, ExitStatus.EFA, four(P5 + "7kq2x", (211, 212), P5 + "xm4fd", (209, 210), EFA), "Libfabric", "efa"
    ),
    "efa_ofi1.15_efa_direct_cloudwatch_timestamps.log": Expected(
        EFA, ExitStatus.EFA, four(P5 + "2hvkm", (187, 188), P5 + "lw8tz", (190, 191), EFA), "Libfabric", "efa"
    ),
    "efa_ofi1.16_nccl2.27_ray_prefix.log": Expected(
        EFA, ExitStatus.EFA, four(G6 + "b8n2c", (2451, 2452), G6 + "q7d9f", (2388, 2389), EFA), "Libfabric", "efa"
    ),
    "efa_same_host_two_pids_interleaved_torchrun_tee.log": Expected(
        EFA,
        ExitStatus.EFA,
        four("ip-10-1-19-33", (18804, 18805), "ip-10-1-19-201", (18690, 18691), EFA),
        "Libfabric",
        "efa",
    ),
    # Every rank shown used EFA, but Ray's deduplication hid 2 of the 4 ranks NCCL reported: no evidence for
    # those two, so never a PASS.
    "efa_ray_dedup_hides_ranks.log": Expected(
        UNKNOWN,
        ExitStatus.NO_EVIDENCE,
        {(G6 + "b8n2c", 3120): (0, EFA), (G6 + "q7d9f", 3007): (2, EFA)},
        "Libfabric",
        "efa",
        notes=("RAY_DEDUP_LOGS=0", "2 of the 4 ranks"),
    ),
    "socket_no_plugin_nccl2.21_plain.log": Expected(
        SOCKET, ExitStatus.FALLBACK, four("fsdp-worker-0", (73, 74), "fsdp-worker-1", (73, 74), SOCKET), "Socket"
    ),
    "socket_could_not_find_ib_no_device_kubectl_timestamps.log": Expected(
        SOCKET,
        ExitStatus.FALLBACK,
        four("llm-pretrain-worker-0", (48, 49), "llm-pretrain-worker-1", (51, 52), SOCKET),
        "Socket",
    ),
    "socket_inferred_ib_no_device_then_killed.log": Expected(
        SOCKET,
        ExitStatus.FALLBACK,
        {("ip-10-1-22-250", 30117): (None, SOCKET), ("ip-10-1-22-250", 30118): (None, SOCKET)},
        "Socket",
    ),
    "socket_ofi_no_eligible_providers_nccl2.27.log": Expected(
        SOCKET,
        ExitStatus.FALLBACK,
        {(P5 + "9rj4w", 322): (0, SOCKET), (P5 + "fh2zp", 318): (1, SOCKET)},
        "Socket",
    ),
    "socket_fi_getinfo_failed_ofi1.7_tab_export.log": Expected(
        SOCKET,
        ExitStatus.FALLBACK,
        {("ip-10-1-12-88", 9115): (0, SOCKET), ("ip-10-1-14-150", 8790): (1, SOCKET)},
        "Socket",
    ),
    "socket_failed_to_open_plugin_fluentbit_json.log": Expected(
        SOCKET,
        ExitStatus.FALLBACK,
        {("bert-ft-worker-0", 57): (0, SOCKET), ("bert-ft-worker-1", 60): (1, SOCKET)},
        "Socket",
    ),
    "degraded_tcp_ofi_rxm_ofi1.4.log": Expected(
        DEGRADED,
        ExitStatus.FALLBACK,
        {("ip-10-1-21-7", 6021): (0, DEGRADED), ("ip-10-1-25-143", 5870): (1, DEGRADED)},
        "AWS Libfabric",
        "tcp;ofi_rxm",
    ),
    "degraded_tcp_provider_ofi1.14_aws_logs_tail.log": Expected(
        DEGRADED,
        ExitStatus.FALLBACK,
        four(P4D + "k2m9s", (244, 245), P4D + "t5v7b", (239, 240), DEGRADED),
        "Libfabric",
        "tcp",
    ),
    "mixed_one_of_four_ranks_socket.log": Expected(
        SOCKET,
        ExitStatus.FALLBACK,
        {
            ("ip-10-1-40-12", 5311): (0, EFA),
            ("ip-10-1-40-77", 5298): (1, EFA),
            ("ip-10-1-41-5", 5302): (2, EFA),
            ("ip-10-1-43-190", 5307): (3, SOCKET),
        },
    ),
    "unknown_coll_subsys_only.log": Expected(
        UNKNOWN,
        ExitStatus.NO_EVIDENCE,
        {
            ("ip-10-1-30-4", 7702): (None, UNKNOWN),
            ("ip-10-1-30-4", 7703): (None, UNKNOWN),
            ("ip-10-1-31-250", 7688): (None, UNKNOWN),
            ("ip-10-1-31-250", 7689): (None, UNKNOWN),
        },
    ),
    "unknown_no_nccl_lines.log": Expected(UNKNOWN, ExitStatus.NO_EVIDENCE, {}),
    "unknown_nccl_net_forced_ofi_failed.log": Expected(
        UNKNOWN, ExitStatus.NO_EVIDENCE, {(P5 + "c4xq8", 415): (None, UNKNOWN)}
    ),
}


def report_of(name: str) -> FabricReport:
    return analyze_paths([str(CORPUS / name)])


def by_identity(report: FabricReport) -> dict[tuple[str, int | None], RankVerdict]:
    identities = {(r.host, r.pid): r for r in report.ranks}
    assert len(identities) == len(report.ranks), "two ranks share one host:pid"
    return identities


def test_every_corpus_file_has_expectations() -> None:
    assert sorted(p.name for p in CORPUS.glob("*.log")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_verdicts(name: str) -> None:
    expected = EXPECTED[name]
    report = report_of(name)
    ranks = by_identity(report)
    assert {key: (r.rank, r.verdict) for key, r in ranks.items()} == expected.ranks
    assert report.verdict is expected.verdict
    assert report.exit_status is expected.exit_status
    assert report.errors == []
    if expected.network is not None:
        assert {r.network for r in report.ranks} == {expected.network}
    if expected.provider is not None:
        assert {r.provider for r in report.ranks} == {expected.provider}
    assert len(report.notes) == len(expected.notes)
    for words, note in zip(expected.notes, report.notes, strict=True):
        assert words in note


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_evidence_of_a_rank_is_its_own(name: str) -> None:
    """Interleaved lines of several ranks never leak into another rank's evidence."""
    for rank in report_of(name).ranks:
        assert rank.evidence or rank.verdict is UNKNOWN
        for evidence in rank.evidence:
            assert f"{rank.host}:{rank.pid}:" in evidence.text
            assert evidence.source.endswith(name)
            line = (CORPUS / name).read_text(encoding="utf-8").splitlines()[evidence.line - 1]
            assert evidence.text in line or line.strip() in evidence.text or evidence.text.endswith("...")


def test_mixed_job_names_the_one_rank_that_fell_back() -> None:
    report = report_of("mixed_one_of_four_ranks_socket.log")
    bad = [r for r in report.ranks if r.verdict is not EFA]
    assert [(r.host, r.pid, r.rank, r.verdict) for r in bad] == [("ip-10-1-43-190", 5307, 3, SOCKET)]
    assert bad[0].plugin_error is not None
    assert "No eligible providers" in bad[0].plugin_error
    assert report.summary().startswith("FAIL: 1 of 4 rank(s)")


def test_same_host_two_pids_are_two_ranks_with_their_devices() -> None:
    ranks = by_identity(report_of("efa_same_host_two_pids_interleaved_torchrun_tee.log"))
    first, second = ranks[("ip-10-1-19-33", 18804)], ranks[("ip-10-1-19-33", 18805)]
    assert (first.rank, first.cuda_dev, first.nranks) == (0, 0, 4)
    assert (second.rank, second.cuda_dev, second.nranks) == (1, 1, 4)


def test_socket_reasons_say_why_the_plugin_was_not_used() -> None:
    causes = {
        "socket_no_plugin_nccl2.21_plain.log": "No plugin found (libnccl-net.so)",
        "socket_could_not_find_ib_no_device_kubectl_timestamps.log": "Could not find: libnccl-net.so",
        "socket_ofi_no_eligible_providers_nccl2.27.log": "No eligible providers were found",
        "socket_fi_getinfo_failed_ofi1.7_tab_export.log": "fi_getinfo() call failed: No data available",
        "socket_failed_to_open_plugin_fluentbit_json.log": "Failed to open libnccl-net-ofi.so",
        "socket_inferred_ib_no_device_then_killed.log": "Could not find: libnccl-net.so",
    }
    for name, cause in causes.items():
        for rank in report_of(name).ranks:
            assert rank.plugin_error is not None, name
            assert cause in rank.plugin_error, name
            assert cause in rank.reason, name


def test_versions_are_read_from_the_banners() -> None:
    rank = report_of("efa_ofi1.16_nccl2.27_ray_prefix.log").ranks[0]
    assert (rank.nccl_version, rank.ofi_nccl_version) == ("2.27.3+cuda12.9", "1.16.0")
    rank = report_of("efa_ofi1.7_old_wording_plain.log").ranks[0]
    assert (rank.nccl_version, rank.ofi_nccl_version) == ("2.20.5+cuda12.4", "1.7.4-aws")


def test_forced_network_failure_is_not_called_efa_and_says_why() -> None:
    report = report_of("unknown_nccl_net_forced_ofi_failed.log")
    (rank,) = report.ranks
    assert rank.plugin_error is not None
    assert "No eligible providers" in rank.plugin_error
    assert "stopped" in rank.reason
    assert "EFA is not usable" in report.summary()


# --- the corpus keeps covering every wording and every prefix style ------------------------------

WORDINGS = [
    "NET/OFI Selected Provider is efa (found 4 nics)",
    "NET/OFI Selected provider is efa, fabric is efa (found",
    "fabric is efa-direct (found 32 nics)",
    "NET/OFI Using aws-ofi-nccl 1.",
    "NET/OFI Initializing aws-ofi-nccl 1.",
    "Using network AWS Libfabric",
    "Using network Libfabric",
    "Using network Socket",
    "NET/Plugin: Loaded net plugin AWS Libfabric (v6)",
    "NET/Plugin: Loaded net plugin Libfabric (v",
    "Plugin load returned 2 :",
    "NET/Plugin: Could not find: libnccl-net.so",
    "Failed to open libnccl-net-ofi.so",
    "Initialized NET plugin Socket",
    "Initialized NET plugin Libfabric",
    "Assigned NET plugin Socket to comm",
    "NET/OFI aws-ofi-nccl initialization failed",
    "NET/OFI No eligible providers were found",
    "NET/OFI OFI fi_getinfo() call failed: No data available",
    "NET/IB : No device found.",
    "NET/Socket : Using [0]eth0:",
    "[send] via NET/AWS Libfabric/0/GDRDMA",
    "[send] via NET/Libfabric/0/GDRDMA",
    "[send] via NET/Libfabric/0",
    "[send] via NET/Socket/0",
    "Selected Provider is tcp;ofi_rxm",
    "Selected provider is tcp, fabric is",
    " - Init COMPLETE",
    "nRanks 4 nNodes 2",
    "NCCL version 2.2",
    "NCCL WARN NET/OFI",
]

PREFIXES = {
    "plain": r"^[a-z0-9-]+:\d+:\d+ \[\d\] NCCL INFO ",
    "mpirun --tag-output": r"^\[1,\d\]<stdout>:[a-z0-9-]+:\d+:\d+ \[\d\] NCCL INFO ",
    "Ray worker": r"^\(RayTrainWorker pid=\d+, ip=[\d.]+\) [a-z0-9-]+:\d+:\d+ \[\d\] NCCL INFO ",
    "kubectl --prefix": r"^\[pod/[a-z0-9-]+/ray-worker\] [a-z0-9-]+:\d+:\d+ \[\d\] NCCL INFO ",
    "kubectl --timestamps (RFC 3339)": r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z [a-z0-9-]+:\d+:\d+ \[\d\] NCCL INFO ",
    "CloudWatch-style timestamp": r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z [a-z0-9-]+:\d+:\d+ \[\d\] NCCL INFO ",
    "tab-separated export": r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\t\S+\t[a-z0-9-]+:\d+:\d+ \[\d\] NCCL INFO ",
    "ISO timestamp with offset": r"^\d{4}-\d\d-\d\dT[\d:.]+\+00:00 \S+ [a-z0-9-]+:\d+:\d+ \[\d\] NCCL INFO ",
    "NCCL's own [date] on WARN": r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] [a-z0-9-]+:\d+:\d+ \[\d\] .+ NCCL WARN ",
    "JSON log record": r'^\{"time":.*"log":"[a-z0-9-]+:\d+:\d+ \[\d\] NCCL INFO ',
    "torchrun --tee": r"^\[default\d\]:[a-z0-9-]+:\d+:\d+ \[\d\] NCCL INFO ",
}


def corpus_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(CORPUS.glob("*.log")))


@pytest.mark.parametrize("wording", WORDINGS)
def test_corpus_covers_wording(wording: str) -> None:
    assert wording in corpus_text()


@pytest.mark.parametrize("style", sorted(PREFIXES))
def test_corpus_covers_prefix(style: str) -> None:
    import re

    assert re.search(PREFIXES[style], corpus_text(), re.MULTILINE), style
