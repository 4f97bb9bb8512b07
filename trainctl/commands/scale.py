"""`trainctl scale`: set a GPU node group's size and wait until every node can run GPU and EFA pods.

    trainctl scale --env prod --group p5 --nodes 3             grow to 3 nodes, wait (30 min at most)
    trainctl scale --env prod --group p5 --nodes 0             shrink to none (no node wait)
    trainctl scale --env dev --group g6 --nodes 3 --kubeconfig ~/.kube/config --wait 900

N for a gated group (its jobs span 2 or more nodes and run the fabric gate): the jobs' nodes (workload_nodes) plus
one spare, 3 for the gangs of 2 here. The gate takes a failing node out with a taint and the gang is re-placed only
onto untainted nodes; with fewer, or with a node the gate took out among them, the command warns, naming the fix.

Steps:
1. N must lie within the group's scaling.min_size..max_size (infra/spec/environments.py) and the
   deployed node group's (eks:DescribeNodegroup); otherwise nothing is changed.
2. eks:UpdateNodegroupConfig sets scalingConfig.desiredSize=N, keeping min and max; the update is
   followed with eks:DescribeUpdate until Successful, Failed or Cancelled.
3. Then (N > 0) the Kubernetes API is polled until N nodes labelled eks.amazonaws.com/nodegroup=<cluster>-<group>
   are Ready, each advertises allocatable nvidia.com/gpu and vpc.amazonaws.com/efa equal to the
   instance facts (GPU count, the group's EFA interfaces), and the NVIDIA and EFA device-plugin pods
   on each are Ready. On timeout it names, per node, what is missing.

A later `cdk deploy` that changes the group's scaling config sets the desired size back to the template's.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

from infra.spec import Environment
from trainctl import flags
from trainctl import scale as scaling
from trainctl.arguments import node_count, seconds
from trainctl.aws import Aws
from trainctl.eks_auth import api_client
from trainctl.output import emit
from trainctl.progress import Progress
from trainctl.scale import DEFAULT_WAIT_S


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "scale",
        help="set a GPU node group's desired size and wait until every node has its GPUs, EFA and device plugins",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes: 0 scaled (and, N > 0, every node usable; a gated group below its gang and a spare only "
        "warns), 1 the update failed or the nodes were not "
        "usable within --wait (what is missing is named per node), 2 could not run (refused N, unknown "
        "environment or group, AWS or Kubernetes API errors)",
    )
    flags.add_env(parser)
    parser.add_argument("--group", required=True, metavar="NAME", help="the GPU node group")
    parser.add_argument(
        "--nodes",
        required=True,
        type=node_count(0),
        metavar="N",
        help="the desired node count (a gated group: its workload nodes plus one spare)",
    )
    parser.add_argument(
        "--wait",
        type=seconds(24 * 3600),
        default=DEFAULT_WAIT_S,
        metavar="SECONDS",
        help="for the update and the nodes, each (default: %(default)g)",
    )
    flags.add_output(parser)
    flags.add_connection(parser, ray=False)
    parser.set_defaults(run=run)


def _kube_factory(args: argparse.Namespace, endpoints: Mapping[str, str]) -> Callable[[Environment], Any]:
    def connect(env: Environment) -> Any:
        return api_client(
            kubeconfig=args.kubeconfig,
            context=args.context,
            region=env.region,
            cluster=args.cluster or env.cluster.name,
            profile=args.profile,
            endpoint_urls=endpoints,
        )

    return connect


def run(args: argparse.Namespace) -> int:
    endpoints: dict[str, str] = dict(args.endpoint_url)
    report = scaling.scale(
        args.env,
        args.group,
        args.nodes,
        aws_factory=lambda region: Aws(region=region, profile=args.profile, endpoint_urls=endpoints),
        kube=_kube_factory(args, endpoints),
        wait_s=args.wait,
        poll_s=scaling.POLL_S,
        request_timeout=args.request_timeout,
        say=Progress.for_args(args).say,
        cluster_name=args.cluster,
    )
    return emit(report, as_json=args.json)
