"""Pin the images of the lock (k8s/images.lock.json) by digest: resolve every tag, check the pins, set them by
hand, or pin an environment's built NVRx image from ECR; each a PinReport (trainctl/commands/pin.py is the
command).

The lock is written atomically (ImageLock.write) and only when every image resolved: one failure
(unreachable registry, unknown tag, refused token) leaves the file byte-for-byte as it was. It is also left
alone if someone else changed it while the tags were resolved.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from infra.spec import Environment
from k8s.images import DIGEST, ImageLock, ImageLockError
from trainctl.ecr import EcrClientFactory, ecr_providers
from trainctl.exit_codes import ExitCode
from trainctl.output import NOT_RUN, short_digest, table
from trainctl.registry import (
    INDEX_MEDIA_TYPES,
    CredentialProvider,
    RegistryClient,
    RegistryError,
    Resolved,
    parse_reference,
)

SET_FORMAT = "NAME=REF@sha256:<64 hex>"


class Mode(StrEnum):
    RESOLVE = "resolve"
    CHECK = "check"
    SET = "set"
    BUILT = "built"


class Status(StrEnum):
    # pin and pin --set
    PINNED = "pinned"  # had no digest, has one now
    UNCHANGED = "unchanged"  # the digest was already this one
    UPDATED = "updated"  # the tag moved: a new digest replaces the old one
    # pin --check
    OK = "ok"  # pinned, and the tag still resolves to that digest
    MISSING = "missing"  # no digest in the lock
    STALE = "stale"  # the tag now resolves to another digest
    # any mode
    ERROR = "error"  # could not be resolved


CHECK_FAILURES = frozenset({Status.MISSING, Status.STALE})


@dataclass(frozen=True)
class ImageResult:
    name: str
    reference: str
    status: Status
    old_digest: str | None
    new_digest: str | None
    media_type: str | None = None
    error_kind: str | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "reference": self.reference,
            "status": self.status.value,
            "old_digest": self.old_digest,
            "new_digest": self.new_digest,
            "media_type": self.media_type,
            "error": None if self.error is None else {"kind": self.error_kind, "message": self.error},
        }


@dataclass
class PinReport:
    mode: Mode
    lock: Path
    images: list[ImageResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """Problems not tied to one resolved image: a bad lock file, a bad --set, a failed write."""
    written: bool = False

    @property
    def exit_code(self) -> ExitCode:
        if self.errors or any(image.status is Status.ERROR for image in self.images):
            return ExitCode.ERROR
        if any(image.status in CHECK_FAILURES for image in self.images):
            return ExitCode.CHECK_FAILED
        return ExitCode.OK

    def to_json(self) -> dict[str, Any]:
        return {
            "command": "pin",
            "mode": self.mode.value,
            "lock": str(self.lock),
            "exit_code": int(self.exit_code),
            "written": self.written,
            "images": [image.to_json() for image in self.images],
            "errors": list(self.errors),
        }

    def render(self) -> tuple[str, str]:
        """(stdout, stderr) for humans: the table and a summary; error details go to stderr."""
        out: list[str] = []
        if self.images:
            rows = [
                [
                    image.name,
                    NOT_RUN if image.status is Status.ERROR else image.status.value,
                    image.reference,
                    short_digest(image.old_digest),
                    short_digest(image.new_digest),
                    _kind(image.media_type),
                ]
                for image in self.images
            ]
            out.append(table(["NAME", "STATUS", "REFERENCE", "OLD DIGEST", "NEW DIGEST", "MANIFEST"], rows))
        out.append(self.summary())
        err = [f"error: {message}" for message in self.errors]
        err += [f"error: {image.name}: {image.error}" for image in self.images if image.error is not None]
        return "\n".join(out) + "\n", "".join(f"{line}\n" for line in err)

    def summary(self) -> str:
        counts = {status: sum(1 for i in self.images if i.status is status) for status in Status}
        failed = [i for i in self.images if i.status is Status.ERROR]
        if self.mode is Mode.CHECK:
            bad = [i for i in self.images if i.status in CHECK_FAILURES]
            if failed:
                names = ", ".join(i.name for i in failed)
                return f"check could not run: {len(failed)} image(s) could not be resolved ({names}); see the errors"
            if self.errors:
                return "check could not run; see the errors"
            if bad:
                listed = "; ".join(
                    f"{i.name} {i.status.value}"
                    + (
                        " (no digest)"
                        if i.status is Status.MISSING
                        else f" ({i.reference} now resolves to {i.new_digest})"
                    )
                    for i in bad
                )
                fix = f"Run `trainctl pin` (or `trainctl pin --set {SET_FORMAT}`) and commit {self.lock}"
                return f"check failed: {listed}. {fix}"
            return f"check passed: all {len(self.images)} image(s) in {self.lock} are pinned and current"
        if self.written:
            done = ", ".join(f"{counts[s]} {s.value}" for s in (Status.PINNED, Status.UPDATED, Status.UNCHANGED))
            return f"wrote {self.lock}: {done}"
        if self.errors or failed:
            what = f"{len(failed)} of {len(self.images)} image(s) could not be resolved" if failed else "see the errors"
            return f"nothing written: {what}; {self.lock} is unchanged"
        return f"{self.lock} is up to date: {counts[Status.UNCHANGED]} unchanged (not rewritten)"


def _kind(media_type: str | None) -> str:
    if media_type is None:
        return "-"
    return "index" if media_type in INDEX_MEDIA_TYPES else "manifest"


# --- the lock file ----------------------------------------------------------------------------


class LockFileError(Exception):
    pass


def read_lock(path: Path) -> tuple[ImageLock, bytes]:
    """The lock and the exact bytes it was read from (to detect a concurrent change before writing)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise LockFileError(f"cannot read the lock {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise LockFileError(f"{path}: not valid JSON ({exc})") from None
    entries = data.get("images") if isinstance(data, dict) else None
    if not isinstance(data, dict) or (
        isinstance(entries, dict) and not all(isinstance(e, dict) for e in entries.values())
    ):
        raise LockFileError(f"{path}: expected {{'version': 1, 'images': {{NAME: {{reference, digest, purpose}}}}}}")
    try:
        return ImageLock.from_dict(data), raw
    except (ImageLockError, TypeError) as exc:
        raise LockFileError(f"{path}: {exc}") from None


def _write(report: PinReport, original: bytes, lock: ImageLock) -> None:
    path = report.lock
    try:
        if path.read_bytes() != original:
            report.errors.append(
                f"{path} changed while trainctl pin ran; nothing written. Run it again on the new version."
            )
            return
        lock.write(path)
    except OSError as exc:
        report.errors.append(f"cannot write {path}: {exc.strerror or exc}; it is unchanged")
        return
    report.written = True


def _load(report: PinReport) -> tuple[ImageLock, bytes] | None:
    try:
        return read_lock(report.lock)
    except LockFileError as exc:
        report.errors.append(str(exc))
        return None


# --- the three modes --------------------------------------------------------------------------


def _resolve_all(
    lock: ImageLock, client: RegistryClient, *, missing_only: bool = False
) -> dict[str, Resolved | RegistryError]:
    """Each distinct reference of the lock (or of its unpinned entries), resolved once."""
    results: dict[str, Resolved | RegistryError] = {}
    for image in lock.images.values():
        if missing_only and image.digest is not None:
            continue
        if image.reference not in results:
            try:
                results[image.reference] = client.resolve(image.reference)
            except RegistryError as exc:
                results[image.reference] = exc
    return results


def pin(path: Path, client: RegistryClient, *, missing_only: bool = False) -> PinReport:
    """Resolve every image and write all digests, or write nothing if any image failed.

    `missing_only` (what `make synth` runs) resolves only entries without a digest and never
    moves a pinned one: a synth must not change what an existing pin means."""
    report = PinReport(Mode.RESOLVE, path)
    loaded = _load(report)
    if loaded is None:
        return report
    lock, original = loaded
    resolved = _resolve_all(lock, client, missing_only=missing_only)
    updated = lock
    for name, image in lock.images.items():
        if image.reference not in resolved:
            report.images.append(ImageResult(name, image.reference, Status.UNCHANGED, image.digest, image.digest, None))
            continue
        outcome = resolved[image.reference]
        if isinstance(outcome, RegistryError):
            report.images.append(
                ImageResult(name, image.reference, Status.ERROR, image.digest, None, None, outcome.kind, str(outcome))
            )
            continue
        if image.digest is None:
            status = Status.PINNED
        elif image.digest == outcome.digest:
            status = Status.UNCHANGED
        else:
            status = Status.UPDATED
        report.images.append(
            ImageResult(name, image.reference, status, image.digest, outcome.digest, outcome.media_type)
        )
        updated = updated.with_digest(name, outcome.digest)
    if report.exit_code is ExitCode.OK and updated != lock:
        _write(report, original, updated)
    return report


def check(path: Path, client: RegistryClient) -> PinReport:
    """Resolve and compare; never writes. Missing digests are reported even when their tag cannot be resolved."""
    report = PinReport(Mode.CHECK, path)
    loaded = _load(report)
    if loaded is None:
        return report
    lock, _ = loaded
    resolved = _resolve_all(lock, client)
    for name, image in lock.images.items():
        outcome = resolved[image.reference]
        failure = outcome if isinstance(outcome, RegistryError) else None
        new = None if isinstance(outcome, RegistryError) else outcome
        if image.digest is None:
            status = Status.MISSING
        elif failure is not None:
            status = Status.ERROR
        else:
            status = Status.OK if new is not None and new.digest == image.digest else Status.STALE
        report.images.append(
            ImageResult(
                name,
                image.reference,
                status,
                image.digest,
                new.digest if new else None,
                new.media_type if new else None,
                failure.kind if failure else None,
                str(failure) if failure else None,
            )
        )
    return report


def parse_assignment(text: str, lock: ImageLock, lock_path: Path) -> tuple[str, str]:
    """NAME=REF@sha256:<hex> -> (NAME, digest), or ValueError saying which part is wrong and how to fix it."""
    name, equals, value = text.partition("=")
    if not equals or not name or not value:
        raise ValueError(f"--set {text!r}: expected {SET_FORMAT}")
    if name not in lock.images:
        raise ValueError(
            f"--set {text!r}: image {name!r} is not in {lock_path} (known: {', '.join(lock.images)}); "
            "add it to the lock with its tag reference first"
        )
    expected = lock.images[name].reference
    reference, at, digest = value.rpartition("@")
    if not at:
        raise ValueError(
            f"--set {text!r}: no '@' before the digest; expected {name}={expected}@sha256:<64 hex> ({SET_FORMAT})"
        )
    if reference != expected:
        raise ValueError(
            f"--set {name}: REF {reference!r} does not match images.{name}.reference={expected!r} in {lock_path}; "
            f"the digest must be the one of that tag: use --set {name}={expected}@<digest>, "
            f"or change images.{name}.reference in the lock first"
        )
    if not DIGEST.match(digest):
        raise ValueError(
            f"--set {name}: digest {digest!r} is malformed; expected sha256: followed by 64 lower-case hex digits"
        )
    return name, digest


def set_digests(path: Path, assignments: Sequence[str]) -> PinReport:
    """Pin by hand, no network: all assignments are valid and written together, or nothing is written."""
    report = PinReport(Mode.SET, path)
    loaded = _load(report)
    if loaded is None:
        return report
    lock, original = loaded
    chosen: dict[str, str] = {}
    for text in assignments:
        try:
            name, digest = parse_assignment(text, lock, path)
        except ValueError as exc:
            report.errors.append(str(exc))
            continue
        if chosen.get(name, digest) != digest:
            report.errors.append(f"--set {name}: given twice with different digests ({chosen[name]} and {digest})")
            continue
        chosen[name] = digest
    if report.errors:
        return report
    updated = lock
    for name, digest in chosen.items():
        old = lock.images[name].digest
        status = Status.PINNED if old is None else Status.UNCHANGED if old == digest else Status.UPDATED
        report.images.append(ImageResult(name, lock.images[name].reference, status, old, digest))
        updated = updated.with_digest(name, digest)
    if updated != lock:
        _write(report, original, updated)
    return report


def pin_built(path: Path, env: Environment, account: str, ecr: Any) -> PinReport:
    """The environment's built NVRx image (k8s/built_images.py), pinned with the digest ECR reports for its tag
    (`ecr`: a client for the environment's region): the entry is added, or its reference and digest replaced;
    nothing is written if the tag is not there."""
    from infra.spec.images import built_image_name, context_tag, repository_name
    from k8s.built_images import built_image, built_reference

    report = PinReport(Mode.BUILT, path)
    if not re.match(r"^\d{12}$", account):
        report.errors.append(f"--built {env.name} --account {account!r}: expected a 12-digit account")
        return report
    loaded = _load(report)
    if loaded is None:
        return report
    lock, original = loaded
    name, repository, tag = built_image_name(env.name), repository_name(env.cluster.name), context_tag()
    reference = built_reference(env, account, tag)
    old = lock.images.get(name)
    try:
        answer = ecr.describe_images(registryId=account, repositoryName=repository, imageIds=[{"imageTag": tag}])
        digest = str(answer["imageDetails"][0]["imageDigest"])
    except Exception as exc:  # boto3 raises many unrelated types (no credentials, denied, not found)
        report.images.append(
            ImageResult(
                name, reference, Status.ERROR, old.digest if old else None, None, None, "ecr",
                f"ecr:DescribeImages {repository}:{tag} in {env.region} failed: {type(exc).__name__}: {exc}; "
                f"build and push it first: `cdk deploy '{env.name}/Images'` (or, with Docker, "
                f"scripts/build_nvrx_image.sh {env.name} {account})",
            )
        )  # fmt: skip
        return report
    if not DIGEST.match(digest):
        report.errors.append(f"ECR answered {digest!r} for {repository}:{tag}, not a sha256 digest")
        return report
    status = (
        Status.PINNED
        if old is None or old.reference != reference or old.digest is None
        else Status.UNCHANGED
        if old.digest == digest
        else Status.UPDATED
    )
    report.images.append(ImageResult(name, reference, status, old.digest if old else None, digest))
    updated = lock.with_image(built_image(lock, env, reference=reference, digest=digest))
    if updated != lock:
        _write(report, original, updated)
    return report


def registry_credentials(lock_path: Path, clients: EcrClientFactory) -> dict[str, CredentialProvider]:
    """Providers for the private ECR registries the lock names (others are pulled anonymously);
    none when the lock cannot be read (pin itself reports that)."""
    try:
        lock, _ = read_lock(lock_path)
    except LockFileError:
        return {}
    hosts = set()
    for image in lock.images.values():
        try:
            hosts.add(parse_reference(image.reference).registry)
        except RegistryError:
            continue
    return ecr_providers(sorted(hosts), clients)
