"""The EKS token (checked against an independent SigV4 computation), eks:DescribeCluster through moto
in server mode on 127.0.0.1, and a kubernetes ApiClient that presents the token to an API server."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

import boto3
import pytest

from tests.trainctl.fake_aws import MotoServer
from tests.trainctl.fake_kube import FakeKube
from tests.trainctl.fake_ray import HEAD_LABELS, FakeRayHead
from trainctl.cli import main
from trainctl.eks_auth import (
    CLUSTER_ID_HEADER,
    TOKEN_PREFIX,
    ClusterAccess,
    ConnectError,
    Connection,
    Target,
    TokenSource,
    api_client_for_eks,
    connect,
    decode_token,
    describe_cluster,
    eks_token,
)
from trainctl.exit_codes import ExitCode
from trainctl.status import collect

ACCESS_KEY = "AKIDTRAINCTLTEST0001"
SECRET_KEY = "trainctl/test/secret/key/not/a/real/one"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def session(region: str = "us-west-2") -> Any:
    return boto3.Session(aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY, region_name=region)


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def sigv4_query_signature(url: str, secret: str, headers: dict[str, str]) -> str:
    """The SigV4 signature of a presigned GET, computed here from the AWS specification, not by botocore."""
    parts = urlsplit(url)
    params = dict(parse_qsl(parts.query, keep_blank_values=True))
    params.pop("X-Amz-Signature")
    canonical_query = "&".join(
        f"{quote(key, safe='-_.~')}={quote(value, safe='-_.~')}" for key, value in sorted(params.items())
    )
    signed = params["X-Amz-SignedHeaders"].split(";")
    canonical_headers = "".join(f"{name}:{headers[name].strip()}\n" for name in signed)
    canonical_request = "\n".join(["GET", parts.path or "/", canonical_query, canonical_headers, ";".join(signed)])
    canonical_request += "\n" + EMPTY_SHA256
    amz_date = params["X-Amz-Date"]
    _, date, region, service, terminator = params["X-Amz-Credential"].split("/")
    scope = f"{date}/{region}/{service}/{terminator}"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical_request.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(f"AWS4{secret}".encode(), date), region), service), terminator)
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


# --- the token ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("region", "cluster"), [("us-west-2", "ml-dev"), ("us-east-2", "ml-prod")])
def test_token_is_a_presigned_regional_get_caller_identity_signed_with_the_cluster_header(
    region: str, cluster: str
) -> None:
    token = eks_token(session(region), region, cluster)
    assert token.startswith(TOKEN_PREFIX)
    body = token.removeprefix(TOKEN_PREFIX)
    assert "=" not in body, "the base64 must be unpadded"
    assert re.fullmatch(r"[A-Za-z0-9_-]+", body), "the base64 must be URL-safe"
    url = decode_token(token)
    parts = urlsplit(url)
    params = dict(parse_qsl(parts.query, keep_blank_values=True))
    assert (parts.scheme, parts.netloc, parts.path or "/") == ("https", f"sts.{region}.amazonaws.com", "/")
    assert params["Action"] == "GetCallerIdentity"
    assert params["Version"] == "2011-06-15"
    assert params["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256"
    assert params["X-Amz-Expires"] == "60"
    assert params["X-Amz-SignedHeaders"].split(";") == ["host", CLUSTER_ID_HEADER]
    assert re.fullmatch(r"\d{8}T\d{6}Z", params["X-Amz-Date"])
    assert params["X-Amz-Credential"] == f"{ACCESS_KEY}/{params['X-Amz-Date'][:8]}/{region}/sts/aws4_request"
    assert re.fullmatch(r"[0-9a-f]{64}", params["X-Amz-Signature"])
    # The signature is valid for exactly this cluster name: what EKS checks by replaying the URL to STS.
    headers = {"host": parts.netloc, CLUSTER_ID_HEADER: cluster}
    assert params["X-Amz-Signature"] == sigv4_query_signature(url, SECRET_KEY, headers)
    assert params["X-Amz-Signature"] != sigv4_query_signature(url, SECRET_KEY, {**headers, CLUSTER_ID_HEADER: "other"})


def test_token_without_credentials_is_a_clear_connect_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(ConnectError, match="AWS credentials"):
        eks_token(boto3.Session(region_name="us-west-2"), "us-west-2", "ml-dev")


def test_token_source_renews_after_its_lifetime() -> None:
    now = [0.0]
    made: list[str] = []

    def make() -> str:
        made.append(f"token-{len(made)}")
        return made[-1]

    tokens = TokenSource(make, lifetime_s=600, clock=lambda: now[0])
    assert tokens.token() == tokens.token() == "token-0"
    now[0] = 599.0
    assert tokens.token() == "token-0"
    now[0] = 600.0
    configuration: Any = type("Configuration", (), {"api_key": {}})()
    tokens.refresh(configuration)
    assert configuration.api_key == {"BearerToken": "token-1"}


# --- describe_cluster through moto in server mode -------------------------------------------------


def eks_client(url: str, region: str = "us-west-2") -> Any:
    return session(region).client("eks", region_name=region, endpoint_url=url)


def test_describe_cluster_reads_endpoint_and_ca_from_eks(moto: MotoServer) -> None:
    eks = eks_client(moto.url)
    eks.create_cluster(name="ml-dev", roleArn="arn:aws:iam::123456789012:role/eks", resourcesVpcConfig={})
    created = eks.describe_cluster(name="ml-dev")["cluster"]
    access = describe_cluster(eks, "ml-dev", "us-west-2")
    assert access.endpoint == created["endpoint"].rstrip("/")
    assert access.endpoint.startswith("https://")
    assert access.endpoint.endswith(".us-west-2.eks.amazonaws.com")
    assert access.ca_data == created["certificateAuthority"]["data"]

    tokens = TokenSource(lambda: eks_token(session(), "us-west-2", "ml-dev"))
    api = api_client_for_eks(access, tokens)
    try:
        configuration = api.configuration
        assert configuration.host == access.endpoint
        assert Path(configuration.ssl_ca_cert).read_bytes() == base64.b64decode(access.ca_data)
        assert configuration.auth_settings()["BearerToken"]["value"] == f"Bearer {tokens.token()}"
    finally:
        api.close()


def test_describe_cluster_that_does_not_exist_says_which_and_where(moto: MotoServer) -> None:
    with pytest.raises(ConnectError, match=r"EKS cluster 'ml-nowhere' not found in us-west-2.*--cluster"):
        describe_cluster(eks_client(moto.url), "ml-nowhere", "us-west-2")


def test_cli_env_maps_to_region_and_cluster_name(moto: MotoServer, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """--env prod: eks:DescribeCluster of ml-prod in us-east-2 (moto has none there: a clear exit 2)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_ENDPOINT_URL_EKS", moto.url)
    code = main(["status", "--env", "prod"])
    err = capsys.readouterr().err
    assert code == ExitCode.ERROR
    assert "EKS cluster 'ml-prod' not found in us-east-2" in err
    code = main(["status", "--env", "prod", "--cluster", "ml-prod-blue"])
    assert code == ExitCode.ERROR
    assert "EKS cluster 'ml-prod-blue' not found in us-east-2" in capsys.readouterr().err


# --- the token on the wire ------------------------------------------------------------------------


def test_api_client_presents_the_eks_token_to_the_api_server(moto: MotoServer) -> None:
    """A client built as --env builds it (moto's DescribeCluster, a signed token), pointed at a loopback API server."""
    eks = eks_client(moto.url)
    if "ml-dev" not in eks.list_clusters()["clusters"]:
        eks.create_cluster(name="ml-dev", roleArn="arn:aws:iam::123456789012:role/eks", resourcesVpcConfig={})
    described = describe_cluster(eks, "ml-dev", "us-west-2")
    kube = FakeKube().start()
    try:
        kube.add_pod("training-head-x8k2p", labels=HEAD_LABELS)
        FakeRayHead(kube).add_job("trainctl-a", "SUCCEEDED")
        tokens = TokenSource(lambda: eks_token(session(), "us-west-2", "ml-dev"))
        access = ClusterAccess(described.name, described.region, kube.url, described.ca_data)
        api = api_client_for_eks(access, tokens)
        try:
            report = collect(Target(api, "ray", "training", "test"))
        finally:
            api.close()
    finally:
        kube.stop()
    assert report.errors == []
    assert report.jobs is not None
    assert report.jobs[0].submission_id == "trainctl-a"
    # Every request, the exec WebSocket upgrade included, carried the generated token.
    assert kube.authorizations() == {f"Bearer {tokens.token()}"}
    assert {call.authorization for call in kube.execs} == {f"Bearer {tokens.token()}"}
    url = decode_token(tokens.token())
    assert "X-Amz-SignedHeaders=host%3Bx-k8s-aws-id" in url
    assert json.dumps(report.to_json())  # serialisable


def test_a_connection_repeats_its_flags_and_refuses_aws_options_beside_a_kubeconfig(tmp_path: Path) -> None:
    eks = Connection(env="dev", kubeconfig=None, profile="ops", endpoint_urls={"eks": "http://127.0.0.1:5000"})
    assert eks.flags() == "--env dev --profile ops --endpoint-url eks=http://127.0.0.1:5000"
    kubeconfig = tmp_path / "kubeconfig"
    with pytest.raises(ConnectError, match="--cluster, --profile and --endpoint-url go with --env"):
        connect(Connection(env=None, kubeconfig=kubeconfig, endpoint_urls={"*": "http://127.0.0.1:5000"}))
