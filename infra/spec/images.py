"""The NVRx job's image, built from images/nvrx/Dockerfile per environment (by the `<env>/Images` stack's CodeBuild
project, infra/images.py, or with Docker by scripts/build_nvrx_image.sh), and whether an environment lets the job
install NVRx at pod start instead.

The image tag is derived from the Dockerfile's directory (the build context), so a changed Dockerfile is a new,
immutable tag, and the same Dockerfile is the same tag in every environment (docs/deploy.md, "The NVRx image").
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from infra.spec.errors import ConfigError

NVRX_CONTEXT = Path(__file__).resolve().parents[2] / "images" / "nvrx"
NVRX_PACKAGE_NAME = "nvrx-train"


def context_tag(context: Path = NVRX_CONTEXT) -> str:
    """`nvrx-<12 hex>`: a hash of every file of the build context (names and bytes, sorted)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        digest.update(path.relative_to(context).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return f"nvrx-{digest.hexdigest()[:12]}"


@dataclass(frozen=True, kw_only=True)
class NvrxImageConfig:
    """Per environment: whether the NVRx job may install NVRx at pod start instead of using the built image."""

    # An explicit opt-in for a first try before the image is built (k8s/nvrx_spec.py NvrxFsdpJob.start_install);
    # every pod start then downloads NVRx and transformers from the package index. Never in prod.
    allow_start_install: bool = False


def repository_name(cluster_name: str) -> str:
    """The ECR repository of the environment's built images: `<cluster>/nvrx-train`."""
    return f"{cluster_name}/{NVRX_PACKAGE_NAME}"


def built_image_name(environment_name: str) -> str:
    """The lock entry (k8s/images.lock.json) of an environment's built NVRx image."""
    return f"{NVRX_PACKAGE_NAME}-{environment_name}"


def refuse_start_install(environment_name: str, config: NvrxImageConfig, start_install: bool) -> None:
    if start_install and not config.allow_start_install:
        raise ConfigError(
            "nvrx.start_install",
            start_install,
            "False",
            f"environment {environment_name} runs the built image only: build it in the account with "
            f"`cdk deploy '{environment_name}/Images'` and pin it with `trainctl pin --built {environment_name} "
            f"--account ACCOUNT` (with Docker instead: `scripts/build_nvrx_image.sh {environment_name} ACCOUNT`; "
            "docs/deploy.md, 'The NVRx image')",
        )


# --- the in-account build (infra/images.py) ---------------------------------------------------------------------

# CloudFormation waits at most 3600 s for a custom resource (AWS::CloudFormation::CustomResource ServiceTimeout:
# "an integer from 1 to 3600", default 3600), so the whole build fits in an hour: CodeBuild stops the build first
# (its own timeout, reported with the build's logs), the Provider framework's waiter gives up next, CloudFormation
# last. A DLC-sized build (pull ~10 GB of the PyTorch DLC, push every layer to the environment's registry: ECR mounts
# no blobs across registries) is estimated at about half an hour on BUILD_GENERAL1_LARGE (8 vCPU, 15 GB memory, 128 GB
# disk: CodeBuild user guide, "Build environment compute modes and types"), plus about 3 minutes for the EFA installer
# (RPMs from its tarball) and 5 for NVRx's source build (an isolated build environment, a pybind11 extension and the
# .proto files; the CUPTI extension skipped): ~40 of the 50 minutes. Estimates, not measurements: the build log's last
# line says how long the build took against the limit.
BUILD_TIMEOUT_MINUTES = 50
WAIT_TIMEOUT_MINUTES = 55
BUILD_QUEUED_TIMEOUT_MINUTES = WAIT_TIMEOUT_MINUTES - BUILD_TIMEOUT_MINUTES  # a queued build counts too
CUSTOM_RESOURCE_TIMEOUT_MINUTES = 60
BUILD_POLL_SECONDS = 30
BUILD_COMPUTE_TYPE = "BUILD_GENERAL1_LARGE"

# ECR lifecycle: images of the repository that no lock can still pin are removed. Untagged images are only the
# leftovers of an interrupted push (tags are immutable); tagged ones are one per Dockerfile change.
KEEP_IMAGES = 20
UNTAGGED_EXPIRE_DAYS = 7

# ECR Public authenticates in us-east-1 only (ECR Public user guide, "Registry authentication"); an authenticated
# pull is not rate-limited per IP the way an anonymous one is (ECR Public quotas).
ECR_PUBLIC_HOST = "public.ecr.aws"
ECR_PUBLIC_AUTH_REGION = "us-east-1"
_PRIVATE_ECR = re.compile(r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com$")
_REFERENCE = re.compile(
    r"^(?P<host>[^/]+)/(?P<repository>[a-z0-9][a-z0-9._/-]*)(:[\w][\w.-]*)?(@sha256:[0-9a-f]{64})?$"
)


class RegistryKind(Enum):
    ECR_PUBLIC = "ecr-public"
    ECR_PRIVATE = "ecr"


@dataclass(frozen=True, kw_only=True)
class BaseRegistry:
    """Where the build pulls its FROM image, and what it must log in to and be allowed to pull there."""

    kind: RegistryKind
    host: str
    repository: str
    account: str | None = None  # ECR_PRIVATE only
    region: str  # where `get-login-password` authenticates

    def login_command(self) -> str:
        service = "ecr-public" if self.kind is RegistryKind.ECR_PUBLIC else "ecr"
        return (
            f"aws {service} get-login-password --region {self.region} | "
            f"docker login --username AWS --password-stdin {self.host}"
        )


def base_registry(reference: str) -> BaseRegistry:
    """The registry of the lock's nvrx-train reference: ECR Public (the DLC's public.ecr.aws/deep-learning-containers)
    or a private ECR registry (the DLC's in-region account, 763104351884 in us-east-1/2 and us-west-1/2: the DLC's
    available_images.md); nothing else can be logged in to from CodeBuild with the project's role."""
    match = _REFERENCE.match(reference)
    host = match["host"] if match else reference.split("/")[0]
    if match and host == ECR_PUBLIC_HOST:
        return BaseRegistry(
            kind=RegistryKind.ECR_PUBLIC, host=host, repository=match["repository"], region=ECR_PUBLIC_AUTH_REGION
        )
    private = _PRIVATE_ECR.match(host)
    if match and private:
        return BaseRegistry(
            kind=RegistryKind.ECR_PRIVATE,
            host=host,
            repository=match["repository"],
            account=private["account"],
            region=private["region"],
        )
    raise ConfigError(
        "images.nvrx-train.reference",
        reference,
        f"{ECR_PUBLIC_HOST}/REPOSITORY[:TAG][@DIGEST] or "
        "ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPOSITORY[:TAG][@DIGEST]",
        "pin the PyTorch training DLC from ECR Public or from its in-region ECR registry (k8s/images.lock.json)",
    )


def images_stack_name(cluster_name: str) -> str:
    return f"{cluster_name}-images"
