"""NVRx fault-tolerance benchmark on CPU/gloo: recovery times and checkpoint stalls, medians of several runs.

    python scripts/bench_nvrx.py --runs 3 --png docs/nvrx-bench.png

Each run launches training.nvrx_fsdp under ft_launcher (2 ranks, gloo, FSDP2) on a Qwen2-shaped model built
offline (about 15 M parameters, 60 MB; a checkpoint with AdamW state is about 190 MB), and measures:

  recovery, in-process    --inprocess, an exception on rank 1: fault -> training resumed in the same processes
  recovery, ft_launcher   SIGKILL of rank 1: fault -> workers restarted by ft_launcher and resumed
  recovery, cold relaunch a finished job's processes exit, a new ft_launcher starts and resumes from the checkpoint
                          (exit of the first launcher -> training resumed)
  checkpoint stall        time the step loop was blocked per save: async (torch DCP async_save) vs sync
  checkpoint read-back    in one process, the model's checkpoint (parameters and two AdamW moments) written with
                          DCP, plainly and hashing as written, then read back and compared (training/ckpt_verify.py):
                          what verifying a save costs next to the save itself. The jobs run it in a background
                          thread after the write (sync saves: inside the stall)
  node loss: hot spare    three ft_launcher nodes on loopback (rehearse/local_nodes.py, one rank each), --nnodes=2:3;
                          the active node that is not the store host loses every process at once after a checkpoint:
                          loss -> training resumed on the standby
  node loss: replacement  two nodes, --nnodes=2; the lost node's launcher is started again at once (the replacement
                          pod): loss -> training resumed. Only the processes' part is measured: on a cluster the
                          replacement exists only after Kubernetes has evicted the lost pod (infra/spec/node_loss.py:
                          node-monitor grace 50 s + unreachable toleration 300 s), which the table adds as "modeled";
                          with no free node, the node group's replacement instance and its cold start come on top

Recovery is measured from the training's own journal (wall-clock events written by the ranks), so it covers
detection, restart, model load and checkpoint load, up to the moment the first step after the resume starts.
Shared machines are noisy: compare medians and the ratios, not single numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python scripts/bench_nvrx.py`
    sys.path.insert(0, str(ROOT))

from infra.spec.node_loss import NODE_MONITOR_GRACE_S, UNREACHABLE_TOLERATION_S  # noqa: E402
from rehearse.local_nodes import LocalNodes  # noqa: E402
from training.journal import read_journal  # noqa: E402

# What Kubernetes adds before a lost node's replacement pod exists (infra/spec/node_loss.py); a hot spare skips it.
EVICTION_S = NODE_MONITOR_GRACE_S + UNREACHABLE_TOLERATION_S
FT_LAUNCHER = str(Path(sys.executable).with_name("ft_launcher"))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"}


@dataclass(frozen=True)
class Settings:
    steps: int
    ckpt_every: int
    fault_step: int
    seq_len: int
    batch_size: int
    timeout_s: int

    def __post_init__(self) -> None:
        if not 1 < self.fault_step <= self.steps:
            raise ValueError(f"--fault-step {self.fault_step} must be in 2..--steps {self.steps}")
        if self.ckpt_every < 1 or self.ckpt_every >= self.fault_step:
            raise ValueError(f"--ckpt-every {self.ckpt_every} must be below --fault-step {self.fault_step}")


def build_model(directory: Path) -> int:
    """A Qwen2-shaped causal LM (grouped-query attention, tied embeddings) saved locally; returns its parameters."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=8192,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def launch(
    model: Path, ckpt: Path, metrics: Path, settings: Settings, *extra: str, max_restarts: int = 1, steps: int = 0
) -> dict[str, Any]:
    argv = [
        *(FT_LAUNCHER, "--standalone", "--nproc-per-node", "2", "--max-restarts", str(max_restarts)),
        *("-m", "training.nvrx_fsdp", "--model", str(model), "--device", "cpu", "--log-every", "1000"),
        *("--seq-len", str(settings.seq_len), "--batch-size", str(settings.batch_size)),
        *("--steps", str(steps or settings.steps), "--ckpt-every", str(settings.ckpt_every), "--ckpt-keep", "2"),
        *("--ckpt-dir", str(ckpt), "--metrics-file", str(metrics), *extra),
    ]
    done = subprocess.run(
        argv, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=settings.timeout_s, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{(done.stdout + done.stderr)[-4000:]}")
    result: dict[str, Any] = json.loads(metrics.read_text())
    return result


def fault_args(kind: str, settings: Settings) -> tuple[str, ...]:
    return ("--fault", kind, "--fault-step", str(settings.fault_step), "--fault-rank", "1")


def stalls(metrics: dict[str, Any]) -> list[float]:
    return [float(s["stall_s"]) for s in metrics["saves"]]


def one_recovery(metrics: dict[str, Any], by: str) -> dict[str, Any]:
    (recovery,) = metrics["recoveries"]
    if recovery.get("recovered_by") != by:
        raise RuntimeError(f"expected a recovery by {by}, got {recovery}")
    return dict(recovery)


def verify_cost(model_dir: Path, work: Path) -> dict[str, float]:
    """Seconds to write the model's checkpoint with DCP (plain, then hashing as written) and to read it back."""
    import shutil

    import torch
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save
    from transformers import Qwen2ForCausalLM

    from training import ckpt_verify

    params = Qwen2ForCausalLM.from_pretrained(model_dir).state_dict()
    # What an AdamW checkpoint holds per parameter: the value and two moments (float32).
    kinds = ("param", "exp_avg", "exp_avg_sq")
    state = {f"{kind}.{k}": torch.randn_like(v) for kind in kinds for k, v in params.items()}
    seconds: dict[str, float] = {}
    for key, hashed in (("write_s", False), ("write_hashed_s", True)):
        directory = work / key
        directory.mkdir(parents=True)
        writer = FileSystemWriter(directory)
        fs = ckpt_verify.hash_writes(writer) if hashed else None
        started = time.perf_counter()
        save(state, storage_writer=writer, no_dist=True)
        seconds[key] = time.perf_counter() - started
        if fs is not None:
            verdict = ckpt_verify.verify_rank(directory, 0, fs.digests)
            if not verdict.ok:
                raise RuntimeError(f"the bench's own checkpoint failed verification: {verdict}")
            seconds["verify_s"] = verdict.seconds
            seconds["verify_bytes"] = float(verdict.bytes)
        shutil.rmtree(directory)
    return seconds


def node_loss(model: Path, work: Path, settings: Settings, *, spares: int) -> float:
    """Seconds from the loss of an active non-host node to the first resume after it (the journal's RESUMED): onto the
    standby with `spares`, else onto the lost node's launcher started again at once."""
    ckpt = work / "ckpt"
    training = [
        *("--model", str(model), "--device", "cpu", "--log-every", "1000", "--seq-len", str(settings.seq_len)),
        *("--batch-size", str(settings.batch_size), "--steps", str(settings.steps)),
        *("--ckpt-every", str(settings.ckpt_every), "--ckpt-keep", "2", "--ckpt-dir", str(ckpt)),
        *("--metrics-file", str(work / "metrics.json")),
    ]
    journal = ckpt / "journal.jsonl"
    with LocalNodes(FT_LAUNCHER, training, work / "logs", active=2, spares=spares, cwd=ROOT, env=ENV) as nodes:
        nodes.start_all()
        deadline = time.monotonic() + settings.timeout_s
        while not any(e["event"] == "commit" and e["step"] >= settings.ckpt_every for e in read_journal(journal)):
            if time.monotonic() > deadline or any(p.poll() is not None for p in nodes.procs.values()):
                raise RuntimeError(f"no checkpoint before the loss:\n{nodes.log(0)[-4000:]}")
            time.sleep(0.05)
        (pid,) = [e["pid"] for e in read_journal(journal) if e["event"] == "start" and e["rank"] == 1]
        lost = nodes.node_of(pid)
        if lost is None:
            raise RuntimeError(f"rank 1 (pid {pid}) runs on no node")
        lost_at = nodes.lose(lost)
        if not spares:
            nodes.start(lost)
        # With a spare, the lost node stays lost (its exit code is the kill's); the replacement must exit 0 too.
        codes = nodes.wait([i for i in nodes.procs if spares == 0 or i != lost], timeout_s=settings.timeout_s)
        if any(code != 0 for code in codes.values()):
            raise RuntimeError(f"launchers exited {codes}:\n{nodes.log(0)[-4000:]}")
    resumed = [e for e in read_journal(journal) if e["event"] == "resumed" and e["time"] > lost_at]
    if not resumed:
        raise RuntimeError(f"no resume after the loss of node {lost}")
    return float(resumed[0]["time"]) - lost_at


@dataclass
class Sample:
    inprocess_s: float
    ft_launcher_s: float
    relaunch_s: float
    stall_async_s: float
    stall_sync_s: float
    steps_lost_inprocess: int
    steps_lost_ft_launcher: int
    spare_s: float
    replacement_s: float
    write_s: float = 0.0
    write_hashed_s: float = 0.0
    verify_s: float = 0.0


def run_once(model: Path, work: Path, settings: Settings, progress: Callable[[str], None]) -> Sample:
    progress("in-process restart after an exception")
    inprocess = launch(
        model,
        work / "inprocess" / "ckpt",
        work / "inprocess" / "metrics.json",
        settings,
        *fault_args("exception", settings),
        *("--inprocess", "--inprocess-soft-timeout", "20", "--inprocess-hard-timeout", "40"),
        *("--inprocess-barrier-timeout", "60"),
        max_restarts=0,
    )
    rec_in = one_recovery(inprocess, "inprocess")

    progress("ft_launcher restart after SIGKILL")
    killed = launch(
        model, work / "kill" / "ckpt", work / "kill" / "metrics.json", settings, *fault_args("kill", settings)
    )
    rec_kill = one_recovery(killed, "ft_launcher")

    progress("async run, then a cold relaunch that resumes from its last checkpoint")
    ckpt = work / "relaunch" / "ckpt"
    first = launch(model, ckpt, work / "relaunch" / "first.json", settings, max_restarts=0)
    exited = time.time()
    second = launch(model, ckpt, work / "relaunch" / "second.json", settings, max_restarts=0, steps=settings.steps + 2)
    resumed = [r for r in second["resumes"] if r["time"] > exited]
    if len(resumed) != 1 or resumed[0]["step"] != settings.steps:
        raise RuntimeError(f"the relaunch did not resume from step {settings.steps}: {second['resumes']}")

    progress("sync checkpoints")
    sync = launch(
        model, work / "sync" / "ckpt", work / "sync" / "metrics.json", settings, "--ckpt-mode", "sync", max_restarts=0
    )
    progress("node loss: a hot spare takes the lost node's rank")
    spare = node_loss(model, work / "spare", settings, spares=1)
    progress("node loss: the lost node's launcher started again (the replacement pod's processes)")
    replacement = node_loss(model, work / "replacement", settings, spares=0)
    progress("checkpoint write and read-back, in this process")
    cost = verify_cost(model, work / "verify")
    return Sample(
        write_s=cost["write_s"],
        write_hashed_s=cost["write_hashed_s"],
        verify_s=cost["verify_s"],
        spare_s=spare,
        replacement_s=replacement,
        inprocess_s=float(rec_in["recovery_s"]),
        ft_launcher_s=float(rec_kill["recovery_s"]),
        relaunch_s=float(resumed[0]["time"]) - exited,
        stall_async_s=statistics.median(stalls(first)),
        stall_sync_s=statistics.median(stalls(sync)),
        steps_lost_inprocess=int(rec_in["steps_lost"]),
        steps_lost_ft_launcher=int(rec_kill["steps_lost"]),
    )


ROWS = (
    ("recovery: in-process restart (exception)", "inprocess_s", "s"),
    ("recovery: ft_launcher restart (SIGKILL)", "ft_launcher_s", "s"),
    ("recovery: cold relaunch", "relaunch_s", "s"),
    ("checkpoint stall per save: async", "stall_async_s", "ms"),
    ("checkpoint stall per save: sync", "stall_sync_s", "ms"),
    ("node loss: hot spare takes the ranks", "spare_s", "s"),
    ("node loss: replacement pod, processes only", "replacement_s", "s"),
    ("checkpoint write, DCP, one process", "write_s", "ms"),
    ("checkpoint write, hashing as written", "write_hashed_s", "ms"),
    ("checkpoint read-back and compare", "verify_s", "ms"),
)
RECOVERIES = (*ROWS[:3], *ROWS[5:7])
VERIFY_ROWS = ROWS[7:]


def report(samples: list[Sample] | list[dict[str, float]]) -> dict[str, Any]:
    rows = [dict(asdict(s)) if isinstance(s, Sample) else s for s in samples]
    values = {key: [float(r[key]) for r in rows] for _, key, _ in ROWS if key in rows[0]}
    medians = {key: statistics.median(v) for key, v in values.items()}
    ratios = {}
    if "inprocess_s" in medians:
        ratios = {
            "ft_launcher / in-process recovery": medians["ft_launcher_s"] / medians["inprocess_s"],
            "cold relaunch / in-process recovery": medians["relaunch_s"] / medians["inprocess_s"],
            "sync / async checkpoint stall": medians["stall_sync_s"] / medians["stall_async_s"],
        }
    if "verify_s" in medians:
        ratios |= {
            "read-back / write": medians["verify_s"] / medians["write_s"],
            "write hashing / plain write": medians["write_hashed_s"] / medians["write_s"],
        }
    if "spare_s" not in medians:
        return {"values": values, "medians": medians, "ratios": ratios}
    ratios |= {
        "replacement pod (processes) / hot spare": medians["replacement_s"] / medians["spare_s"],
        f"replacement pod (+{EVICTION_S} s eviction) / hot spare": (medians["replacement_s"] + EVICTION_S)
        / medians["spare_s"],
    }
    modeled = {"replacement_with_eviction_s": medians["replacement_s"] + EVICTION_S, "eviction_s": EVICTION_S}
    return {"values": values, "medians": medians, "ratios": ratios, "modeled": modeled}


def table(result: dict[str, Any], runs: int) -> str:
    lines = [f"{'what':<44} {'runs':>4} {'median':>9} {'min':>9} {'max':>9}"]
    for label, key, unit in [row for row in ROWS if row[1] in result["values"]]:
        scale = 1000.0 if unit == "ms" else 1.0
        vals = [v * scale for v in result["values"][key]]
        median = result["medians"][key] * scale
        lines.append(f"{label + ' (' + unit + ')':<44} {runs:>4} {median:>9.2f} {min(vals):>9.2f} {max(vals):>9.2f}")
    if "modeled" in result:
        modeled = result["modeled"]
        label = f"modeled: replacement pod + {modeled['eviction_s']} s eviction (s)"
        lines.append(f"{label:<44} {'':>4} {modeled['replacement_with_eviction_s']:>9.2f}")
    for name, ratio in result["ratios"].items():
        lines.append(f"{'ratio: ' + name:<44} {'':>4} {ratio:>8.2f}x")
    return "\n".join(lines)


def chart(result: dict[str, Any], png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.6), gridspec_kw={"width_ratios": [5, 2]})
    for axis, rows, scale, unit in (
        (left, [row for row in RECOVERIES if row[1] in result["values"]], 1.0, "s"),
        (right, ROWS[3:5], 1000.0, "ms"),
    ):
        labels = [label.split(": ", 1)[1].replace(", ", ",\n").replace(" takes", "\ntakes") for label, _, _ in rows]
        medians = [result["medians"][key] * scale for _, key, _ in rows]
        lows = [m - min(result["values"][key]) * scale for m, (_, key, _) in zip(medians, rows, strict=True)]
        highs = [max(result["values"][key]) * scale - m for m, (_, key, _) in zip(medians, rows, strict=True)]
        bars = axis.bar(
            labels,
            medians,
            yerr=[lows, highs],
            capsize=4,
            color=["#4c72b0", "#dd8452", "#c44e52", "#55a868", "#8172b2"][: len(rows)],
        )
        axis.bar_label(bars, fmt="%.2f", label_type="center", color="white", fontweight="bold")
        axis.set_ylabel(f"median ({unit}); bars: min-max")
        axis.tick_params(axis="x", labelsize=8)
    left.set_title("recovery time after a fault")
    right.set_title("checkpoint stall per save")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)


def title(params: int, runs: int, cpus: int | None) -> str:
    return (
        f"training.nvrx_fsdp on CPU/gloo, 2 ranks, {params / 1e6:.1f} M parameters, median of {runs} runs ({cpus} CPUs)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="repetitions of every measurement (median reported)")
    parser.add_argument("--steps", type=int, default=10, help="training steps per job")
    parser.add_argument("--ckpt-every", type=int, default=2, help="checkpoint interval")
    parser.add_argument("--fault-step", type=int, default=7, help="step at whose start the faults fire")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per sequence")
    parser.add_argument("--batch-size", type=int, default=2, help="sequences per rank per step")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per launcher run")
    parser.add_argument("--png", type=Path, default=ROOT / "docs" / "nvrx-bench.png", help="chart to write")
    parser.add_argument("--json", type=Path, default=None, help="results to write (default: next to --png)")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep checkpoints and metrics here")
    parser.add_argument("--replot", type=Path, default=None, help="only redraw the table and chart of a results JSON")
    parser.add_argument(
        "--only-verify",
        action="store_true",
        help="only the checkpoint write and read-back rows (one process, no launcher): the table and --json",
    )
    parser.add_argument(
        "--only-node-loss",
        action="store_true",
        help="only the node-loss pair (hot spare vs replacement pod): the table and --json, no chart",
    )
    args = parser.parse_args(argv)
    if args.replot is not None:
        saved = json.loads(args.replot.read_text(encoding="utf-8"))
        print(table(saved, saved["runs"]))
        chart(saved, args.png, title(saved["model_parameters"], saved["runs"], saved["cpus"]))
        return 0
    if args.runs < 1:
        parser.error(f"--runs {args.runs} must be at least 1")
    try:
        settings = Settings(args.steps, args.ckpt_every, args.fault_step, args.seq_len, args.batch_size, args.timeout)
    except ValueError as exc:
        parser.error(str(exc))

    with tempfile.TemporaryDirectory(prefix="nvrx-bench-") as tmp:
        work = args.work_dir.resolve() if args.work_dir is not None else Path(tmp)
        model = work / "model"
        params = build_model(model)
        print(f"model: {params / 1e6:.1f} M parameters ({params * 4 / 2**20:.0f} MiB float32) in {model}", flush=True)
        samples: list[Sample] | list[dict[str, float]] = []
        losses: list[dict[str, float]] = []
        for run in range(1, args.runs + 1):

            def progress(what: str, run: int = run) -> None:
                print(f"[run {run}/{args.runs}] {what}", flush=True)

            if args.only_verify:
                progress("checkpoint write and read-back, in this process")
                cost = verify_cost(model, work / f"run{run}" / "verify")
                losses.append({key: cost[key] for key in ("write_s", "write_hashed_s", "verify_s")})
            elif args.only_node_loss:
                progress("node loss: hot spare, then replacement pod")
                spare = node_loss(model, work / f"run{run}" / "spare", settings, spares=1)
                replacement = node_loss(model, work / f"run{run}" / "replacement", settings, spares=0)
                losses.append({"spare_s": spare, "replacement_s": replacement})
            else:
                samples.append(run_once(model, work / f"run{run}", settings, progress))  # type: ignore[arg-type]
        if args.only_node_loss or args.only_verify:
            samples = losses

    result = report(samples)
    print(table(result, args.runs))
    if args.only_node_loss or args.only_verify:
        if args.json is not None:
            payload = {"settings": asdict(settings), "model_parameters": params, "cpus": os.cpu_count()}
            args.json.write_text(json.dumps({**payload, "runs": args.runs, **result}, indent=2) + "\n")
        return 0
    chart(result, args.png, title(params, args.runs, os.cpu_count()))
    json_path = args.json or args.png.with_suffix(".json")
    payload = {
        "settings": asdict(settings),
        "model_parameters": params,
        "cpus": os.cpu_count(),
        "runs": args.runs,
        "samples": [asdict(s) if isinstance(s, Sample) else s for s in samples],
        **result,
    }
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print(f"chart: {args.png}\nresults: {json_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
