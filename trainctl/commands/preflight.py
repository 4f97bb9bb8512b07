"""`trainctl preflight`: before `cdk deploy`, ask AWS whether an environment can be built as declared.

    trainctl preflight --env prod                  the checks as a table, in prod's own region
    trainctl preflight --env prod --json           one JSON document, for machines
    trainctl preflight --env dev --region us-east-1
                                                   another region (warned: the zone names are dev's)

Read-only calls with the caller's credentials (environment, AWS_PROFILE or --profile, SSO,
instance role); the declarations come from infra/spec (environments, instances, versions):

  offering    each GPU instance type is offered in the GPU zone       ec2:DescribeInstanceTypeOfferings
  instance    EFA supported; EFA interfaces and network cards cover   ec2:DescribeInstanceTypes
              what the node group attaches; GPUs and vCPUs as in
              infra/spec/instances.py
  quota       On-Demand vCPU quotas, P (L-417A185B) and G and VT      servicequotas:GetServiceQuota
              (L-DB2E81BA), cover the on-demand GPU groups at max
              size plus a rolling update's surge node
  capacity    a configured reservation or Capacity Block exists, is   ec2:DescribeCapacityReservations
              active (or scheduled), and matches type, zone, count
  kubernetes  EKS offers KUBERNETES_VERSION in the region             eks:DescribeClusterVersions
  add-on      EKS offers each pinned managed add-on version for it    eks:DescribeAddonVersions
  subnet      if the VPC is deployed: each private subnet has free    ec2:DescribeVpcs, DescribeSubnets,
              addresses for its nodes' interfaces and pods                DescribeInstances
  placement   a reservation made in a cluster placement group is      ec2:DescribeCapacityReservations
              launched into that group (capacity.placement_group_name)
  admin       each cluster.admin_principals entry exists (EKS        sts:GetCallerIdentity, iam:GetRole,
              refuses an access entry for a missing one)                  iam:GetUser
  chart       each pinned Helm chart version (versions.py             HTTP GET <repository>/index.yaml;
              HELM_CHARTS) is listed in its repository's index,           oci://: HEAD /v2/<chart>/manifests/
              or (an oci:// chart) its tag exists in the registry         <version> (OCI distribution API)
  leftover    what an earlier deployment left: an EKS cluster, or a   cloudformation:ListStackResources,
              GPU node group, of the fixed name outside its stack         eks:DescribeCluster, Describe-
              (blocks), retained FSx file systems outside the storage     Nodegroup, fsx:DescribeFileSystems,
              stack (cost), the control-plane log group (adopted)         logs:DescribeLogGroups
  scaled      a deployed GPU node group's desired size against the    eks:DescribeNodegroup
              spec's desired_size: `trainctl scale` moved it and its
              Kueue quota; a cdk deploy may set either back (WARN)

One row per check and subject: PASS, WARN (deployable, but read the reason) or FAIL, with the
reason and the fix. A check that could not run (no credentials, endpoint unreachable, access
denied) is a NOT RUN row (no verdict, never FAIL) whose reason starts with "could not run:".
"""

from __future__ import annotations

import argparse

from infra.spec.versions import HELM_CHARTS
from trainctl import flags
from trainctl.arguments import keyed_url
from trainctl.aws import SERVICES
from trainctl.output import emit
from trainctl.preflight.chart import ALL_CHARTS
from trainctl.preflight.runner import preflight
from trainctl.progress import Progress

# --chart-repository [CHART=]URL (--endpoint-url is trainctl.arguments.aws_endpoint, as in capacity and scale).
_chart_repository = keyed_url(HELM_CHARTS, default=ALL_CHARTS, key_name="CHART")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "preflight",
        help="before cdk deploy: check with AWS that an environment's GPU types, EFA, quotas, capacity, "
        "Kubernetes version, add-ons, subnet addresses, admin principals and chart versions will work, and "
        "that no leftover of an earlier deployment is in the way",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes: 0 no check failed (WARN rows allowed), 1 a check failed, 2 could not run "
        "(unknown environment, bad arguments, or a check could not run and none failed: no credentials, "
        "endpoint unreachable, access denied)",
    )
    flags.add_env(parser)
    flags.add_aws(parser, services=SERVICES, region=True)
    flags.add_output(parser)
    parser.add_argument(
        "--chart-repository",
        type=_chart_repository,
        action="append",
        default=[],
        metavar="[CHART=]URL",
        help=f"fetch a pinned chart's index.yaml from another Helm repository (a mirror); CHART is one of "
        f"{', '.join(HELM_CHARTS)} (default: all of them); repeatable",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    progress = Progress.for_args(args)
    report = preflight(
        args.env,
        region=args.region,
        profile=args.profile,
        endpoint_urls=dict(args.endpoint_url),
        chart_repositories=dict(args.chart_repository),
        progress=lambda check: progress.say(f"checking {check} ..."),
    )
    return emit(report, as_json=args.json)
