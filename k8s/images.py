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
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

LOCK_PATH = Path(__file__).resolve().parent / "images.lock.json"
LOCK_VERSION = 1

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
# registry/path:tag; the registry has a dot or a port, the tag no '@'.
REFERENCE = re.compile(r"^(?P<repository>[a-z0-9.-]+(:\d+)?/[a-z0-9._/-]+):(?P<tag>[A-Za-z0-9_][A-Za-z0-9._-]{0,127})$")

PIN_HELP = (
    "Pin it where the registry is reachable with `trainctl pin`, or on an air-gapped site with "
    "`trainctl pin --set NAME=REF@sha256:<digest>`; then commit k8s/images.lock.json."
)


class ImageLockError(ValueError):
    """A lock file that cannot be trusted, or an image the lock cannot provide."""


@dataclass(frozen=True, kw_only=True)
class LockedImage:
    name: str
    reference: str
    digest: str | None = None
    purpose: str = ""

    def __post_init__(self) -> None:
        if not NAME.match(self.name):
            raise ImageLockError(f"images.{self.name}: invalid name; use lower-case letters, digits and '-'")
        if "@" in self.reference or not REFERENCE.match(self.reference):
            raise ImageLockError(
                f"images.{self.name}.reference={self.reference!r} is not a tag reference; "
                "expected registry/repository:tag (the digest goes in 'digest')"
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
            unknown = set(entry) - {"reference", "digest", "purpose"}
            if unknown:
                raise ImageLockError(f"images.{name}: unknown field(s) {sorted(unknown)}")
            images[name] = LockedImage(
                name=name,
                reference=entry.get("reference", ""),
                digest=entry.get("digest"),
                purpose=entry.get("purpose", ""),
            )
        return cls(MappingProxyType(images))

    @classmethod
    def load(cls, path: Path = LOCK_PATH) -> ImageLock:
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ImageLockError(f"{path}: not valid JSON ({exc})") from None
        return cls.from_dict(data)

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

    def require_pinned(self, names: list[str] | None = None) -> None:
        """Raise one error listing every unpinned image among `names` (default: all)."""
        chosen = [self.get(n) for n in names] if names is not None else list(self.images.values())
        missing = [image for image in chosen if image.digest is None]
        if missing:
            raise UnpinnedImagesError(missing)

    def with_digest(self, name: str, digest: str) -> ImageLock:
        updated = dict(self.images)
        updated[name] = replace(self.get(name), digest=digest)
        return ImageLock(MappingProxyType(updated))

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": LOCK_VERSION,
            "images": {
                name: {"reference": image.reference, "digest": image.digest, "purpose": image.purpose}
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
