"""The fabric gate's collective part: the sweep, the pair tests and the per-node checks over the job's own process
group, and what every rank does with the verdict. training/fabric_gate.py holds the decisions (pure functions, the
judge mode) and calls `run`; this module needs torch.distributed with the default process group up.

Every rank takes part in every collective in the same order (new_group included), and every decision is taken on
values every rank holds (all-reduced or gathered), so all ranks reach the same verdict and the same exit code.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.distributed as dist

from training import emf
from training.fabric_analyzer import Verdict
from training.fabric_gate import (
    INJECT_ENV,
    NODE_NAME_ENV,
    REHEARSAL_MESSAGE_BYTES,
    Bandwidth,
    GateConfig,
    GateFailedError,
    GateVerdict,
    Injection,
    KubeApi,
    NodeHealth,
    NodeOutcome,
    Outcome,
    PairResult,
    RankTransport,
    bisect,
    decide,
    emf_document,
    exit_code_for,
    judge_two_nodes,
    nccl_log_path,
    own_transport,
    read_efa,
    record_failure,
    report_own_node,
    run_id,
    write_pod_verdict,
    write_shared_verdict,
    write_termination_message,
)

WARMUP = 2
ITERS = 10
PAIR_ITERS = 5
MAX_PAIR_ROUNDS = 4


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sweep(
    group: Any, device: torch.device, sizes: Sequence[int], *, budget_s: float, started: float, iters: int = ITERS
) -> list[Bandwidth]:
    """All-reduce bus bandwidth per size (nccl-tests' busbw: size / time x 2(n-1)/n), the slowest rank's time; stops
    once the gate has used its budget (decided on the all-reduced clock, so every rank stops at the same size)."""
    ranks = dist.get_world_size(group)
    results: list[Bandwidth] = []
    for size in sizes:
        buffer = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        for _ in range(WARMUP):
            dist.all_reduce(buffer, group=group)
        _sync(device)
        begin = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buffer, group=group)
        _sync(device)
        clock = torch.tensor([time.perf_counter() - begin, time.perf_counter() - started], device=device)
        dist.all_reduce(clock, op=dist.ReduceOp.MAX, group=group)
        per_op = float(clock[0].item()) / iters
        if ranks > 1 and per_op > 0:
            results.append(Bandwidth(size, size / per_op * 2 * (ranks - 1) / ranks / 1e9))
        del buffer
        if float(clock[1].item()) > budget_s:
            break
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return results


def _gather(value: Any) -> list[Any]:
    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def _node_ranks(records: Sequence[RankTransport]) -> dict[str, list[int]]:
    ranks: dict[str, list[int]] = {}
    for record in records:
        assert record.rank is not None
        ranks.setdefault(record.node, []).append(record.rank)
    return {node: sorted(r) for node, r in sorted(ranks.items())}


@dataclasses.dataclass
class _Context:
    config: GateConfig
    device: torch.device
    node: str
    inject: Injection | None
    started: float

    @property
    def message_bytes(self) -> int:
        assert self.config.floor is not None
        return self.config.floor.message_bytes if self.inject is None else REHEARSAL_MESSAGE_BYTES

    @property
    def floor_gbps(self) -> float:
        assert self.config.floor is not None
        return self.config.floor.busbw_gbps


def _injected_bandwidth(ctx: _Context, nodes: Sequence[str]) -> float:
    """The rehearsal's fake bus bandwidth: under the floor with the injected slow node taking part, above it without."""
    slow = ctx.inject is not None and ctx.inject.kind == "slow" and ctx.inject.node in nodes
    return ctx.floor_gbps * (0.5 if slow else 1.5)


def _pair_tester(
    ctx: _Context, node_ranks: dict[str, list[int]]
) -> Callable[[list[tuple[str, str]]], list[PairResult]]:
    def test(pairs: list[tuple[str, str]]) -> list[PairResult]:
        groups = [dist.new_group(sorted(node_ranks[a] + node_ranks[b])) for a, b in pairs]
        mine = next((i for i, pair in enumerate(pairs) if ctx.node in pair), None)
        busbw: float | None = None
        if mine is not None:
            measured = sweep(
                groups[mine],
                ctx.device,
                [ctx.message_bytes],
                budget_s=float("inf"),
                started=ctx.started,
                iters=PAIR_ITERS,
            )
            busbw = measured[-1].busbw_gbps if measured else None
            if ctx.inject is not None:
                busbw = _injected_bandwidth(ctx, pairs[mine])
        values = _gather((mine, busbw))
        for group in groups:
            dist.destroy_process_group(group)
        results = []
        for index, (a, b) in enumerate(pairs):
            found = [bw for i, bw in values if i == index and bw is not None]
            value = min(found) if found else None
            results.append(PairResult(a, b, value is not None and value >= ctx.floor_gbps, value))
        return results

    return test


def _node_health(ctx: _Context, node_ranks: dict[str, list[int]]) -> list[NodeHealth]:
    """Each node's own checks: sysfs (the node's lowest rank reads it) and an all-reduce among its own ranks."""
    groups = {node: dist.new_group(ranks) for node, ranks in node_ranks.items()}
    mine = node_ranks[ctx.node]
    intra: float | None = None
    if len(mine) > 1:
        measured = sweep(
            groups[ctx.node], ctx.device, [ctx.message_bytes], budget_s=float("inf"), started=ctx.started, iters=ITERS
        )
        intra = measured[-1].busbw_gbps if measured else None
    if ctx.inject is not None:
        intra = 10.0 if ctx.inject.kind == "slow" and ctx.inject.node == ctx.node else 100.0
    health = None
    if dist.get_rank() == mine[0]:
        devices, down, counters = read_efa()
        health = NodeHealth(ctx.node, devices, ctx.config.efa_devices, down, intra, counters)
    values = _gather(health)
    for group in groups.values():
        dist.destroy_process_group(group)
    return [h for h in values if h is not None]


def localize(ctx: _Context, verdict: GateVerdict, records: Sequence[RankTransport]) -> GateVerdict:
    """The suspect node(s) of a failed verdict, and how they were found."""
    nodes = list(verdict.nodes)
    if verdict.failing:
        suspects = tuple(sorted({r.node for r in verdict.failing}))
        return dataclasses.replace(verdict, suspects=suspects, localization="the ranks off EFA run there")
    if not verdict.bandwidth_failed:
        return verdict
    node_ranks = _node_ranks(records)
    if len(nodes) >= 3:
        finding, _ = bisect(nodes, _pair_tester(ctx, node_ranks), max_rounds=MAX_PAIR_ROUNDS)
        return dataclasses.replace(verdict, suspects=finding.suspects, localization=finding.reason)
    if len(nodes) == 2:
        health = {h.node: h for h in _node_health(ctx, node_ranks)}
        suspects, reason = judge_two_nodes(health[nodes[0]], health[nodes[1]])
        return dataclasses.replace(verdict, suspects=suspects, localization=reason)
    return dataclasses.replace(verdict, localization="one node: no fabric between nodes to narrow down")


def _own_record(ctx: _Context, rank: int, out: TextIO) -> RankTransport:
    if ctx.inject is None:
        log = nccl_log_path()
        record = own_transport(rank, ctx.node, log)
        if log.exists():
            # NCCL_DEBUG_FILE moved NCCL's lines out of the container log; put the gate's share back for operators.
            out.write(log.read_text(errors="replace"))
            out.flush()
        return record
    fell_back = ctx.inject.kind == "fallback" and ctx.inject.node == ctx.node
    verdict = Verdict.SOCKET if fell_back else Verdict.EFA
    return RankTransport(
        rank,
        socket.gethostname(),
        ctx.node,
        verdict.value,
        f"rehearsal: injected {ctx.inject.kind} fault on {ctx.inject.node} (gloo, no NCCL log)",
    )


def _prepare_nccl_log() -> None:
    # NCCL reads NCCL_DEBUG/NCCL_DEBUG_FILE once, when it first logs: the manifests set them; a local run gets them
    # here, which works as long as no NCCL communicator exists yet (torch creates them at the first collective).
    os.environ.setdefault("NCCL_DEBUG", "INFO")
    os.environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,NET")
    log = nccl_log_path()
    os.environ.setdefault("NCCL_DEBUG_FILE", str(log.parent / "nccl.%h.%p.log"))
    Path(os.environ["NCCL_DEBUG_FILE"]).parent.mkdir(parents=True, exist_ok=True)


def collective_device(backend: str) -> torch.device:
    """Where the gate's collective tensors live: the rank's GPU under NCCL, the CPU under gloo."""
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


def run(config: GateConfig, *, backend: str, inject: Injection | None, started: float, out: TextIO) -> GateVerdict:
    assert config.floor is not None
    if inject is None:
        _prepare_nccl_log()
    rank, world = dist.get_rank(), dist.get_world_size()
    device = collective_device(backend)
    ctx = _Context(config, device, os.environ.get(NODE_NAME_ENV) or socket.gethostname(), inject, started)
    message = ctx.message_bytes
    sizes = sorted({max(4, message // 64), max(4, message // 8), message})
    bandwidths = sweep(None, device, sizes, budget_s=config.budget_s, started=started)
    records = [r for r in _gather(_own_record(ctx, rank, out))]
    bandwidth = bandwidths[-1] if bandwidths else None
    if inject is not None and bandwidth is not None:
        bandwidth = Bandwidth(config.floor.message_bytes, _injected_bandwidth(ctx, sorted({r.node for r in records})))
    verdict = decide(records, expected_ranks=world, bandwidth=bandwidth, floor=config.floor)
    if inject is not None:
        faked = f"CPU rehearsal with {INJECT_ENV}={inject.kind}:{inject.node}: transports and bandwidths are faked"
        verdict = dataclasses.replace(verdict, reasons=(faked, *verdict.reasons))
    if verdict.outcome is Outcome.FAIL:
        verdict = localize(ctx, verdict, records)
    clock = torch.tensor([time.perf_counter() - started], device=device)
    dist.all_reduce(clock, op=dist.ReduceOp.MAX)
    verdict = dataclasses.replace(verdict, seconds=float(clock[0].item()), run_seconds=config.run_seconds)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    job = os.environ.get(emf.JOB_NAME_ENV) or (config.workload or "job").split("/")[-1]
    instance_type = config.floor.instance_type or os.environ.get(emf.INSTANCE_TYPE_ENV, "")
    if verdict.outcome is Outcome.PASS:
        if local_rank == 0:
            write_pod_verdict(verdict, 0)
        if rank == 0:
            print(verdict.summary(), file=out, flush=True)
            emf.Emitter().emit(emf_document(verdict, job_name=job, instance_type=instance_type))
        return verdict
    # The pod of each suspect node reports its own node (the controller believes a pod only about the node it runs
    # on) and waits for the answer; every rank then holds every outcome.
    mine: NodeOutcome | None = None
    if local_rank == 0 and ctx.node in verdict.suspects:
        mine = report_own_node(verdict, KubeApi.in_cluster(), workload=config.workload)
    outcomes = [o for o in _gather(mine) if o is not None]
    taken = [o for o in outcomes if o.taken]
    code = [0]
    if rank == 0:
        # The failures of a run count against the workload's uid the controller read (a RayJob's own, which no pod
        # of its cluster carries), else the configured run id.
        uids = sorted({o.workload_uid for o in taken if o.workload_uid})
        run = uids[0] if uids else run_id(config)
        failures = record_failure(config.state_dir, run, verdict) if taken else None
        code = [exit_code_for(verdict, failures, config.max_failures, taken=bool(taken))]
        write_shared_verdict(config.state_dir, run_id(config), verdict, code[0])
        lines = [verdict.summary()]
        lines += [f"FABRIC GATE: {o.node}: {'taken out' if o.taken else 'not taken out'}: {o.text}" for o in outcomes]
        if not verdict.suspects:
            lines.append("FABRIC GATE: no suspect node: nothing to take out, the job fails with the verdict")
        if taken:
            lines.append(f"FABRIC GATE: gate failures of this run: {failures} of {config.max_failures}")
        print("\n".join(lines), file=out, flush=True)
        emf.Emitter().emit(emf_document(verdict, job_name=job, instance_type=instance_type))
    dist.broadcast_object_list(code, src=0)
    if local_rank == 0:
        write_termination_message(verdict.summary())
        write_pod_verdict(verdict, code[0])
    raise GateFailedError(verdict, code[0])
