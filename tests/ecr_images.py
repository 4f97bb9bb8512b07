"""What a `docker push` leaves in an ECR repository, for tests against moto: a manifest under a tag."""

from __future__ import annotations

import json
from typing import Any


def push_manifest(ecr: Any, repository: str, tag: str) -> str:
    """Puts a minimal image manifest under `tag`; the digest ECR reports for it."""
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {
            "mediaType": "application/vnd.docker.container.image.v1+json",
            "size": 2,
            "digest": "sha256:" + "1" * 64,
        },
        "layers": [],
    }
    answer = ecr.put_image(repositoryName=repository, imageManifest=json.dumps(manifest), imageTag=tag)
    return str(answer["image"]["imageId"]["imageDigest"])
