"""The flag groups trainctl's commands share, each declared once, so a flag means the same in every command.

- `--env NAME`: one of infra/spec's ENVIRONMENTS; anything else is refused by argparse (exit 2, usage)
  with the same message everywhere, naming the value and the known environments.
- AWS: `--profile NAME`, `--endpoint-url [SERVICE=]URL` (repeatable) and, where a command may ask
  another region than the environment's, `--region REGION`.
- connection (every command that connects to EKS): `--kubeconfig` or the environment's EKS cluster,
  `--context`, `--cluster`, `--profile`, `--endpoint-url`, `--request-timeout`, and where a command works
  in a RayCluster `--env` or `--kubeconfig` (one of them), `--namespace`, `--ray-cluster`
  (trainctl.eks_auth.Connection; `connection(args)` reads them).
- output: `--json` (one JSON document on stdout instead of the tables; what goes to stderr is the same
  either way) and `--quiet` (no progress lines; trainctl.progress says where progress goes).

Taken from: the AWS CLI declares its global options once (awscli/data/cli.json, "options": --profile,
--region, --endpoint-url, --output ...) and every service command behaves the same under them; argparse
takes no options before a subcommand's name here, so each command adds the groups it uses from this
module instead of the parser having global ones. eksctl keeps flags in pkg/ctl (cmdutils' shared flag
helpers such as AddRegionFlag and AddCommonFlagsForAWS) and the work in pkg/actions; a trainctl command's
add_parser/run holds only flags and output, its library module the work. SkyPilot gathers its shared
click options in one module (sky/client/cli/flags.py); this is that module for argparse.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from infra.spec import ENVIRONMENTS
from infra.spec.namespaces import RAY
from trainctl.arguments import aws_endpoint, environment_name, region_name, seconds
from trainctl.eks_auth import DEFAULT_REQUEST_TIMEOUT_S, RAY_CLUSTER, Connection

Parser = argparse.ArgumentParser | argparse._ArgumentGroup


def add_env(parser: Parser, *, flag: str = "--env", required: bool = True, help: str | None = None) -> argparse.Action:
    """--env NAME (or another flag that names an environment, as pin's --built), checked against
    infra/spec/environments.py's ENVIRONMENTS."""
    return parser.add_argument(
        flag,
        required=required,
        type=environment_name,  # its message for an unknown name; choices for the usage line and the docs test
        choices=sorted(ENVIRONMENTS),
        metavar="ENV",
        help=(help or "the environment") + f": {', '.join(sorted(ENVIRONMENTS))} (infra/spec/environments.py)",
    )


def add_aws(
    parser: Parser,
    *,
    services: Sequence[str],
    region: bool = False,
    profile_help: str = "the AWS profile (default: boto3's choice, e.g. AWS_PROFILE)",
) -> None:
    """--profile and --endpoint-url for a command that calls `services`; --region where it may ask another
    region than the environment's (default: the environment's own)."""
    if region:
        parser.add_argument(
            "--region",
            type=region_name,
            help="the region to ask (default: the environment's own; another one is warned about)",
        )
    add_profile(parser, help=profile_help)
    add_endpoint_url(parser, services=services)


def add_profile(parser: Parser, *, help: str = "the AWS profile (default: boto3's choice, e.g. AWS_PROFILE)") -> None:
    parser.add_argument("--profile", metavar="NAME", help=help)


def add_endpoint_url(parser: Parser, *, services: Sequence[str]) -> None:
    parser.add_argument(
        "--endpoint-url",
        type=aws_endpoint,
        action="append",
        default=[],
        metavar="[SERVICE=]URL",
        help=f"send AWS requests ({', '.join(services)}; SERVICE one of them, default all) to another endpoint, "
        "e.g. a local emulator; repeatable",
    )


def add_output(parser: Parser, *, json: bool = True, quiet: bool = True, json_help: str | None = None) -> None:
    """--json (one JSON document on stdout) and --quiet (no progress lines on stderr)."""
    if json:
        parser.add_argument(
            "--json", action="store_true", help=json_help or "print one JSON document instead of the table(s)"
        )
    if quiet:
        parser.add_argument(
            "--quiet", "-q", action="store_true", help="no progress lines on stderr (errors are still printed)"
        )


# Every request of a connection, as one type, so --request-timeout is the same flag wherever it is.
request_timeout = seconds(3600)


def add_connection(parser: argparse.ArgumentParser, *, ray: bool = True) -> argparse._ArgumentGroup:
    """The Kubernetes API connection (trainctl.eks_auth), one group in every command that connects to EKS:
    --kubeconfig or the environment's EKS cluster, --context, --cluster, the AWS options of the EKS calls
    (--profile, --endpoint-url) and --request-timeout.

    ray=True (status, logs, submit, drain): --env or --kubeconfig (exactly one) says where, and --namespace and
    --ray-cluster say which RayCluster to work in. ray=False (scale): the command's own --env names what to
    work on as well, and --kubeconfig only replaces the EKS connection."""
    group = parser.add_argument_group(
        "connection",
        "The Kubernetes API: by default the environment's EKS cluster (endpoint and CA from eks:DescribeCluster, "
        "token signed with your AWS credentials; the endpoint is private: run from inside the VPC), or "
        "--kubeconfig.",
    )
    kubeconfig_help = "use this kubeconfig for the Kubernetes API instead of the EKS cluster"
    if ray:
        source = group.add_mutually_exclusive_group(required=True)
        add_env(
            source,
            required=False,
            help="the environment, for its region and EKS cluster (named after ClusterConfig.name)",
        )
        source.add_argument("--kubeconfig", type=Path, metavar="FILE", help=kubeconfig_help)
    else:
        group.add_argument("--kubeconfig", type=Path, metavar="FILE", help=kubeconfig_help)
    group.add_argument("--context", metavar="NAME", help="kubeconfig context (default: its current-context)")
    group.add_argument("--cluster", metavar="NAME", help="EKS cluster name (default: the environment's)")
    add_aws(group, services=["eks"])
    if ray:
        group.add_argument(
            "--namespace", default=RAY.name, metavar="NS", help="namespace of the Ray cluster (default: %(default)s)"
        )
        group.add_argument(
            "--ray-cluster",
            default=RAY_CLUSTER,
            metavar="NAME",
            help="RayCluster whose pods to use, label ray.io/cluster (default: %(default)s; '' for any; "
            "a RayJob's own cluster is named in `trainctl status`)",
        )
    group.add_argument(
        "--request-timeout",
        type=request_timeout,
        default=DEFAULT_REQUEST_TIMEOUT_S,
        metavar="SECONDS",
        help="per API request, not for streams (default: %(default)g)",
    )
    return group


def connection(args: argparse.Namespace) -> Connection:
    """The values of add_connection's flags (ray=True)."""
    return Connection(
        env=args.env,
        kubeconfig=args.kubeconfig,
        context=args.context,
        cluster=args.cluster,
        profile=args.profile,
        endpoint_urls=dict(args.endpoint_url),
        namespace=args.namespace,
        ray_cluster=args.ray_cluster,
        request_timeout=args.request_timeout,
    )
