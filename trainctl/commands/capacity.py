"""`trainctl capacity`: in which availability zone can N GPU nodes of a group launch now?

    trainctl capacity --env prod --group p5 --nodes 3                 every zone of prod's region
    trainctl capacity --env prod --group p5 --regions us-east-1       ... and of another region
    trainctl capacity --env prod --group p5 --nodes 3 --probe         ... plus a real reservation probe

Per zone, with the caller's credentials:

  OFFERED   EC2 offers the group's instance type there          ec2:DescribeInstanceTypeOfferings
  QUOTA     On-Demand vCPU quota of the family minus the vCPUs  servicequotas:GetServiceQuota,
            of running On-Demand instances of it, minus N nodes ec2:DescribeInstances
            (the headroom; per region)
  SUBNET    the environment's VPC has a private subnet there    ec2:DescribeVpcs, DescribeSubnets
            ("planned": not deployed, but the zone is in network.availability_zones)
  SPOT      Spot placement score (1-10) for N instances: a      ec2:GetSpotPlacementScores
            HINT about spare capacity, never a verdict
  PROBE     with --probe only: an On-Demand Capacity            ec2:CreateCapacityReservation,
            Reservation for N instances, created and cancelled  CancelCapacityReservation,
            at once; the only definitive answer. It is BILLED   DescribeCapacityReservations
            at the On-Demand rate for the seconds it exists.

A zone can take the nodes when every column that ran says so; the command recommends one (the
environment's gpu_availability_zone when it qualifies) and says what to change if it is another.

N defaults to the group's gang (workload_nodes) plus, for a gated group (2 or more nodes: the fabric gate runs), one
spare: the gate takes a failing node out with a taint and the gang is re-placed only onto an untainted node. An N
below that is checked, with a warning naming the N to ask for.
"""

from __future__ import annotations

import argparse

from trainctl import flags
from trainctl.arguments import node_count, region_name
from trainctl.capacity import ForEnvironment, find_capacity
from trainctl.output import emit
from trainctl.progress import Progress


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "capacity",
        help="where N GPU nodes of a group can launch now: offering, vCPU quota, subnet, Spot score, "
        "and with --probe a reservation created and cancelled at once",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes: 0 a zone can take the nodes (recommended), 1 no zone can, 2 could not run "
        "(bad arguments, unknown environment or group, no zone could be judged, interrupted, or a probe "
        "reservation could not be cancelled: its id and the command to cancel it are printed)",
    )
    flags.add_env(parser)
    parser.add_argument("--group", metavar="NAME", help="the GPU node group (default: the only one)")
    parser.add_argument(
        "--nodes",
        type=node_count(1),
        metavar="N",
        help="how many nodes (default: the group's workload nodes, plus the spare a gated group keeps beside its gang; "
        "fewer warns)",
    )
    parser.add_argument(
        "--regions", nargs="+", type=region_name, default=[], metavar="REGION", help="other regions to look at too"
    )
    parser.add_argument(
        "--probe",
        action="store_true",
        help="create an On-Demand Capacity Reservation for N nodes in each candidate zone and cancel it at once "
        "(billed for the seconds it exists)",
    )
    flags.add_aws(parser, services=["ec2", "service-quotas"])
    flags.add_output(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    report, env = find_capacity(
        args.env,
        group_name=args.group,
        nodes=args.nodes,
        regions=args.regions,
        probe=args.probe,
        profile=args.profile,
        endpoint_urls=dict(args.endpoint_url),
        say=Progress.for_args(args).say,
    )
    return emit(ForEnvironment(report, env), as_json=args.json)
