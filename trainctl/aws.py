"""The AWS client of trainctl: every AWS call any command makes is a method of `Aws` (one boto3 Session, a client per
service) or of its subclass trainctl.deployed_stacks.StackReads (`plan`); nothing else calls boto3 for a service API
(trainctl.eks_auth makes the EKS connection's token and DescribeCluster, trainctl.ecr the ECR login token for `pin`).

Every method is one API call (all pages of it where the API pages) and returns the dicts boto3 returns; judging them
is the caller's job (trainctl.preflight, capacity, scale). Only the reservation create and cancel and the node group
update change anything. Every failure becomes an AwsError whose `kind` says what went wrong: no credentials, an
endpoint that cannot be reached, access denied, a resource that does not exist, an API the installed botocore does
not know, or any other service error. Nothing here raises a botocore exception.

`endpoint_urls` sends a service (one of SERVICES, or "*" for all of them) to another endpoint, e.g. an emulator on
127.0.0.1; unset, boto3 picks the region's endpoint. An endpoint that could not be reached once is not tried again:
later calls to it fail at once.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any

# boto3 and botocore load in about 0.6 s: imported where a call is made, so `trainctl --help` and the
# subcommands that never call AWS do not pay for them.

SERVICES = ("ec2", "eks", "service-quotas", "iam", "sts", "logs", "fsx", "cloudformation")
ALL_SERVICES = "*"

# Service Quotas codes of the On-Demand vCPU quotas (service code "ec2").
QUOTA_SERVICE_CODE = "ec2"

# The tag CDK puts on PRIVATE_WITH_EGRESS subnets (infra/network.py builds them).
CDK_SUBNET_TYPE_TAG = "aws-cdk:subnet-type"
CDK_PRIVATE_SUBNET_TYPE = "Private"
# EKS managed node groups tag their instances with the cluster's name.
EKS_CLUSTER_NAME_TAG = "eks:cluster-name"


class ErrorKind(StrEnum):
    NO_CREDENTIALS = "no-credentials"
    INVALID_CREDENTIALS = "invalid-credentials"
    UNREACHABLE = "unreachable"
    ACCESS_DENIED = "access-denied"
    NOT_FOUND = "not-found"
    UNSUPPORTED = "unsupported"
    API_ERROR = "api-error"


_ACCESS_DENIED = frozenset(
    {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "UnauthorizedAccess", "OptInRequired"}
)
_INVALID_CREDENTIALS = frozenset(
    {
        "AuthFailure",
        "UnrecognizedClientException",
        "InvalidClientTokenId",
        "ExpiredToken",
        "ExpiredTokenException",
        "RequestExpired",
        "SignatureDoesNotMatch",
        "InvalidSignatureException",
    }
)
_NOT_FOUND = frozenset(
    {"NoSuchResourceException", "ResourceNotFoundException", "InvalidInstanceType", "NoSuchEntity", "NotFoundException"}
)


@functools.cache
def _service_models() -> Any:
    """One botocore loader per process: it caches the service models (JSON) it has read, which each new Session
    would otherwise read and decode again."""
    import botocore.loaders

    return botocore.loaders.create_loader()


def _botocore_session() -> Any:
    import botocore.session

    session = botocore.session.get_session()
    session.register_component("data_loader", _service_models())
    return session


class AwsError(Exception):
    """One failed call: `api` is e.g. ec2:DescribeCapacityReservations, `code` the AWS error code if any."""

    def __init__(self, kind: ErrorKind, api: str, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.api = api
        self.code = code


def classify(exc: Exception, api: str) -> AwsError:
    """The AwsError for what boto3 raised while calling `api`."""
    if isinstance(exc, AwsError):
        return exc
    import botocore.exceptions

    if isinstance(
        exc,
        botocore.exceptions.NoCredentialsError
        | botocore.exceptions.PartialCredentialsError
        | botocore.exceptions.CredentialRetrievalError,
    ):
        return AwsError(ErrorKind.NO_CREDENTIALS, api, f"no usable AWS credentials: {exc}")
    if isinstance(exc, botocore.exceptions.ConnectionError | botocore.exceptions.HTTPClientError):
        return AwsError(ErrorKind.UNREACHABLE, api, f"endpoint unreachable: {exc}")
    if isinstance(exc, botocore.exceptions.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", "Unknown"))
        message = str(error.get("Message") or exc)
        # CloudFormation answers a stack that does not exist with ValidationError "Stack with id X does not exist".
        missing_stack = code == "ValidationError" and message.endswith(" does not exist")
        if code in _ACCESS_DENIED:
            kind = ErrorKind.ACCESS_DENIED
        elif code in _INVALID_CREDENTIALS:
            kind = ErrorKind.INVALID_CREDENTIALS
        elif code in _NOT_FOUND or code.endswith((".NotFound", ".Malformed")) or missing_stack:
            kind = ErrorKind.NOT_FOUND
        else:
            kind = ErrorKind.API_ERROR
        return AwsError(kind, api, f"{code}: {message}", code)
    if isinstance(exc, botocore.exceptions.ParamValidationError | botocore.exceptions.OperationNotPageableError):
        return AwsError(ErrorKind.UNSUPPORTED, api, f"the installed botocore cannot make this call: {exc}")
    if isinstance(exc, botocore.exceptions.BotoCoreError):
        return AwsError(ErrorKind.API_ERROR, api, str(exc))
    raise exc


class Aws:
    """Calls against one region; clients are made on first use, credentials resolved once."""

    def __init__(
        self,
        *,
        region: str,
        profile: str | None = None,
        endpoint_urls: Mapping[str, str] | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        max_attempts: int = 3,
        session: Any = None,
    ) -> None:
        """`session`: a boto3 Session to reuse (its loaded service models too); default: a new one for
        `profile`. Credentials are resolved on the first call, once."""
        unknown = set(endpoint_urls or {}) - {*SERVICES, ALL_SERVICES}
        if unknown:
            raise ValueError(f"endpoint for unknown service(s) {sorted(unknown)}; known: {', '.join(SERVICES)}")
        self.region = region
        self.profile = profile
        self.endpoint_urls = dict(endpoint_urls or {})
        import botocore.config

        self._config = botocore.config.Config(
            region_name=region,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"max_attempts": max_attempts, "mode": "standard"},
            user_agent_extra="trainctl-preflight",
        )
        self._given_session: Any = session
        self._session: Any = None
        self._session_error: AwsError | None = None
        self._clients: dict[str, Any] = {}
        self._unreachable: dict[str, AwsError] = {}

    # --- plumbing ---------------------------------------------------------------------------

    def _get_session(self, api: str) -> Any:
        if self._session_error is not None:
            first = self._session_error
            raise AwsError(first.kind, api, str(first), first.code)
        if self._session is None:
            import boto3
            import botocore.exceptions

            try:
                session = self._given_session or boto3.session.Session(
                    botocore_session=_botocore_session(), profile_name=self.profile, region_name=self.region
                )
                credentials = session.get_credentials()
            except botocore.exceptions.ProfileNotFound as exc:
                self._session_error = AwsError(ErrorKind.NO_CREDENTIALS, api, str(exc))
                raise self._session_error from None
            except botocore.exceptions.BotoCoreError as exc:
                self._session_error = classify(exc, api)
                raise self._session_error from None
            if credentials is None:
                self._session_error = AwsError(
                    ErrorKind.NO_CREDENTIALS,
                    api,
                    "no AWS credentials found (environment, shared credentials/config files, SSO, instance role)",
                )
                raise self._session_error
            self._session = session
        return self._session

    def _client(self, service: str, api: str) -> Any:
        if service not in self._clients:
            endpoint = self.endpoint_urls.get(service) or self.endpoint_urls.get(ALL_SERVICES)
            self._clients[service] = self._get_session(api).client(service, config=self._config, endpoint_url=endpoint)
        return self._clients[service]

    def _invoke(self, service: str, operation: str, api: str, **params: Any) -> list[dict[str, Any]]:
        """All pages of one operation (a one-element list where the operation does not page)."""
        if service in self._unreachable:
            cause = self._unreachable[service]
            raise AwsError(ErrorKind.UNREACHABLE, api, f"{cause} (not retried)")
        try:
            client = self._client(service, api)
            if client.can_paginate(operation):
                return [dict(page) for page in client.get_paginator(operation).paginate(**params)]
            method = getattr(client, operation, None)
            if method is None:
                import botocore

                raise AwsError(
                    ErrorKind.UNSUPPORTED,
                    api,
                    f"the installed botocore {botocore.__version__} does not know {api}; upgrade boto3",
                )
            return [dict(method(**params))]
        except Exception as exc:
            error = classify(exc, api)
            if error.kind is ErrorKind.UNREACHABLE:
                self._unreachable[service] = error
            raise error from None

    # --- EC2 --------------------------------------------------------------------------------

    def offered_instance_types(self, availability_zone: str, instance_types: Sequence[str]) -> set[str]:
        """Which of `instance_types` EC2 offers in `availability_zone`."""
        pages = self._invoke(
            "ec2",
            "describe_instance_type_offerings",
            "ec2:DescribeInstanceTypeOfferings",
            LocationType="availability-zone",
            Filters=[
                {"Name": "location", "Values": [availability_zone]},
                {"Name": "instance-type", "Values": list(instance_types)},
            ],
        )
        return {o["InstanceType"] for page in pages for o in page.get("InstanceTypeOfferings", [])}

    def instance_type_info(self, instance_type: str) -> dict[str, Any] | None:
        """The InstanceTypeInfo of one type; None if the region does not know the type."""
        try:
            pages = self._invoke(
                "ec2", "describe_instance_types", "ec2:DescribeInstanceTypes", InstanceTypes=[instance_type]
            )
        except AwsError as exc:
            if exc.kind is ErrorKind.NOT_FOUND:
                return None
            raise
        infos = [info for page in pages for info in page.get("InstanceTypes", [])]
        return next((dict(i) for i in infos if i.get("InstanceType") == instance_type), None)

    def capacity_reservation(self, reservation_id: str) -> dict[str, Any] | None:
        """One Capacity Reservation or Capacity Block; None if this account cannot see it in the region."""
        try:
            pages = self._invoke(
                "ec2",
                "describe_capacity_reservations",
                "ec2:DescribeCapacityReservations",
                CapacityReservationIds=[reservation_id],
            )
        except AwsError as exc:
            if exc.kind is ErrorKind.NOT_FOUND:
                return None
            raise
        found = [r for page in pages for r in page.get("CapacityReservations", [])]
        return next((dict(r) for r in found if r.get("CapacityReservationId") == reservation_id), None)

    def vpcs_tagged(self, key: str, value: str) -> list[dict[str, Any]]:
        pages = self._invoke(
            "ec2", "describe_vpcs", "ec2:DescribeVpcs", Filters=[{"Name": f"tag:{key}", "Values": [value]}]
        )
        return [dict(v) for page in pages for v in page.get("Vpcs", [])]

    def private_subnets(self, vpc_id: str) -> list[dict[str, Any]]:
        """The subnets CDK built as PRIVATE_WITH_EGRESS in the VPC."""
        pages = self._invoke(
            "ec2",
            "describe_subnets",
            "ec2:DescribeSubnets",
            Filters=[
                {"Name": "vpc-id", "Values": [vpc_id]},
                {"Name": f"tag:{CDK_SUBNET_TYPE_TAG}", "Values": [CDK_PRIVATE_SUBNET_TYPE]},
            ],
        )
        return [dict(s) for page in pages for s in page.get("Subnets", [])]

    def cluster_instances(self, subnet_id: str, cluster_name: str) -> list[dict[str, Any]]:
        """Pending or running instances of the EKS cluster's node groups in one subnet."""
        pages = self._invoke(
            "ec2",
            "describe_instances",
            "ec2:DescribeInstances",
            Filters=[
                {"Name": "subnet-id", "Values": [subnet_id]},
                {"Name": f"tag:{EKS_CLUSTER_NAME_TAG}", "Values": [cluster_name]},
                {"Name": "instance-state-name", "Values": ["pending", "running"]},
            ],
        )
        return [dict(i) for page in pages for r in page.get("Reservations", []) for i in r.get("Instances", [])]

    # --- Service Quotas ---------------------------------------------------------------------

    def service_quota(self, quota_code: str) -> dict[str, Any]:
        """The applied value of an EC2 quota; the AWS default where none was ever applied."""
        try:
            pages = self._invoke(
                "service-quotas",
                "get_service_quota",
                "servicequotas:GetServiceQuota",
                ServiceCode=QUOTA_SERVICE_CODE,
                QuotaCode=quota_code,
            )
        except AwsError as exc:
            if exc.kind is not ErrorKind.NOT_FOUND:
                raise
            pages = self._invoke(
                "service-quotas",
                "get_aws_default_service_quota",
                "servicequotas:GetAWSDefaultServiceQuota",
                ServiceCode=QUOTA_SERVICE_CODE,
                QuotaCode=quota_code,
            )
        return dict(pages[0]["Quota"])

    # --- EKS --------------------------------------------------------------------------------

    def cluster_versions(self, version: str) -> list[dict[str, Any]]:
        """What EKS says about one Kubernetes version in the region (empty: EKS does not offer it)."""
        pages = self._invoke(
            "eks",
            "describe_cluster_versions",
            "eks:DescribeClusterVersions",
            clusterVersions=[version],
            includeAll=True,
        )
        return [dict(v) for page in pages for v in page.get("clusterVersions", [])]

    def addon_versions(self, addon_name: str, kubernetes_version: str) -> list[str]:
        """Versions of one EKS add-on that EKS offers for clusters of `kubernetes_version`."""
        pages = self._invoke(
            "eks",
            "describe_addon_versions",
            "eks:DescribeAddonVersions",
            addonName=addon_name,
            kubernetesVersion=kubernetes_version,
        )
        versions: list[str] = []
        for page in pages:
            for addon in page.get("addons", []):
                if addon.get("addonName") != addon_name:
                    continue
                for info in addon.get("addonVersions", []):
                    clusters = {c.get("clusterVersion") for c in info.get("compatibilities", [])}
                    if not clusters or kubernetes_version in clusters:
                        versions.append(str(info["addonVersion"]))
        return versions

    # --- IAM and STS: the cluster's admin principals -------------------------------------------

    def caller_account(self) -> str:
        """The account the credentials belong to (where a role name in admin_principals resolves)."""
        pages = self._invoke("sts", "get_caller_identity", "sts:GetCallerIdentity")
        return str(pages[0]["Account"])

    def iam_role(self, name: str) -> dict[str, Any] | None:
        """The caller's account's role `name` (no path); None if there is none."""
        return self._one_or_none("iam", "get_role", "iam:GetRole", "Role", RoleName=name)

    def iam_user(self, name: str) -> dict[str, Any] | None:
        return self._one_or_none("iam", "get_user", "iam:GetUser", "User", UserName=name)

    def _one_or_none(self, service: str, operation: str, api: str, key: str, **params: Any) -> dict[str, Any] | None:
        try:
            pages = self._invoke(service, operation, api, **params)
        except AwsError as exc:
            if exc.kind is ErrorKind.NOT_FOUND:
                return None
            raise
        return dict(pages[0][key])

    # --- what a previous deployment may have left behind -----------------------------------------

    def log_group(self, name: str) -> dict[str, Any] | None:
        """The CloudWatch Logs group of exactly this name; None if there is none."""
        pages = self._invoke("logs", "describe_log_groups", "logs:DescribeLogGroups", logGroupNamePrefix=name)
        found = [g for page in pages for g in page.get("logGroups", []) if g.get("logGroupName") == name]
        return dict(found[0]) if found else None

    def file_systems_tagged(self, key: str, value: str) -> list[dict[str, Any]]:
        """FSx file systems carrying tag key=value (DescribeFileSystems has no tag filter: all, then filtered)."""
        pages = self._invoke("fsx", "describe_file_systems", "fsx:DescribeFileSystems")
        return [
            dict(fs)
            for page in pages
            for fs in page.get("FileSystems", [])
            if any(t.get("Key") == key and t.get("Value") == value for t in fs.get("Tags", []))
        ]

    def eks_cluster(self, name: str) -> dict[str, Any] | None:
        return self._one_or_none("eks", "describe_cluster", "eks:DescribeCluster", "cluster", name=name)

    def eks_nodegroup(self, cluster_name: str, nodegroup_name: str) -> dict[str, Any] | None:
        return self._one_or_none(
            "eks",
            "describe_nodegroup",
            "eks:DescribeNodegroup",
            "nodegroup",
            clusterName=cluster_name,
            nodegroupName=nodegroup_name,
        )

    def stack_resources(self, stack_name: str) -> list[dict[str, Any]] | None:
        """Every resource of a CloudFormation stack (all pages); None if no stack of that name exists.

        A deleted stack is not found by name; a stack rolled back after its first create still is, in
        ROLLBACK_COMPLETE, with its resources DELETE_COMPLETE (or DELETE_SKIPPED where retained)."""
        try:
            pages = self._invoke(
                "cloudformation", "list_stack_resources", "cloudformation:ListStackResources", StackName=stack_name
            )
        except AwsError as exc:
            if exc.kind is ErrorKind.NOT_FOUND:
                return None
            raise
        return [dict(r) for page in pages for r in page.get("StackResourceSummaries", [])]

    # --- capacity and scaling (trainctl capacity, trainctl scale) -------------------------------
    # Unlike the reads above, create_capacity_reservation, cancel_capacity_reservation and
    # update_nodegroup_scaling change things (and the first one costs money).

    def availability_zones(self) -> list[dict[str, Any]]:
        """The region's availability zones (not Local or Wavelength Zones), with ZoneName and ZoneId."""
        pages = self._invoke(
            "ec2",
            "describe_availability_zones",
            "ec2:DescribeAvailabilityZones",
            Filters=[{"Name": "zone-type", "Values": ["availability-zone"]}],
        )
        return [dict(z) for page in pages for z in page.get("AvailabilityZones", [])]

    def running_vcpus(self, type_prefixes: Sequence[str]) -> int:
        """vCPUs of the pending and running instances whose type starts with one of `type_prefixes`
        (what counts against an On-Demand vCPU quota; Spot instances have their own quotas)."""
        pages = self._invoke(
            "ec2",
            "describe_instances",
            "ec2:DescribeInstances",
            Filters=[
                {"Name": "instance-type", "Values": [f"{prefix}*" for prefix in type_prefixes]},
                {"Name": "instance-state-name", "Values": ["pending", "running"]},
            ],
        )
        total = 0
        for page in pages:
            for reservation in page.get("Reservations", []):
                for instance in reservation.get("Instances", []):
                    if instance.get("InstanceLifecycle") == "spot":
                        continue
                    cpu = instance.get("CpuOptions", {})
                    total += int(cpu.get("CoreCount", 0)) * int(cpu.get("ThreadsPerCore", 1))
        return total

    def spot_placement_scores(self, instance_type: str, count: int, regions: Sequence[str]) -> list[dict[str, Any]]:
        """Per-AZ scores (1-10) for `count` Spot instances of one type; entries carry AvailabilityZoneId, not the
        zone's name. A recommendation only: "No score guarantees that your Spot request will be fully or
        partially fulfilled" (EC2 API reference, GetSpotPlacementScores)."""
        pages = self._invoke(
            "ec2",
            "get_spot_placement_scores",
            "ec2:GetSpotPlacementScores",
            InstanceTypes=[instance_type],
            TargetCapacity=count,
            TargetCapacityUnitType="units",
            SingleAvailabilityZone=True,
            RegionNames=list(regions),
        )
        return [dict(s) for page in pages for s in page.get("SpotPlacementScores", [])]

    def create_capacity_reservation(
        self,
        *,
        instance_type: str,
        availability_zone: str,
        count: int,
        end_date: Any,
        client_token: str,
        tags: Mapping[str, str],
    ) -> dict[str, Any]:
        """An On-Demand Capacity Reservation, billed from the moment it is active until cancelled.

        EndDateType limited: EC2 cancels it within an hour after `end_date` even if nobody does
        (CreateCapacityReservation, EndDate). InstanceMatchCriteria targeted: no instance of the
        account lands in it by accident. `client_token` makes a retried request idempotent, so a
        timed-out first attempt cannot leave a second reservation behind."""
        pages = self._invoke(
            "ec2",
            "create_capacity_reservation",
            "ec2:CreateCapacityReservation",
            InstanceType=instance_type,
            InstancePlatform="Linux/UNIX",
            AvailabilityZone=availability_zone,
            InstanceCount=count,
            InstanceMatchCriteria="targeted",
            EndDateType="limited",
            EndDate=end_date,
            ClientToken=client_token,
            TagSpecifications=[
                {
                    "ResourceType": "capacity-reservation",
                    "Tags": [{"Key": key, "Value": value} for key, value in tags.items()],
                }
            ],
        )
        return dict(pages[0]["CapacityReservation"])

    def cancel_capacity_reservation(self, reservation_id: str) -> bool:
        pages = self._invoke(
            "ec2",
            "cancel_capacity_reservation",
            "ec2:CancelCapacityReservation",
            CapacityReservationId=reservation_id,
        )
        return bool(pages[0].get("Return"))

    def describe_nodegroup(self, cluster: str, nodegroup: str) -> dict[str, Any]:
        pages = self._invoke(
            "eks", "describe_nodegroup", "eks:DescribeNodegroup", clusterName=cluster, nodegroupName=nodegroup
        )
        return dict(pages[0]["nodegroup"])

    def update_nodegroup_scaling(
        self, cluster: str, nodegroup: str, *, min_size: int, max_size: int, desired_size: int
    ) -> dict[str, Any]:
        """eks:UpdateNodegroupConfig with a new scalingConfig; the update (id, status) to follow (describe_update)."""
        pages = self._invoke(
            "eks",
            "update_nodegroup_config",
            "eks:UpdateNodegroupConfig",
            clusterName=cluster,
            nodegroupName=nodegroup,
            scalingConfig={"minSize": min_size, "maxSize": max_size, "desiredSize": desired_size},
        )
        return dict(pages[0]["update"])

    def describe_update(self, cluster: str, nodegroup: str, update_id: str) -> dict[str, Any]:
        """One node group update: status InProgress, Successful, Failed or Cancelled, and its errors."""
        pages = self._invoke(
            "eks",
            "describe_update",
            "eks:DescribeUpdate",
            name=cluster,
            nodegroupName=nodegroup,
            updateId=update_id,
        )
        return dict(pages[0]["update"])


PROBE_TAG = "trainctl:capacity-probe"
"""Tag key on the reservations `trainctl capacity --probe` creates (value: the environment)."""


# The module-level names these methods had before they were methods (Aws.availability_zones(aws) is
# availability_zones(aws)), for callers written against them.
availability_zones = Aws.availability_zones
running_vcpus = Aws.running_vcpus
spot_placement_scores = Aws.spot_placement_scores
create_capacity_reservation = Aws.create_capacity_reservation
cancel_capacity_reservation = Aws.cancel_capacity_reservation
describe_nodegroup = Aws.describe_nodegroup
update_nodegroup_scaling = Aws.update_nodegroup_scaling
describe_update = Aws.describe_update
