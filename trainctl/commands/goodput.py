"""`trainctl goodput`: where a job's wall time went, in seconds, percent, GPU-hours and dollars.

    trainctl goodput CKPT_DIR/journal.jsonl --instance-type p5.48xlarge --nodes 2
    trainctl goodput ray-result.json --instance-type g6.12xlarge --nodes 2 --json --chart goodput.png

Inputs: the NVRx job's metrics journal (training/journal.py `Event`: start, resumed, step, save,
staged, verified, verify_failed, commit, fault, finished) or the Ray fine-tune's step reports (the
`history` of its --output-json, or a JSON-lines file of reports with `step`, `step_time_s`, `time`, `process_start`).

The wall time, from the first process start (/proc, recorded in the start events) to the last event,
is partitioned: every instant belongs to exactly one cause, by priority where intervals overlap
(fault detection > recomputed steps > failed checkpoint > checkpoint stall > slow steps > productive >
fault recovery > start-up > finalize), and what no interval covers is reported as `unattributed`, so the causes add up
to the wall time by construction and the remainder shows what the journal does not explain.

- start-up: process start to the first step of the first attempt (imports, model load, sharding,
  checkpoint survey);
- fault detection: from the fault to the start of the next attempt (a hang lasts until the heartbeat
  timeout; a killed rank until ft_launcher notices);
- fault recovery: the next attempt's start to its first step (reload, resume from the checkpoint);
- recomputed: executions of steps that a later resume threw away (steps after the checkpoint it
  resumed from), which are run again;
- failed checkpoint: the time a save blocked training whose read-back then failed (quarantined, never
  published); each such save is also listed with the steps it left unprotected;
- checkpoint stall: the time a save blocked training;
- slow steps: the part of a step beyond the baseline step time (given, or the job's median step);
- finalize: after the last step (final save, parameter fingerprint, shutdown).

Checkpoint interval (Young 1974, Daly 2006): sqrt(2 x checkpoint stall x job MTBF), the job's MTBF
being the per-node MTBF (infra/spec/operating.py NODE_MTBF) divided by its node count.

Save throughput (NVRx journals whose commit events carry bytes and write_s): bytes over the seconds from a
save's start to its commit, a lower bound on the write's speed, beside the write baseline of the --env
environment's file system, which synth sized the checkpoint interval from (infra/spec/checkpoint_throughput.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trainctl import flags
from trainctl.exit_codes import ExitCode
from trainctl.goodput import DEFAULT_SLOW_FACTOR, GoodputError, chart, ledger_for, render


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "goodput",
        help="where a job's wall time went: productive steps and time lost per cause, GPU-hours and cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes: 0 done, 2 a file could not be read or understood",
    )
    parser.add_argument("files", nargs="+", type=Path, help="NVRx journal.jsonl or Ray fine-tune result/report files")
    parser.add_argument("--instance-type", default=None, help="the GPU group's instance type (GPU count, price)")
    parser.add_argument("--nodes", type=int, default=None, help="nodes of the job (default: from the ranks)")
    parser.add_argument("--baseline-step-s", type=float, default=None, help="expected seconds per step")
    parser.add_argument("--slow-factor", type=float, default=DEFAULT_SLOW_FACTOR, help="slow: above factor x baseline")
    flags.add_env(parser, required=False, help="the environment whose checkpoint file system the saves went to")
    flags.add_output(parser, quiet=False)
    parser.add_argument("--chart", type=Path, default=None, help="write a PNG chart of the causes here")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.nodes is not None and args.nodes < 1:
        print(f"trainctl goodput: --nodes {args.nodes} must be at least 1", file=sys.stderr)
        return ExitCode.ERROR
    if not args.slow_factor > 1:
        print(f"trainctl goodput: --slow-factor {args.slow_factor} must be above 1 (e.g. 1.5)", file=sys.stderr)
        return ExitCode.ERROR
    try:
        ledgers = [
            ledger_for(
                path,
                instance_type=args.instance_type,
                nodes=args.nodes,
                baseline_step_s=args.baseline_step_s,
                slow_factor=args.slow_factor,
                environment=args.env,
            )
            for path in args.files
        ]
    except GoodputError as exc:
        print(f"trainctl goodput: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    if args.json:
        print(json.dumps({"jobs": [ledger.as_json() for ledger in ledgers]}, indent=2))
    else:
        print("\n\n".join(render(ledger) for ledger in ledgers))
    if args.chart is not None:
        chart(ledgers, args.chart)
    return ExitCode.OK
