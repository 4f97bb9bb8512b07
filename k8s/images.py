"""The image lock: every container image a manifest may use, pinned by digest.

`k8s/images.lock.json` maps a logical name to a tag reference and its sha256 digest. The
tag stays for readability; what the cluster pulls is `reference@digest`. Digests are
never invented: the committed lock carries `null` until `trainctl pin` resolves them from
the registry (or `trainctl pin --set NAME=REF@sha256:...` sets them by hand).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

LOCK_PATH = Path(__file__).resolve().parent / "images.lock.json"
LOCK_VERSION = 1

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
# The Ray Train DLC (aws.github.io/deep-learning-containers/ray changelog): train-ml-cuda, -v1 and -v1.1 move with
# each rebuild, -v1.1.0 stays.
RAY_DLC_REPOSITORY = "deep-learning-containers/ray"
FROZEN_DLC_TAG = re.compile(r"-v\d+\.\d+\.\d+$")
# The PyTorch training DLC (DLC documentation, "DLC SOCI Tag Introduction"): tags without a version or with only vX
# (2.9.0-gpu-py312-cu130-ubuntu22.04-ec2, ...-ec2-v1, 2.9-gpu-py312-ec2) move to every patch release; -vX.Y and
# -vX.Y-<timestamp> (optionally -soci) attach to one image.
PYTORCH_DLC_REPOSITORY = "deep-learning-containers/pytorch-training"
FROZEN_PYTORCH_DLC_TAG = re.compile(r"-v\d+\.\d+(-\d{4}(-\d{2}){5})?(-soci)?$")
# The Amazon Linux 2023 PyTorch DLC (aws/deep-learning-containers docs/src/data/pytorch/2.13-cuda-ec2.yml: tags
# 2.13.0-cu133-amzn2023 and 2.13-cu133-amzn2023) has no frozen tag: both are re-pushed by the twice-weekly
# auto-release (.github/workflows/pytorch.autorelease-2.13-ec2.yml, cron '30 19 * * 2,4'), so the lock pins the
# digest (images/nvrx/resolve_base.sh refuses a tag that moved from it) and the tag names at least the full PyTorch
# release, whose runtime facts it records.
AL2023_PYTORCH_DLC_REPOSITORY = "deep-learning-containers/pytorch"
AL2023_PYTORCH_DLC_TAG = re.compile(r"^\d+\.\d+\.\d+-cu\d+-amzn2023$")
# registry/path:tag; the registry has a dot or a port, the tag no '@'.
REFERENCE = re.compile(r"^(?P<repository>[a-z0-9.-]+(:\d+)?/[a-z0-9._/-]+):(?P<tag>[A-Za-z0-9_][A-Za-z0-9._-]{0,127})$")

PIN_HELP = (
    "Pin it where the registry is reachable with `trainctl pin`, or on an air-gapped site with "
    "`trainctl pin --set NAME=REF@sha256:<digest>`; then commit k8s/images.lock.json."
)


class ImageLockError(ValueError):
    """A lock file that cannot be trusted, or an image the lock cannot provide."""


_PYTHON = re.compile(r"^3\.\d{1,2}$")
_GLIBC = re.compile(r"^2\.\d{1,2}$")
_PACKAGE = re.compile(r"^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$")
_NCCL = re.compile(r"^2\.\d{1,2}\.\d{1,2}$")
_RELEASE = re.compile(r"^\d+\.\d+\.\d+$")
_CUDA = re.compile(r"^\d+\.\d+$")
RUNTIME_FIELDS = frozenset(
    {"python", "glibc", "arch", "cuda", "nccl", "efa_installer", "aws_ofi_nccl", "nvrx", "packages", "source"}
)


@dataclass(frozen=True, kw_only=True)
class ImageRuntime:
    """What a workload may rely on inside an image, with where each fact comes from: the Python minor version and
    C library (which wheels install), and the versions of the packages that matter (which a start-time install
    must not replace). Read by the runtime-packages gate and the pods' own checks (training.pod_checks)."""

    python: str
    glibc: str
    source: str
    arch: str = "x86_64"
    # The NCCL the image's PyTorch loads (the NVRx support rules need it: k8s/nvrx_support.py); None: not recorded.
    nccl: str | None = None
    # CUDA (major.minor), the EFA installer release and the aws-ofi-nccl it carries (k8s/ofi_nccl.py: before 1.21.0
    # it leaks on every communicator teardown), and the NVRx built into the image; None: not recorded.
    cuda: str | None = None
    efa_installer: str | None = None
    aws_ofi_nccl: str | None = None
    nvrx: str | None = None
    packages: MappingProxyType[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if not _PYTHON.match(self.python):
            raise ImageLockError(f"runtime.python={self.python!r}: expected a minor version such as 3.12")
        if not _GLIBC.match(self.glibc):
            raise ImageLockError(f"runtime.glibc={self.glibc!r}: expected the C library version, e.g. 2.35")
        if self.arch not in ("x86_64", "aarch64"):
            raise ImageLockError(f"runtime.arch={self.arch!r}: expected x86_64 or aarch64")
        if self.nccl is not None and not _NCCL.match(self.nccl):
            raise ImageLockError(f"runtime.nccl={self.nccl!r}: expected NCCL's version, e.g. 2.27.7")
        if self.cuda is not None and not _CUDA.match(self.cuda):
            raise ImageLockError(f"runtime.cuda={self.cuda!r}: expected CUDA's major.minor, e.g. 13.3")
        for name in ("efa_installer", "aws_ofi_nccl", "nvrx"):
            value = getattr(self, name)
            if value is not None and not _RELEASE.match(value):
                raise ImageLockError(f"runtime.{name}={value!r}: expected a release X.Y.Z, e.g. 1.51.0")
        if self.efa_installer is not None:
            from k8s.ofi_nccl import ofi_nccl_of

            carried = ofi_nccl_of(self.efa_installer)
            if carried is not None and self.aws_ofi_nccl not in (None, carried):
                raise ImageLockError(
                    f"runtime.aws_ofi_nccl={self.aws_ofi_nccl!r}: EFA installer {self.efa_installer} carries "
                    f"aws-ofi-nccl {carried} (k8s/ofi_nccl.py, EFA release notes); record {carried}, or the installer "
                    "the image really has"
                )
        if not self.source.strip():
            raise ImageLockError("runtime.source is empty: say where the facts come from (release notes, a pull)")
        for name in self.packages:
            if not _PACKAGE.match(name):
                raise ImageLockError(f"runtime.packages: {name!r} is not a normalized package name (lower case)")

    @property
    def wheel_platforms(self) -> list[str]:
        """The manylinux tags pip accepts on this C library (PEP 600: manylinux_2_Y for every Y up to the image's,
        and the legacy aliases of 2_5, 2_12 and 2_17)."""
        minor = int(self.glibc.split(".")[1])
        tags = [f"manylinux_2_{y}_{self.arch}" for y in range(minor, 4, -1)]
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        return tags + [f"{alias}_{self.arch}" for y, alias in legacy.items() if y <= minor]

    def to_dict(self) -> dict[str, Any]:
        return {
            "python": self.python,
            "glibc": self.glibc,
            "arch": self.arch,
            **{
                name: value
                for name in ("cuda", "nccl", "efa_installer", "aws_ofi_nccl", "nvrx")
                if (value := getattr(self, name)) is not None
            },
            "packages": dict(sorted(self.packages.items())),
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, where: str, data: Any) -> ImageRuntime:
        if not isinstance(data, dict):
            raise ImageLockError(f"{where}: expected a mapping with {sorted(RUNTIME_FIELDS)}")
        unknown = set(data) - RUNTIME_FIELDS
        if unknown:
            raise ImageLockError(f"{where}: unknown field(s) {sorted(unknown)}")
        packages = data.get("packages", {})
        if not isinstance(packages, dict) or not all(isinstance(v, str) for v in packages.values()):
            raise ImageLockError(f"{where}.packages: expected a mapping of package name -> version")
        try:
            return cls(
                python=str(data.get("python", "")),
                glibc=str(data.get("glibc", "")),
                arch=str(data.get("arch", "x86_64")),
                nccl=None if data.get("nccl") is None else str(data["nccl"]),
                cuda=None if data.get("cuda") is None else str(data["cuda"]),
                efa_installer=None if data.get("efa_installer") is None else str(data["efa_installer"]),
                aws_ofi_nccl=None if data.get("aws_ofi_nccl") is None else str(data["aws_ofi_nccl"]),
                nvrx=None if data.get("nvrx") is None else str(data["nvrx"]),
                packages=MappingProxyType(dict(packages)),
                source=str(data.get("source", "")),
            )
        except ImageLockError as exc:
            raise ImageLockError(f"{where}.{exc}") from None


@dataclass(frozen=True, kw_only=True)
class LockedImage:
    name: str
    reference: str
    digest: str | None = None
    purpose: str = ""
    runtime: ImageRuntime | None = None

    def __post_init__(self) -> None:
        if not NAME.match(self.name):
            raise ImageLockError(f"images.{self.name}: invalid name; use lower-case letters, digits and '-'")
        if "@" in self.reference or not REFERENCE.match(self.reference):
            raise ImageLockError(
                f"images.{self.name}.reference={self.reference!r} is not a tag reference; "
                "expected registry/repository:tag (the digest goes in 'digest')"
            )
        if self.repository.endswith(RAY_DLC_REPOSITORY) and not FROZEN_DLC_TAG.search(self.tag):
            raise ImageLockError(
                f"images.{self.name}.reference={self.reference!r} is a moving DLC tag: the Ray DLC moves its vX and "
                "vX.Y tags on every security rebuild, so the runtime facts recorded here go stale; pin the frozen "
                "vX.Y.Z tag (e.g. train-ml-cuda-v1.1.0)"
            )
        if self.repository.endswith(PYTORCH_DLC_REPOSITORY) and not FROZEN_PYTORCH_DLC_TAG.search(self.tag):
            raise ImageLockError(
                f"images.{self.name}.reference={self.reference!r} is a moving DLC tag: the PyTorch DLC moves its tags "
                "without a version or with only vX on every patch release, so the runtime facts recorded here go "
                "stale; pin a -vX.Y or -vX.Y-<timestamp> tag (e.g. 2.9.0-gpu-py312-cu130-ubuntu22.04-ec2-v1.11)"
            )
        if self.repository.endswith(AL2023_PYTORCH_DLC_REPOSITORY) and not AL2023_PYTORCH_DLC_TAG.match(self.tag):
            raise ImageLockError(
                f"images.{self.name}.reference={self.reference!r}: the Amazon Linux 2023 PyTorch DLC's runtime facts "
                "are those of one PyTorch release; pin the X.Y.Z-cuNNN-amzn2023 tag (e.g. 2.13.0-cu133-amzn2023), "
                "with its digest"
            )
        if self.digest is not None and not DIGEST.match(self.digest):
            raise ImageLockError(
                f"images.{self.name}.digest={self.digest!r} is malformed; expected sha256: followed by 64 hex digits"
            )

    @property
    def repository(self) -> str:
        match = REFERENCE.match(self.reference)
        assert match is not None  # checked on construction
        return match["repository"]

    @property
    def tag(self) -> str:
        match = REFERENCE.match(self.reference)
        assert match is not None
        return match["tag"]

    @property
    def pinned(self) -> str:
        """`repository:tag@sha256:...`, the form every manifest uses."""
        if self.digest is None:
            raise UnpinnedImagesError([self])
        return f"{self.reference}@{self.digest}"


class UnpinnedImagesError(ImageLockError):
    def __init__(self, images: list[LockedImage]) -> None:
        lines = [f"  - {image.name}: {image.reference} has no digest" for image in images]
        super().__init__(
            f"{len(images)} image(s) in k8s/images.lock.json are not pinned by digest:\n"
            + "\n".join(lines)
            + f"\n{PIN_HELP}"
        )
        self.images = images


def pin_fix(image: LockedImage) -> str:
    offline = f"trainctl pin --set {image.name}={image.reference}@sha256:<digest>"
    return f"`trainctl pin` (no registry reachable: `{offline}`)"


def build_fix(environment: str) -> str:
    """How an environment's NVRx image (infra/images.py, images/nvrx/Dockerfile) gets built and into the lock."""
    return (
        f"`cdk deploy '{environment}/Images'`, then `trainctl pin --built {environment} --account ACCOUNT` (with "
        f"Docker instead: `scripts/build_nvrx_image.sh {environment} ACCOUNT`; docs/deploy.md, 'The NVRx image')"
    )


@dataclass(frozen=True)
class ImageLock:
    images: MappingProxyType[str, LockedImage]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ImageLock:
        if data.get("version") != LOCK_VERSION:
            raise ImageLockError(f"version={data.get('version')!r}; expected {LOCK_VERSION}")
        entries = data.get("images")
        if not isinstance(entries, dict) or not entries:
            raise ImageLockError("images: expected a non-empty mapping of name -> {reference, digest}")
        images = {}
        for name, entry in sorted(entries.items()):
            unknown = set(entry) - {"reference", "digest", "purpose", "runtime"}
            if unknown:
                raise ImageLockError(f"images.{name}: unknown field(s) {sorted(unknown)}")
            runtime = entry.get("runtime")
            images[name] = LockedImage(
                name=name,
                reference=entry.get("reference", ""),
                digest=entry.get("digest"),
                purpose=entry.get("purpose", ""),
                runtime=None if runtime is None else ImageRuntime.from_dict(f"images.{name}.runtime", runtime),
            )
        return cls(MappingProxyType(images))

    @classmethod
    def load(cls, path: Path = LOCK_PATH) -> ImageLock:
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ImageLockError(f"{path}: not valid JSON ({exc})") from None
        return cls.from_dict(data)

    def by_reference(self, image: str) -> LockedImage | None:
        """The lock entry a manifest's `reference@digest` (or bare reference) came from."""
        reference = image.split("@", 1)[0]
        return next((i for i in self.images.values() if i.reference == reference), None)

    def get(self, name: str) -> LockedImage:
        try:
            return self.images[name]
        except KeyError:
            raise ImageLockError(
                f"image {name!r} is not in k8s/images.lock.json (known: {', '.join(self.images)}); "
                f"add it with its tag reference, then pin it. {PIN_HELP}"
            ) from None

    def pinned(self, name: str) -> str:
        return self.get(name).pinned

    def not_ready(self, name: str, *, built_by: str | None = None) -> tuple[str, str] | None:
        """Why no manifest can use image `name` yet, and the command that fixes it; None when it is pinned.
        `built_by`: the environment whose Images stack builds it (the lock has no entry until it is built)."""
        if built_by is not None and name not in self.images:
            return f"image {name} is not built yet", build_fix(built_by)
        image = self.get(name)
        if image.digest is None:
            return f"image {name} has no digest", pin_fix(image)
        return None

    def require_pinned(self, names: list[str] | None = None) -> None:
        """Raise one error listing every unpinned image among `names` (default: all)."""
        chosen = [self.get(n) for n in names] if names is not None else list(self.images.values())
        missing = [image for image in chosen if image.digest is None]
        if missing:
            raise UnpinnedImagesError(missing)

    def with_image(self, image: LockedImage) -> ImageLock:
        """The lock with `image` added, or replacing the entry of its name."""
        return ImageLock(MappingProxyType({**self.images, image.name: image}))

    def with_digest(self, name: str, digest: str) -> ImageLock:
        updated = dict(self.images)
        updated[name] = replace(self.get(name), digest=digest)
        return ImageLock(MappingProxyType(updated))

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": LOCK_VERSION,
            "images": {
                name: {
                    "reference": image.reference,
                    "digest": image.digest,
                    "purpose": image.purpose,
                    **({} if image.runtime is None else {"runtime": image.runtime.to_dict()}),
                }
                for name, image in sorted(self.images.items())
            },
        }

    def write(self, path: Path = LOCK_PATH) -> None:
        """Atomically: a reader sees the old lock or the new one, never half of either."""
        text = json.dumps(self.to_dict(), indent=2) + "\n"
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".images.lock.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
