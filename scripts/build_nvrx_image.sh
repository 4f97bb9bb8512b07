#!/usr/bin/env bash
# Build images/nvrx/Dockerfile, push it to the environment's ECR repository and pin it in k8s/images.lock.json as
# nvrx-train-ENV, the image the NVRx job of ENV runs (k8s/built_images.py). The default path needs no Docker:
# `cdk deploy 'ENV/Images'` builds the same image in the account (infra/images.py); this script is the alternative
# for a machine with Docker.
#
#   scripts/build_nvrx_image.sh ENV ACCOUNT
#
# Needs docker and the AWS CLI with credentials for ACCOUNT (ecr:CreateRepository, ecr:GetAuthorizationToken,
# ecr:*LayerUpload*, ecr:PutImage). Steps:
#   1. `python -m k8s.built_images add ENV ACCOUNT` writes the entry (unpinned) and prints its reference:
#      ACCOUNT.dkr.ecr.<region of ENV>.amazonaws.com/<cluster>/nvrx-train:nvrx-<hash of images/nvrx>;
#   2. BASE = the lock's nvrx-train reference (with @digest when pinned): the PyTorch training DLC, frozen tag,
#      resolved to the digest it names by images/nvrx/resolve_base.sh (refused when it no longer names the pinned one);
#   3. docker build FROM that digest (recorded as the image's org.opencontainers.image.base.* labels) and push, then
#      `trainctl pin --set nvrx-train-ENV=REF@DIGEST` pins the digest the registry returned; commit
#      k8s/images.lock.json and run `make synth`.
set -euo pipefail

if [ "$#" -ne 2 ]; then
    echo "usage: $0 ENV ACCOUNT" >&2
    exit 2
fi
env=$1
account=$2
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
lock=$root/k8s/images.lock.json

image=$(python3 -m k8s.built_images add "$env" "$account")
registry=${image%%/*}
region=$(echo "$registry" | cut -d. -f4)
repository=${image#*/}
repository=${repository%%:*}

locked=$(python3 -c 'from k8s.built_images import build_base; print(build_base())')
base=${BASE:-$locked}

from_digest=$(sh "$root/images/nvrx/resolve_base.sh" "$base")
echo "building $image FROM $from_digest (the lock: $base)"
docker build --build-arg "BASE=$from_digest" \
    --label "org.opencontainers.image.base.name=${base%@*}" \
    --label "org.opencontainers.image.base.digest=${from_digest##*@}" \
    --tag "$image" "$root/images/nvrx"

aws ecr describe-repositories --region "$region" --repository-names "$repository" >/dev/null 2>&1 ||
    aws ecr create-repository --region "$region" --repository-name "$repository" \
        --image-scanning-configuration scanOnPush=true --image-tag-mutability IMMUTABLE >/dev/null
aws ecr get-login-password --region "$region" | docker login --username AWS --password-stdin "$registry"
docker push "$image"
digest=$(docker inspect --format '{{index .RepoDigests 0}}' "$image")
digest=${digest##*@}

trainctl pin --set "nvrx-train-$env=$image@$digest"
echo "pinned nvrx-train-$env=$image@$digest: commit $lock and run make synth"
