"""`trainctl baseline`: the measured throughput baselines behind each GPU group's too-slow alarm.

    trainctl baseline record --env prod --group p5 --job nvrx-fsdp CKPT_DIR/nvrx-fsdp/journal.jsonl
    trainctl baseline record --env dev --group g6 --job qwen-finetune ray-result.json
    trainctl baseline reset --env prod --group p5 [--job nvrx-fsdp]
    trainctl baseline show [--json]

`record` reads the job's own report (the NVRx journal or the Ray fine-tune's --output-json, as `trainctl goodput`
does), refuses a run that is not the group's workload, did not pass the fabric gate or is too short, and writes the
median tokens/s of its steady steps with its provenance to infra/spec/throughput_baselines.json. Commit the file and
deploy: the group's alarm `<cluster>-<group>-throughput-<job>` fires under 80 % of it. `reset` removes a record (after
an intended change of the job, model or group); the group then waits for its next measured run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from infra.spec import ConfigError
from infra.spec import throughput_baselines as tb
from trainctl import baselines, flags, output
from trainctl.exit_codes import ExitCode


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "baseline",
        help="record, reset or show the measured throughput baselines of the GPU groups' too-slow alarms",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes: 0 done, 2 bad input (nothing written)",
    )
    actions = parser.add_subparsers(title="actions", metavar="ACTION", required=True)
    record = actions.add_parser("record", help="a gated run's median tokens/s becomes the group's baseline")
    flags.add_env(record)
    record.add_argument("--group", required=True, help="the GPU node group the run ran on")
    record.add_argument("--job", required=True, help="the job's name (its JobName metric dimension)")
    record.add_argument("report", type=Path, help="the job's journal.jsonl or the Ray fine-tune's --output-json")
    record.add_argument("--replace", action="store_true", help="replace a recorded baseline of the same job")
    record.add_argument("--commit", default=None, help="the platform commit the run ran (default: this checkout's)")
    record.add_argument("--by", default=None, help="who records it (default: $USER)")
    record.set_defaults(run=run_record)
    reset = actions.add_parser("reset", help="remove a group's baselines (its alarm waits for the next run)")
    flags.add_env(reset)
    reset.add_argument("--group", required=True, help="the GPU node group")
    reset.add_argument("--job", default=None, help="only this job's baseline (default: every job of the group)")
    reset.set_defaults(run=run_reset)
    show = actions.add_parser("show", help="the recorded baselines and the groups still waiting for one")
    flags.add_output(show, quiet=False)
    show.set_defaults(run=run_show)


def _next_steps(env: str, group: str) -> str:
    """The template changes with the file: its snapshot, the commit and the deploy that makes the alarm real."""
    return (
        "Update the template snapshots (python -m pytest tests/infra/test_stability.py --snapshot-update), commit "
        f"them with infra/spec/{tb.BASELINES_FILE.name}, and deploy '{env}/Gpu-{group}' (the alarm) and "
        f"'{env}/Platform' (the dashboard)."
    )


def _refused(exc: Exception) -> int:
    print(f"trainctl baseline: {exc}", file=sys.stderr)
    return ExitCode.ERROR


def run_record(args: argparse.Namespace) -> int:
    try:
        baseline = baselines.record(
            env=args.env,
            group=args.group,
            job=args.job,
            report=args.report,
            commit=args.commit or baselines.current_commit(),
            by=args.by or baselines.current_user(),
            replace_existing=args.replace,
        )
    except (baselines.BaselineError, ConfigError) as exc:
        return _refused(exc)
    print(
        f"recorded {baseline.environment}/{baseline.group}/{baseline.job}: {baseline.tokens_per_s:.0f} tokens/s "
        f"(median of {baseline.steps} steps); alarm under {baseline.alarm_tokens_per_s:.0f} tokens/s.\n"
        + _next_steps(baseline.environment, baseline.group)
    )
    return ExitCode.OK


def run_reset(args: argparse.Namespace) -> int:
    try:
        gone = baselines.reset(env=args.env, group=args.group, job=args.job)
    except (baselines.BaselineError, ConfigError) as exc:
        return _refused(exc)
    for baseline in gone:
        print(f"removed {'/'.join(baseline.key)} ({baseline.tokens_per_s:.0f} tokens/s)")
    print("The group waits for its next measured run. " + _next_steps(args.env, args.group))
    return ExitCode.OK


def run_show(args: argparse.Namespace) -> int:
    try:
        recorded = tb.load()
    except ConfigError as exc:
        return _refused(exc)
    waiting = baselines.waiting()
    if args.json:
        print(json.dumps({"baselines": [b.to_json() for b in recorded], "waiting": waiting}, indent=2))
        return ExitCode.OK
    rows = [
        [*b.key, f"{b.tokens_per_s:.0f}", f"{b.alarm_tokens_per_s:.0f}", b.source.run_finished, b.source.commit[:12]]
        for b in recorded
    ]
    headers = ["ENV", "GROUP", "JOB", "TOKENS/S", "ALARM UNDER", "RUN FINISHED", "COMMIT"]
    print(output.table(headers, rows) if rows else "no measured baseline recorded")
    for w in waiting:
        print(f"{w['environment']}/{w['group']} ({w['instance_type']}): waiting for its first measured run")
    return ExitCode.OK
