"""`trainctl logs`: the logs of a Ray job or of Ray pods, or the NCCL fabric verdict on them.

    trainctl logs --env dev --job ID [--follow]         the job's driver log (`ray job logs` in the head pod)
    trainctl logs --env dev --workers [--follow]        every worker pod of the RayCluster, each line
                                                        prefixed [pod/NAME/CONTAINER] (as kubectl --prefix)
    trainctl logs --env dev --pod NAME [--previous]     one pod (its Ray container unless --container)
    trainctl logs --env dev --workers --fabric          did NCCL use EFA on every rank? The container logs and
                                                        the Ray session worker logs inside each worker pod
                                                        (/tmp/ray/session_latest/logs/worker-*.out|err, where
                                                        the Ray Train actors' NCCL lines are) are read in full
                                                        and judged by training.fabric_analyzer (the same
                                                        verdict and exit code as `trainctl fabric-check`;
                                                        fewer ranks than NCCL reported is no evidence, exit 3)

Workers are the pods labelled ray.io/node-type=worker (and ray.io/cluster=NAME, see --ray-cluster;
a RayJob's own cluster is named in `trainctl status`). With --fabric the logs themselves are not
printed, only the verdict; with --follow it is given when the streams end.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

from trainctl import flags
from trainctl.eks_auth import ConnectError, Target, connect
from trainctl.exit_codes import ExitCode
from trainctl.kube import KubeError, get_pod
from trainctl.logs import LogCollector, read_job, read_pods, read_session_logs, worker_pods
from trainctl.progress import Progress
from trainctl.ray_jobs import SUBMISSION_ID
from training import fabric_analyzer


def collect(args: argparse.Namespace, target: Target, collector: LogCollector) -> list[str]:
    if args.job is not None:
        return read_job(target, args.job, collector, follow=args.follow, progress=Progress.for_args(args))
    if args.workers:
        pods = worker_pods(target)
    else:
        pods = [get_pod(target.api, target.namespace, args.pod, timeout=target.request_timeout)]
    errors = read_pods(target, pods, collector, container=args.container, follow=args.follow, previous=args.previous)
    if args.workers and args.fabric:
        errors += read_session_logs(target, pods, collector)
    return errors


def judge(collector: LogCollector, errors: list[str], *, as_json: bool, out: TextIO | None = None) -> ExitCode:
    """The fabric analyzer's report on the collected logs; its exit status is ours."""
    analyzer = fabric_analyzer.Analyzer()
    for source, lines in collector.lines.items():
        analyzer.feed(lines, source)
    report = analyzer.report()
    report.errors.extend(errors)
    stream = out if out is not None else sys.stdout
    if as_json:
        stream.write(json.dumps(report.to_json(), indent=2) + "\n")
    else:
        text, err = report.render()
        stream.write(text)
        sys.stderr.write(err)
    return ExitCode(int(report.exit_status))


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "logs",
        help="logs of a Ray job, a pod or every Ray worker; --fabric: did NCCL use EFA",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes: 0 logs read (--fabric: every rank used EFA), 1 --fabric: a rank fell back to "
        "sockets or a non-efa provider, 2 could not read (all) the logs, 3 --fabric: no NCCL network lines "
        "(set NCCL_DEBUG=INFO)",
    )
    flags.add_connection(parser)
    what = parser.add_argument_group("what").add_mutually_exclusive_group(required=True)
    what.add_argument("--job", metavar="SUBMISSION_ID", help="the Ray job's driver log (ray job logs)")
    what.add_argument("--pod", metavar="NAME", help="one pod of the namespace")
    what.add_argument("--workers", action="store_true", help="every Ray worker pod of the RayCluster")
    parser.add_argument("--container", metavar="NAME", help="pod logs: this container (default: the Ray container)")
    parser.add_argument("--previous", action="store_true", help="pod logs: of the previous, crashed container")
    parser.add_argument("--follow", "-f", action="store_true", help="keep streaming until the job or pods end")
    parser.add_argument(
        "--fabric", action="store_true", help="print the NCCL fabric verdict on the logs instead of the logs"
    )
    flags.add_output(parser, json_help="with --fabric: the verdict as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.json and not args.fabric:
        sys.stderr.write("error: --json goes with --fabric (logs are printed as they are)\n")
        return int(ExitCode.ERROR)
    if args.job is not None and (args.container or args.previous):
        sys.stderr.write("error: --container and --previous go with --pod or --workers, not --job\n")
        return int(ExitCode.ERROR)
    if args.job is not None and not SUBMISSION_ID.match(args.job):
        sys.stderr.write(f"error: --job {args.job!r} is not a submission id\n")
        return int(ExitCode.ERROR)
    collector = LogCollector(prefix=bool(args.workers), echo=not args.fabric, keep=args.fabric)
    try:
        target = connect(flags.connection(args))
    except ConnectError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return int(ExitCode.ERROR)
    try:
        try:
            errors = collect(args, target, collector)
        except KubeError as exc:
            errors = [str(exc)]
            if not args.fabric:
                sys.stderr.write(f"error: {exc}\n")
                return int(ExitCode.ERROR)
    except KeyboardInterrupt:
        sys.stderr.write("trainctl: interrupted\n")
        return int(ExitCode.ERROR)
    finally:
        target.api.close()
    if args.fabric:
        return int(judge(collector, errors, as_json=args.json))
    for message in errors:
        sys.stderr.write(f"error: {message}\n")
    return int(ExitCode.ERROR if errors else ExitCode.OK)
