"""`trainctl rehearse FILE...`: run the manifests you will apply as pods on this machine, on CPU.

Every Job (Indexed too), RayJob and RayCluster in the files runs as isolated pods (own mount, PID,
UTS and network namespaces; emptyDir private to a pod, one shared directory per PVC claim, ConfigMap
files, per-pod /etc/hosts with Service and pod DNS names) with Job and KubeRay semantics. Pods get
PLATFORM_REHEARSAL=cpu, which the training code honours to use CPU and gloo; GPU and EFA requests are
reported, not satisfied, and images are not pulled (this machine's Python environment runs instead).
Needs Linux and root (or unprivileged user namespaces).

With --env E the pods run on a simulated cluster of environment E, built from infra/spec
(rehearse/cluster): its system nodes and the GPU nodes --nodes asks for, kube-scheduler's filters
(a pod that fits no node stays Pending with kube-scheduler's message), Kueue v0.19.2 admission for
labelled workloads, and node loss with --kill-node. Times, --timeout included, are then cluster
seconds; --time-scale X makes every controller timeout run X times faster.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rehearse import Kill, Options, RehearsalError, format_table, load_manifests, run
from trainctl.exit_codes import ExitCode


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "rehearse",
        help="run Jobs, RayJobs and RayClusters from manifests as isolated pods on this machine, on CPU",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes: 0 every workload completed, 1 one failed or timed out, 2 could not run",
    )
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE", help="Kubernetes YAML (e.g. dist/dev/*.yaml)")
    parser.add_argument("--timeout", type=float, default=1800.0, metavar="S", help="whole run (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    parser.add_argument(
        "--kill",
        action="append",
        default=[],
        metavar="POD@SECONDS",
        help="kill the pod (name or hostname prefix) SECONDS into the run, as a node loss would; repeatable",
    )
    parser.add_argument(
        "--output-dir", type=Path, default=None, help="per-pod logs and volumes (default: a new temp dir)"
    )
    parser.add_argument(
        "--pod-backoff",
        type=float,
        default=10.0,
        metavar="S",
        help="delay before replacing a failed Job pod, doubling per failure (Kubernetes: 10)",
    )
    parser.add_argument(
        "--host-path",
        action="append",
        default=[],
        type=Path,
        metavar="DIR",
        help="a host directory every pod sees read-only at the same path (e.g. a local model); repeatable",
    )
    parser.add_argument(
        "--env",
        default=None,
        metavar="E",
        help="run on environment E's cluster (infra/spec/environments.py): its nodes, kube-scheduler, Kueue",
    )
    parser.add_argument(
        "--nodes",
        action="append",
        default=[],
        metavar="GROUP=N",
        help="with --env: N nodes in GPU group GROUP (default 0, as deployed); repeatable",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="X",
        help="with --env: cluster seconds per wall second, every controller timeout X times faster (default 1)",
    )
    parser.add_argument(
        "--kill-node",
        action="append",
        default=[],
        metavar="NODE@SECONDS",
        help="with --env: lose NODE (an alias such as g6-0, or its name) at SECONDS cluster time; repeatable",
    )
    parser.set_defaults(run=run_command)


def run_command(args: argparse.Namespace) -> int:
    try:
        options = Options(
            output_dir=args.output_dir,
            timeout_s=args.timeout,
            kills=tuple(Kill.parse(k) for k in args.kill),
            backoff_base_s=args.pod_backoff,
            host_paths=tuple(args.host_path),
            log=None if args.json else lambda line: print(line, file=sys.stderr, flush=True),
        )
        manifests = load_manifests(args.files)
        if args.env is not None:
            from rehearse.cluster.session import parse_node_kill, parse_nodes, run_on_environment

            rehearsal = run_on_environment(
                manifests,
                options,
                environment=args.env,
                gpu_nodes=dict(parse_nodes(n) for n in args.nodes),
                time_scale=args.time_scale,
                node_kills=tuple(parse_node_kill(k) for k in args.kill_node),
            )
        elif args.nodes or args.kill_node or args.time_scale != 1.0:
            raise RehearsalError("--nodes, --kill-node and --time-scale need --env (the cluster they apply to)")
        else:
            rehearsal = run(manifests, options)
    except RehearsalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    print(json.dumps(rehearsal.to_json(), indent=2) if args.json else format_table(rehearsal))
    return ExitCode.OK if rehearsal.exit_code == 0 else ExitCode.CHECK_FAILED
