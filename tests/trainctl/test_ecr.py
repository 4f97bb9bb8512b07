"""Private ECR for `trainctl pin`: the token from ecr:GetAuthorizationToken (moto in server mode on
loopback), sent as Basic credentials to a registry that demands them (the loopback registry)."""

from __future__ import annotations

import base64
import datetime
import json
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.trainctl.fake_aws import MotoServer
from tests.trainctl.fake_registry import FakeRegistry, make_image
from trainctl.ecr import ECR_PRIVATE_HOST, EcrCredentials, ecr_providers
from trainctl.pin import registry_credentials
from trainctl.registry import RegistryClient, UnauthorizedError, parse_reference

ACCOUNT = "123456789012"
HOST = f"{ACCOUNT}.dkr.ecr.us-east-2.amazonaws.com"


pytestmark = pytest.mark.usefixtures("fake_aws_credentials")


class CountingClients:
    """Region -> an ECR client on the moto server, counting the clients made."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.regions: list[str] = []

    def __call__(self, region: str) -> Any:
        self.regions.append(region)
        return boto3.Session().client("ecr", region_name=region, endpoint_url=self.url)


def test_only_private_ecr_hosts_get_a_provider(moto: MotoServer) -> None:
    hosts = [HOST, "public.ecr.aws", "nvcr.io", f"{ACCOUNT}.dkr.ecr-fips.us-gov-west-1.amazonaws.com"]
    providers = ecr_providers(hosts, CountingClients(moto.url))
    assert sorted(providers) == sorted([HOST, f"{ACCOUNT}.dkr.ecr-fips.us-gov-west-1.amazonaws.com"])
    provider = providers[HOST]
    assert isinstance(provider, EcrCredentials)
    assert (provider.account, provider.region) == (ACCOUNT, "us-east-2")
    assert ECR_PRIVATE_HOST.match("12345.dkr.ecr.us-east-2.amazonaws.com") is None  # not a 12-digit account


def test_token_is_basic_aws_credentials_and_is_cached_until_near_expiry(moto: MotoServer) -> None:
    clients = CountingClients(moto.url)
    provider = EcrCredentials(account=ACCOUNT, region="us-east-2", clients=clients)
    ref = parse_reference(f"{HOST}/trainer:v1")
    value = provider(ref)
    assert value is not None
    scheme, _, token = value.partition(" ")
    assert scheme == "Basic"
    assert base64.b64decode(token).decode().startswith("AWS:")
    # moto answers a fixed expiresAt in 2015: an expired token is fetched again on every call.
    assert provider(ref) == value
    assert clients.regions == ["us-east-2", "us-east-2"]
    # A token valid for hours (as ECR's 12 h ones) is served from the cache.
    provider._expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=12)
    assert provider(ref) == value
    assert clients.regions == ["us-east-2", "us-east-2"]


def test_the_token_authorizes_a_registry_that_demands_basic_credentials(moto: MotoServer) -> None:
    provider = EcrCredentials(account=ACCOUNT, region="us-east-2", clients=CountingClients(moto.url))
    registry = FakeRegistry(auth="basic").start()
    try:
        # The registry accepts exactly what ECR handed out, as ECR's registry does.
        credential = provider(parse_reference(f"{HOST}/trainer:v1"))
        assert credential is not None
        registry.basic_credential = credential
        image = registry.push("trainer", "v1", make_image("trainer"))
        client = RegistryClient(timeout=5.0, allow_insecure_loopback=True, credentials={registry.host: provider})
        assert client.resolve_digest(registry.ref("trainer", "v1")) == image.digest
        anonymous = RegistryClient(timeout=5.0, allow_insecure_loopback=True)
        with pytest.raises(UnauthorizedError, match="asks for Basic credentials"):
            anonymous.resolve_digest(registry.ref("trainer", "v1"))
    finally:
        registry.stop()


def test_failed_authorization_names_the_account_region_and_fix(tmp_path: Path) -> None:
    # Nothing listens on the endpoint: the call fails, the error says what to do.
    def clients(region: str) -> Any:
        return boto3.Session().client("ecr", region_name=region, endpoint_url="http://127.0.0.1:9")

    provider = EcrCredentials(account=ACCOUNT, region="us-east-2", clients=clients)
    with pytest.raises(UnauthorizedError, match=rf"GetAuthorizationToken for account {ACCOUNT} in us-east-2.*--set"):
        provider(parse_reference(f"{HOST}/trainer:v1"))


def test_pin_builds_providers_from_the_lock_hosts(tmp_path: Path, moto: MotoServer) -> None:
    lock = tmp_path / "images.lock.json"
    images = {
        "private": {"reference": f"{HOST}/trainer:v1", "digest": None, "purpose": "x"},
        "public": {"reference": "public.ecr.aws/x/y:v1", "digest": None, "purpose": "y"},
    }
    lock.write_text(json.dumps({"version": 1, "images": images}))
    assert list(registry_credentials(lock, CountingClients(moto.url))) == [HOST]
    lock.write_text("{not json")
    assert registry_credentials(lock, CountingClients(moto.url)) == {}
