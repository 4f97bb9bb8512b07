"""The NVRx job's image, built from images/nvrx/Dockerfile per environment (scripts/build_nvrx_image.sh), and
whether an environment lets the job install NVRx at pod start instead.

The image tag is derived from the Dockerfile's directory (the build context), so a changed Dockerfile is a new,
immutable tag, and the same Dockerfile is the same tag in every environment (docs/deploy.md, "The NVRx image").
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
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
            f"environment {environment_name} runs the built image only: build, push and pin it with "
            f"`scripts/build_nvrx_image.sh {environment_name} ACCOUNT`, or pin one already pushed with "
            f"`trainctl pin --built {environment_name} --account ACCOUNT` (docs/deploy.md, 'The NVRx image')",
        )
