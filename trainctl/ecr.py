"""Credentials for private Amazon ECR registries, for `trainctl pin`.

ECR answers the distribution API's 401 with a Basic challenge; the credential is the
`authorizationToken` of `ecr:GetAuthorizationToken` (base64 of `AWS:<password>`, valid 12 hours),
sent as `Authorization: Basic <token>`. One provider per registry host, cached until near expiry.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Iterable
from typing import Any

from trainctl.registry import CredentialProvider, ImageReference, UnauthorizedError

ECR_PRIVATE_HOST = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr(?:-fips)?\.(?P<region>[a-z]{2}(?:-[a-z]+)+-\d)\.amazonaws\.com(?:\.cn)?$"
)
# Renew this long before the token's own expiry.
_RENEW_BEFORE = datetime.timedelta(minutes=10)

EcrClientFactory = Callable[[str], Any]
"""Region -> a boto3 ECR client."""


def boto3_ecr_clients(*, profile: str | None = None, endpoint_url: str | None = None) -> EcrClientFactory:
    def make(region: str) -> Any:
        import boto3  # only when a private ECR image is in the lock

        return boto3.Session(profile_name=profile).client("ecr", region_name=region, endpoint_url=endpoint_url)

    return make


class EcrCredentials:
    """A CredentialProvider for the private registry of one account in one region."""

    def __init__(self, *, account: str, region: str, clients: EcrClientFactory) -> None:
        self.account = account
        self.region = region
        self._clients = clients
        self._value: str | None = None
        self._expires: datetime.datetime | None = None

    def __call__(self, ref: ImageReference) -> str | None:
        now = datetime.datetime.now(datetime.UTC)
        if self._value is not None and self._expires is not None and now < self._expires - _RENEW_BEFORE:
            return self._value
        try:
            answer = self._clients(self.region).get_authorization_token(registryIds=[self.account])
            data = answer["authorizationData"][0]
        except Exception as exc:  # boto3 raises many unrelated types (no credentials, denied, endpoint)
            raise UnauthorizedError(
                ref.reference,
                f"ecr:GetAuthorizationToken for account {self.account} in {self.region} failed: "
                f"{type(exc).__name__}: {exc}; configure AWS credentials allowed to pull from this registry "
                "(aws sso login, AWS_PROFILE) or pin by hand with --set",
            ) from exc
        self._value = f"Basic {data['authorizationToken']}"
        expires = data.get("expiresAt")
        self._expires = expires if isinstance(expires, datetime.datetime) else now + datetime.timedelta(hours=1)
        return self._value


def ecr_providers(hosts: Iterable[str], clients: EcrClientFactory) -> dict[str, CredentialProvider]:
    """A provider for every private ECR host among `hosts`; other hosts stay anonymous."""
    providers: dict[str, CredentialProvider] = {}
    for host in hosts:
        match = ECR_PRIVATE_HOST.match(host.lower())
        if match is not None:
            providers[host.lower()] = EcrCredentials(account=match["account"], region=match["region"], clients=clients)
    return providers
