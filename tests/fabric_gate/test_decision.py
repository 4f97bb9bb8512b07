"""The gate's one decision (`decide`), the node search (pairs on 3+ nodes, per-node checks on 2), the exit codes."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from training.fabric_gate import (
    EXIT_FAILED,
    EXIT_RETRY,
    Bandwidth,
    Floor,
    GateVerdict,
    NodeHealth,
    Outcome,
    PairResult,
    RankTransport,
    bisect,
    conclude,
    decide,
    exit_code_for,
    injection,
    judge_two_nodes,
    next_pairs,
    read_efa,
    record_failure,
)

GIB = 1 << 30
P5 = Floor(350.2, 2 * GIB, "p5.48xlarge")


def ranks(verdicts: dict[str, list[str]]) -> list[RankTransport]:
    """node -> the verdict of each of its ranks, ranks numbered in order."""
    out, rank = [], 0
    for node, values in verdicts.items():
        for value in values:
            out.append(RankTransport(rank, f"{node}-host", node, value, f"{value} on {node}"))
            rank += 1
    return out


EFA2 = ranks({"node-a": ["efa"] * 8, "node-b": ["efa"] * 8})


def test_efa_above_the_floor_passes() -> None:
    verdict = decide(EFA2, expected_ranks=16, bandwidth=Bandwidth(2 * GIB, 437.79), floor=P5)
    assert verdict.outcome is Outcome.PASS
    assert "437.79 GB/s at 2 GiB meets the floor 350.2 GB/s (p5.48xlarge) from 2 GiB" in verdict.summary()


def test_efa_below_the_floor_fails_naming_the_size_and_the_floor() -> None:
    verdict = decide(EFA2, expected_ranks=16, bandwidth=Bandwidth(2 * GIB, 250.0), floor=P5)
    assert verdict.outcome is Outcome.FAIL
    assert verdict.bandwidth_failed
    assert "bus bandwidth 250.00 GB/s at 2 GiB is under the floor 350.2 GB/s (p5.48xlarge) from 2 GiB" in (
        verdict.summary()
    )


@pytest.mark.parametrize("fallback", ["socket", "degraded"])
def test_a_rank_on_socket_or_ib_fails_naming_the_ranks_and_hosts(fallback: str) -> None:
    transports = ranks({"node-a": ["efa"] * 8, "node-b": ["efa"] * 6 + [fallback, "efa"]})
    verdict = decide(transports, expected_ranks=16, bandwidth=Bandwidth(2 * GIB, 437.79), floor=P5)
    assert verdict.outcome is Outcome.FAIL
    assert f"1 of 16 rank(s) are not on EFA: rank 14 on node-b-host ({fallback})" in verdict.summary()
    assert [t.node for t in verdict.failing] == ["node-b"]


def test_too_few_ranks_is_unknown() -> None:
    verdict = decide(EFA2[:8], expected_ranks=16, bandwidth=Bandwidth(2 * GIB, 437.79), floor=P5)
    assert verdict.outcome is Outcome.UNKNOWN
    assert "too few ranks: 8 judged of the 16 expected" in verdict.summary()
    assert decide(EFA2, expected_ranks=None, expected_nodes=3, bandwidth=None, floor=P5).outcome is Outcome.UNKNOWN


def test_a_rank_without_evidence_is_unknown_and_a_sweep_short_of_the_floor_size_too() -> None:
    transports = ranks({"node-a": ["efa"] * 8, "node-b": ["efa"] * 7 + ["unknown"]})
    assert decide(transports, expected_ranks=16, bandwidth=None, floor=P5).outcome is Outcome.UNKNOWN
    short = decide(EFA2, expected_ranks=16, bandwidth=Bandwidth(GIB, 313.29), floor=P5)
    assert short.outcome is Outcome.UNKNOWN
    assert "below the size the floor" in short.summary()


def test_cost_and_its_share_of_the_run_are_reported() -> None:
    verdict = GateVerdict(Outcome.PASS, ("x",), seconds=18.0, run_seconds=86400.0)
    assert "cost 18.0 s (0.02% of the configured run of 86400 s)" in verdict.summary()
    assert verdict.to_json()["share_of_run"] == pytest.approx(18 / 86400)


# --- pairs -------------------------------------------------------------------------------------


class PairOracle:
    """A pair passes unless it holds a bad node; `flaky` scripts the first results of given pairs."""

    def __init__(self, bad: set[str], flaky: dict[frozenset[str], list[bool]] | None = None) -> None:
        self.bad = bad
        self.flaky = {k: list(v) for k, v in (flaky or {}).items()}
        self.calls: list[list[tuple[str, str]]] = []

    def __call__(self, pairs: list[tuple[str, str]]) -> list[PairResult]:
        self.calls.append(pairs)
        results = []
        for a, b in pairs:
            scripted = self.flaky.get(frozenset((a, b)))
            passed = scripted.pop(0) if scripted else not ({a, b} & self.bad)
            results.append(PairResult(a, b, passed))
        return results


NODES8 = [f"n{i}" for i in range(8)]


def test_one_bad_node_of_four() -> None:
    nodes = NODES8[:4]
    finding, results = bisect(nodes, PairOracle({"n3"}))
    assert finding.suspects == ("n3",)
    assert set(finding.cleared) == {"n0", "n1", "n2"}
    assert len(results) <= 4


def test_two_bad_nodes_of_eight() -> None:
    oracle = PairOracle({"n2", "n5"})
    finding, _ = bisect(NODES8, oracle)
    assert finding.suspects == ("n2", "n5")
    assert finding.undecided == ()
    assert len(oracle.calls) == 2
    # Each round is disjoint pairs: a node is in at most one pair per round.
    for pairs in oracle.calls:
        members = [n for pair in pairs for n in pair]
        assert len(members) == len(set(members))


def test_a_flaky_failure_of_a_good_node_does_not_make_it_suspect() -> None:
    # n0-n1 fails once although both are good; n3 is bad.
    finding, _ = bisect(NODES8[:4], PairOracle({"n3"}, {frozenset(("n0", "n1")): [False]}))
    assert finding.suspects == ("n3",)
    assert "n0" not in finding.suspects


def test_a_flaky_good_node_among_eight_with_a_bad_one() -> None:
    rng = random.Random(7)
    for _ in range(20):
        bad = {rng.choice(NODES8)}
        good_pair = frozenset(rng.sample([n for n in NODES8 if n not in bad], 2))
        finding, _ = bisect(NODES8, PairOracle(bad, {good_pair: [False]}))
        assert set(finding.suspects) == bad


def test_every_pair_failing_accuses_no_node() -> None:
    finding, results = bisect(NODES8[:4], PairOracle(set(NODES8)))
    assert finding.suspects == ()
    assert "every pair failed" in finding.reason
    assert results


def test_three_nodes() -> None:
    for bad in ("n0", "n1", "n2"):
        finding, _ = bisect(NODES8[:3], PairOracle({bad}))
        assert finding.suspects == (bad,), bad


def test_first_round_pairs_neighbours_and_later_rounds_prefer_cleared_partners() -> None:
    assert next_pairs(NODES8[:5], []) == [("n0", "n1"), ("n2", "n3")]
    after = [PairResult("n0", "n1", True), PairResult("n2", "n3", False)]
    pairs = next_pairs(NODES8[:5], after)
    assert ("n2", "n0") in pairs
    assert ("n3", "n1") in pairs
    assert conclude(NODES8[:5], after).suspects == ()


# --- two nodes ----------------------------------------------------------------------------------


def test_two_nodes_the_one_missing_efa_devices_is_suspect() -> None:
    a = NodeHealth("node-a", 32, 32, (), 350.0)
    b = NodeHealth("node-b", 28, 32, (), 350.0)
    suspects, reason = judge_two_nodes(a, b)
    assert suspects == ("node-b",)
    assert "28 of 32 EFA devices" in reason


def test_two_nodes_a_port_down_or_a_slow_node_is_suspect() -> None:
    down = NodeHealth("node-a", 32, 32, ("rdmap79s0/1 1: DOWN",), 350.0)
    assert judge_two_nodes(down, NodeHealth("node-b", 32, 32))[0] == ("node-a",)
    slow = NodeHealth("node-b", 32, 32, (), 90.0)
    assert judge_two_nodes(NodeHealth("node-a", 32, 32, (), 350.0), slow)[0] == ("node-b",)


def test_two_healthy_looking_nodes_cannot_tell() -> None:
    suspects, reason = judge_two_nodes(NodeHealth("a", 32, 32, (), 340.0), NodeHealth("b", 32, 32, (), 350.0))
    assert suspects == ()
    assert "cannot tell" in reason


def test_read_efa_from_sysfs(tmp_path: Path) -> None:
    for name, state in (("rdmap16s27", "4: ACTIVE"), ("rdmap32s27", "1: DOWN")):
        port = tmp_path / name / "ports" / "1"
        (port / "hw_counters").mkdir(parents=True)
        (port / "state").write_text(state + "\n")
        (port / "hw_counters" / "rx_drops").write_text("3\n")
    devices, down, counters = read_efa(tmp_path)
    assert devices == 2
    assert down == ("rdmap32s27/1 1: DOWN",)
    assert counters["rx_drops"] == 6
    assert read_efa(tmp_path / "absent") == (None, (), {})


# --- bounds -------------------------------------------------------------------------------------


def test_failures_are_counted_per_run_and_bounded(tmp_path: Path) -> None:
    failed = GateVerdict(Outcome.FAIL, ("x",), suspects=("node-b",))
    first = record_failure(tmp_path, "uid-1", failed)
    assert first == 1
    assert exit_code_for(failed, first, 2, taken=True) == EXIT_RETRY
    second = record_failure(tmp_path, "uid-1", failed)
    assert exit_code_for(failed, second, 2, taken=True) == EXIT_FAILED
    assert record_failure(tmp_path, "uid-2", failed) == 1
    # Uncountable failures have no bound: fail. UNKNOWN cannot be fixed elsewhere: fail.
    assert exit_code_for(failed, None, 2, taken=True) == EXIT_FAILED
    assert exit_code_for(GateVerdict(Outcome.UNKNOWN, ("x",)), 1, 5, taken=True) == EXIT_FAILED


def test_a_fail_that_took_no_node_out_fails_the_job_instead_of_coming_back_on_the_same_nodes() -> None:
    # Issue 34 #4: the 2-node "cannot tell" case, a refused verdict or no controller: a retry would re-run the gate
    # on the same nodes.
    failed = GateVerdict(Outcome.FAIL, ("x",), suspects=())
    assert exit_code_for(failed, 1, 2, taken=False) == EXIT_FAILED


def test_injection_is_honoured_only_in_a_cpu_rehearsal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PLATFORM_REHEARSAL", raising=False)
    with pytest.raises(ValueError, match="only in a CPU rehearsal"):
        injection({"FABRIC_GATE_INJECT": "fallback:node-b"})
    monkeypatch.setenv("PLATFORM_REHEARSAL", "cpu")
    found = injection({"FABRIC_GATE_INJECT": "slow:node-b"})
    assert found is not None
    assert (found.kind, found.node) == ("slow", "node-b")
    with pytest.raises(ValueError, match="fallback:NODE or slow:NODE"):
        injection({"FABRIC_GATE_INJECT": "melt:node-b"})
    assert injection({}) is None
