"""A Kubernetes API client for an environment's EKS cluster, without kubectl or the AWS CLI.

The bearer token is the one `aws eks get-token` makes: a presigned STS GetCallerIdentity URL
(regional endpoint, GET, X-Amz-Expires=60) whose SigV4 signature covers the header
`x-k8s-aws-id: <cluster name>`, as `k8s-aws-v1.` + URL-safe base64 of the URL without padding.
EKS accepts it for 15 minutes; the client renews it every 10 (TokenSource). The endpoint and CA
come from `eks:DescribeCluster`. The cluster is named after the environment (infra/cluster.py
passes ClusterConfig.name as cluster_name), so `--env` alone says region and cluster;
`--cluster` overrides the name, `--kubeconfig` skips AWS altogether. `api_client` is the one
connection every command makes (status, logs, submit, drain through `connect`; scale directly).

The API endpoint is private (EndpointAccess.PRIVATE): run trainctl from inside the VPC
(VPN, bastion, a peered network), as kubectl would have to.
"""

from __future__ import annotations

import atexit
import base64
import binascii
import contextlib
import os
import shlex
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.spec import get_environment
from infra.spec.namespaces import RAY

TOKEN_PREFIX = "k8s-aws-v1."
CLUSTER_ID_HEADER = "x-k8s-aws-id"
PRESIGN_EXPIRES_S = 60
"""X-Amz-Expires of the presigned URL, as `aws eks get-token` sets it."""
TOKEN_REFRESH_S = 600.0
"""EKS accepts a token for 15 minutes; a new one is made after 10."""
DEFAULT_REQUEST_TIMEOUT_S = 30.0
RAY_CLUSTER = "training"
"""The long-lived RayCluster of k8s/charts/ray.py (RayClusterChart), where `trainctl submit` runs jobs."""

_DNS_SUFFIX = {"aws-cn": "amazonaws.com.cn"}


class ConnectError(Exception):
    """No API client: unknown environment, no AWS credentials, no such cluster, a bad kubeconfig."""


# --- the token --------------------------------------------------------------------------------


def sts_endpoint(session: Any, region: str) -> str:
    """The regional STS endpoint (never the global one, whatever AWS_STS_REGIONAL_ENDPOINTS says)."""
    try:
        partition = session.get_partition_for_region(region)
    except Exception:  # an unknown region: the commercial partition, as botocore assumes
        partition = "aws"
    return f"https://sts.{region}.{_DNS_SUFFIX.get(partition, 'amazonaws.com')}"


def eks_token(session: Any, region: str, cluster: str) -> str:
    """The bearer token `aws eks get-token --cluster-name CLUSTER --region REGION` prints."""
    from botocore.exceptions import BotoCoreError

    sts = session.client("sts", region_name=region, endpoint_url=sts_endpoint(session, region))

    def add_cluster_header(request: Any, **_: Any) -> None:
        request.headers[CLUSTER_ID_HEADER] = cluster

    sts.meta.events.register("before-sign.sts.GetCallerIdentity", add_cluster_header)
    try:
        url: str = sts.generate_presigned_url(
            "get_caller_identity", Params={}, ExpiresIn=PRESIGN_EXPIRES_S, HttpMethod="GET"
        )
    except BotoCoreError as exc:
        raise ConnectError(f"cannot sign an EKS token: {exc} (configure AWS credentials, e.g. AWS_PROFILE)") from None
    return TOKEN_PREFIX + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")


def decode_token(token: str) -> str:
    """The presigned URL inside a token (for tests and for debugging a refused token)."""
    if not token.startswith(TOKEN_PREFIX):
        raise ValueError(f"not an EKS token: it does not start with {TOKEN_PREFIX}")
    body = token.removeprefix(TOKEN_PREFIX)
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()


class TokenSource:
    """A token, renewed when older than `lifetime_s`; `refresh` is a Configuration.refresh_api_key_hook."""

    def __init__(
        self,
        make: Callable[[], str],
        *,
        lifetime_s: float = TOKEN_REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._make = make
        self._lifetime_s = lifetime_s
        self._clock = clock
        self._token: str | None = None
        self._made_at = 0.0

    def token(self) -> str:
        now = self._clock()
        if self._token is None or now - self._made_at >= self._lifetime_s:
            self._token = self._make()
            self._made_at = now
        return self._token

    def refresh(self, configuration: Any) -> None:
        configuration.api_key["BearerToken"] = self.token()


# --- the cluster ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterAccess:
    name: str
    region: str
    endpoint: str
    ca_data: str
    """certificateAuthority.data: the PEM of the cluster CA, base64-encoded."""


def describe_cluster(eks: Any, name: str, region: str) -> ClusterAccess:
    """Endpoint and CA of an EKS cluster (`eks` is a boto3 EKS client for `region`)."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    try:
        cluster = eks.describe_cluster(name=name)["cluster"]
    except NoCredentialsError:
        raise ConnectError(
            "no AWS credentials for eks:DescribeCluster: log in (e.g. aws sso login, AWS_PROFILE or --profile)"
        ) from None
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code == "ResourceNotFoundException":
            raise ConnectError(
                f"EKS cluster {name!r} not found in {region}: is the environment deployed "
                "(cdk deploy), or is the cluster named otherwise (--cluster)?"
            ) from None
        raise ConnectError(f"eks:DescribeCluster {name} in {region} failed: {exc}") from None
    except BotoCoreError as exc:
        raise ConnectError(f"eks:DescribeCluster {name} in {region} failed: {exc}") from None
    endpoint = cluster.get("endpoint")
    ca_data = (cluster.get("certificateAuthority") or {}).get("data")
    if not endpoint or not ca_data:
        raise ConnectError(
            f"EKS cluster {name!r} in {region} has no API endpoint yet (status {cluster.get('status', '?')}); "
            "wait until it is ACTIVE"
        )
    return ClusterAccess(name=name, region=region, endpoint=str(endpoint).rstrip("/"), ca_data=str(ca_data))


def _ca_file(ca_data: str) -> str:
    try:
        pem = base64.b64decode(ca_data, validate=True)
    except (binascii.Error, ValueError):
        raise ConnectError("the cluster's certificateAuthority.data is not base64") from None
    handle, path = tempfile.mkstemp(prefix="trainctl-ca-", suffix=".crt")
    with os.fdopen(handle, "wb") as file:
        file.write(pem)
    atexit.register(_remove, path)
    return path


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def api_client_for_eks(access: ClusterAccess, tokens: TokenSource) -> Any:
    """A kubernetes.client.ApiClient for the cluster, authenticated with the EKS token."""
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = access.endpoint
    if access.endpoint.startswith("https://"):
        configuration.ssl_ca_cert = _ca_file(access.ca_data)
    configuration.api_key = {"BearerToken": tokens.token()}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    configuration.refresh_api_key_hook = tokens.refresh
    return client.ApiClient(configuration)


def api_client_from_kubeconfig(path: Path, context: str | None) -> Any:
    """An ApiClient from a kubeconfig (its exec plugin, e.g. `aws eks get-token`, runs as kubectl runs it)."""
    from kubernetes import client, config

    if not path.is_file():
        raise ConnectError(f"kubeconfig {path} does not exist")
    configuration = client.Configuration()
    try:
        config.load_kube_config(
            config_file=str(path), context=context, client_configuration=configuration, persist_config=False
        )
    except (config.ConfigException, OSError, ValueError) as exc:
        raise ConnectError(f"kubeconfig {path}: {exc}") from None
    return client.ApiClient(configuration)


# --- the connection ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """Where a command works: the API client, the namespace and the Ray cluster in it."""

    api: Any
    namespace: str
    ray_cluster: str
    """'' selects any Ray cluster of the namespace."""
    where: str
    """For messages: 'EKS cluster ml-dev (us-west-2)' or 'kubeconfig ~/.kube/config'."""
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT_S
    flags: str = ""
    """The connection flags to repeat in a suggested command: '--env dev', '--kubeconfig FILE ...'."""


@dataclass(frozen=True)
class Connection:
    """What the connection flags say (trainctl.flags.add_connection): --env or --kubeconfig, and the rest."""

    env: str | None
    kubeconfig: Path | None
    context: str | None = None
    cluster: str | None = None
    profile: str | None = None
    endpoint_urls: Mapping[str, str] = field(default_factory=dict)
    """--endpoint-url: trainctl.aws.SERVICES keys ("eks", "*") to URLs."""
    namespace: str = RAY.name
    ray_cluster: str = RAY_CLUSTER
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT_S

    def flags(self) -> str:
        """The flags that select this cluster, namespace and Ray cluster again (for hints)."""
        if self.kubeconfig is not None:
            flags = [f"--kubeconfig {shlex.quote(str(self.kubeconfig))}"]
            flags += [f"--context {shlex.quote(self.context)}"] if self.context else []
        else:
            flags = [f"--env {self.env}"]
            flags += [f"--cluster {shlex.quote(self.cluster)}"] if self.cluster else []
            flags += [f"--profile {shlex.quote(self.profile)}"] if self.profile else []
            flags += [
                f"--endpoint-url {shlex.quote(url if key == '*' else f'{key}={url}')}"
                for key, url in self.endpoint_urls.items()
            ]
        if self.namespace != RAY.name:
            flags.append(f"--namespace {shlex.quote(self.namespace)}")
        if self.ray_cluster != RAY_CLUSTER:
            flags.append(f"--ray-cluster {shlex.quote(self.ray_cluster)}")
        return " ".join(flags)


def eks_api_client(
    region: str, cluster: str, *, profile: str | None = None, endpoint_urls: Mapping[str, str] | None = None
) -> Any:
    """The one EKS connection of every command: endpoint and CA from eks:DescribeCluster, the token signed
    with the same session. `endpoint_urls` (--endpoint-url, trainctl.aws.SERVICES keys) may send eks
    elsewhere; unset, boto3 picks the region's endpoint (or AWS_ENDPOINT_URL_EKS)."""
    import boto3
    from botocore.exceptions import BotoCoreError

    endpoints = endpoint_urls or {}
    try:
        session = boto3.Session(profile_name=profile, region_name=region)
        eks = session.client("eks", region_name=region, endpoint_url=endpoints.get("eks") or endpoints.get("*"))
    except BotoCoreError as exc:
        raise ConnectError(f"AWS session: {exc}") from None
    access = describe_cluster(eks, cluster, region)
    return api_client_for_eks(access, TokenSource(lambda: eks_token(session, region, cluster)))


def api_client(
    *,
    kubeconfig: Path | None,
    context: str | None,
    region: str,
    cluster: str,
    profile: str | None = None,
    endpoint_urls: Mapping[str, str] | None = None,
) -> Any:
    """The Kubernetes API client the connection flags describe: the kubeconfig's, or the EKS cluster's."""
    if kubeconfig is not None:
        return api_client_from_kubeconfig(kubeconfig, context)
    if context:
        raise ConnectError("--context goes with --kubeconfig")
    return eks_api_client(region, cluster, profile=profile, endpoint_urls=endpoint_urls)


def connect(connection: Connection) -> Target:
    """The Target the connection describes; ConnectError says why there is none."""
    c = connection
    if c.kubeconfig is not None:
        if c.cluster or c.profile or c.endpoint_urls:
            raise ConnectError("--cluster, --profile and --endpoint-url go with --env, not with --kubeconfig")
        api = api_client_from_kubeconfig(c.kubeconfig, c.context)
        return Target(api, c.namespace, c.ray_cluster, f"kubeconfig {c.kubeconfig}", c.request_timeout, c.flags())
    if c.env is None:
        raise ConnectError("no --env and no --kubeconfig: name one")
    environment = get_environment(c.env)  # trainctl.flags.add_env checked the name
    name = c.cluster or environment.cluster.name
    api = api_client(
        kubeconfig=None,
        context=c.context,
        region=environment.region,
        cluster=name,
        profile=c.profile,
        endpoint_urls=c.endpoint_urls,
    )
    return Target(
        api, c.namespace, c.ray_cluster, f"EKS cluster {name} ({environment.region})", c.request_timeout, c.flags()
    )
