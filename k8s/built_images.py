"""The lock entries of the NVRx images each environment builds (infra/images.py): `nvrx-train-<env>`, the
environment's ECR repository at the Dockerfile's context tag, with the PyTorch DLC's runtime facts plus the packages
the Dockerfile bakes in (NvrxFsdpJob.pip, which tests/k8s/test_nvrx_image.py holds equal to the Dockerfile's pins).

`trainctl pin --built ENV` writes the real entry once the build has pushed the tag; `make check` and the tests
synthesize with a placeholder entry where none is pinned yet (account 000000000000 and a placeholder digest: no
registry serves it, so nothing synthesized with it can be deployed by mistake).
"""

from __future__ import annotations

import re
from dataclasses import replace
from types import MappingProxyType

from infra.spec import ENVIRONMENTS, Environment
from infra.spec.images import built_image_name, context_tag, repository_name
from k8s.images import ImageLock, ImageLockError, ImageRuntime, LockedImage
from k8s.nvrx_spec import NVRX_IMAGE, NvrxFsdpJob
from k8s.nvrx_support import NVRX_DISTRIBUTION
from k8s.ofi_nccl import NVRX_IMAGE_EFA_INSTALLER, ofi_nccl_of

PLACEHOLDER_ACCOUNT = "000000000000"
_PIN = re.compile(r"^(?P<name>[a-z0-9][a-z0-9._-]*)==(?P<version>\S+)$")


def registry(account: str, region: str) -> str:
    return f"{account}.dkr.ecr.{region}.amazonaws.com"


def built_reference(environment: Environment, account: str, tag: str | None = None) -> str:
    return f"{registry(account, environment.region)}/{repository_name(environment.cluster.name)}:{tag or context_tag()}"


def build_base(lock: ImageLock | None = None) -> str:
    """The FROM of every build of images/nvrx/Dockerfile (its BASE build argument): the lock's nvrx-train reference,
    with @digest when the lock pins one."""
    from k8s.images import LOCK_PATH

    base = (lock or ImageLock.load(LOCK_PATH)).get(NVRX_IMAGE)
    return f"{base.reference}@{base.digest}" if base.digest else base.reference


def built_runtime(base: ImageRuntime, pip: tuple[str, ...] = NvrxFsdpJob().pip) -> ImageRuntime:
    baked = {}
    for spec in pip:
        match = _PIN.match(spec.lower())
        if match is None:
            raise ImageLockError(f"nvrx.pip entry {spec!r} is not NAME==VERSION")
        baked[match["name"]] = match["version"]
    # images/nvrx/Dockerfile re-runs the EFA installer NVRX_IMAGE_EFA_INSTALLER over the base's (and refuses to
    # finish unless the plugin it then finds is the one that installer carries), and builds NVRx from its tag.
    return replace(
        base,
        efa_installer=NVRX_IMAGE_EFA_INSTALLER,
        aws_ofi_nccl=ofi_nccl_of(NVRX_IMAGE_EFA_INSTALLER),
        nvrx=baked.get(NVRX_DISTRIBUTION, base.nvrx),
        packages=MappingProxyType({**base.packages, **baked}),
        source=f"images/nvrx/Dockerfile: FROM the lock's {NVRX_IMAGE} ({base.source}) with {', '.join(pip)} baked in "
        f"(NVRx built from its source tag) and EFA installer {NVRX_IMAGE_EFA_INSTALLER} (k8s/ofi_nccl.py)",
    )


def built_image(lock: ImageLock, environment: Environment, *, reference: str, digest: str | None) -> LockedImage:
    base = lock.get(NVRX_IMAGE)
    if base.runtime is None:
        raise ImageLockError(f"images.{NVRX_IMAGE} has no runtime facts; the built image inherits them")
    return LockedImage(
        name=built_image_name(environment.name),
        reference=reference,
        digest=digest,
        purpose=f"NVRx job of environment {environment.name}: images/nvrx/Dockerfile built by its Images stack",
        runtime=built_runtime(base.runtime),
    )


def with_built_placeholders(lock: ImageLock) -> ImageLock:
    """`lock` with a placeholder entry for every environment's built image it does not pin yet (make check, tests)."""
    for environment in ENVIRONMENTS.values():
        if environment.gpu_node_groups and built_image_name(environment.name) not in lock.images:
            reference = built_reference(environment, PLACEHOLDER_ACCOUNT)
            lock = lock.with_image(built_image(lock, environment, reference=reference, digest=None))
    return lock


def main(argv: list[str]) -> int:
    """`python -m k8s.built_images add ENV ACCOUNT`: add (or reset to unpinned) the environment's built-image entry
    in k8s/images.lock.json and print its reference, for scripts/build_nvrx_image.sh to build, push and pin."""
    import sys

    from k8s.images import LOCK_PATH

    if len(argv) != 3 or argv[0] != "add" or argv[1] not in ENVIRONMENTS or not re.match(r"^\d{12}$", argv[2]):
        print(
            f"usage: python -m k8s.built_images add {{{','.join(ENVIRONMENTS)}}} ACCOUNT (12 digits)", file=sys.stderr
        )
        return 2
    environment = ENVIRONMENTS[argv[1]]
    lock = ImageLock.load(LOCK_PATH)
    reference = built_reference(environment, argv[2])
    lock.with_image(built_image(lock, environment, reference=reference, digest=None)).write(LOCK_PATH)
    print(reference)
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
