"""The lock `make check` synthesizes with, so the gates see every workload manifest on
machines that cannot reach a registry (CI included).

Pinned entries are kept. A missing digest becomes a placeholder computed from the text
"unpinned placeholder: <reference>": a well-formed digest of content made here, which no
registry serves, so nothing synthesized with it can ever be deployed by mistake; an environment's built NVRx image
the lock has no entry for gets a placeholder entry the same way (k8s/built_images.py). It is
written only to the path given (.check/), never to k8s/images.lock.json or dist/.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from k8s.built_images import with_built_placeholders
from k8s.images import LOCK_PATH, ImageLock


def placeholder_digest(reference: str) -> str:
    return "sha256:" + hashlib.sha256(f"unpinned placeholder: {reference}".encode()).hexdigest()


def check_lock(lock: ImageLock) -> ImageLock:
    lock = with_built_placeholders(lock)
    for name, image in lock.images.items():
        if image.digest is None:
            lock = lock.with_digest(name, placeholder_digest(image.reference))
    return lock


def main(argv: list[str]) -> int:
    if len(argv) != 1 or Path(argv[0]).resolve() == LOCK_PATH:
        print("usage: python -m k8s.check_lock OUT (never k8s/images.lock.json)", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.parent.mkdir(parents=True, exist_ok=True)
    check_lock(ImageLock.load(LOCK_PATH)).write(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
