#!/usr/bin/env bash
# Build images/nvrx/Dockerfile, push it to a private ECR repository and pin it in k8s/images.lock.json.
#
#   scripts/build_nvrx_image.sh ACCOUNT REGION [TAG]
#
# Needs docker and the AWS CLI with credentials for ACCOUNT (ecr:CreateRepository, ecr:GetAuthorizationToken,
# ecr:*LayerUpload*, ecr:PutImage). Steps:
#   1. BASE = the lock's nvrx-train reference (with @digest when pinned): the PyTorch training DLC;
#   2. docker build, then push to ACCOUNT.dkr.ecr.REGION.amazonaws.com/ml-platform/nvrx-train:TAG;
#   3. images.nvrx-train.reference becomes that tag and `trainctl pin --set nvrx-train=REF@DIGEST` pins the digest
#      the registry returned; commit k8s/images.lock.json and run `make synth`.
# Once the lock names the built image, pass the DLC explicitly for a rebuild: BASE=<dlc ref> scripts/build_...
set -euo pipefail

if [ "$#" -lt 2 ]; then
    echo "usage: $0 ACCOUNT REGION [TAG]" >&2
    exit 2
fi
account=$1
region=$2
tag=${3:-nvrx0.4.1-$(git rev-parse --short HEAD)}
root=$(cd "$(dirname "$0")/.." && pwd)
lock=$root/k8s/images.lock.json
registry=$account.dkr.ecr.$region.amazonaws.com
repository=ml-platform/nvrx-train
image=$registry/$repository:$tag

locked=$(python3 -c 'import json,sys; i=json.load(open(sys.argv[1]))["images"]["nvrx-train"]; print(i["reference"] + ("@" + i["digest"] if i["digest"] else ""))' "$lock")
base=${BASE:-$locked}
case $base in
    "$registry/$repository"*)
        echo "the lock already names the built image ($base); set BASE to the PyTorch training DLC to rebuild" >&2
        exit 2
        ;;
esac

echo "building $image FROM $base"
docker build --build-arg "BASE=$base" --tag "$image" "$root/images/nvrx"

aws ecr describe-repositories --region "$region" --repository-names "$repository" >/dev/null 2>&1 ||
    aws ecr create-repository --region "$region" --repository-name "$repository" \
        --image-scanning-configuration scanOnPush=true --image-tag-mutability IMMUTABLE >/dev/null
aws ecr get-login-password --region "$region" | docker login --username AWS --password-stdin "$registry"
docker push "$image"
digest=$(docker inspect --format '{{index .RepoDigests 0}}' "$image")
digest=${digest##*@}

python3 - "$lock" "$registry/$repository:$tag" <<'PY'
import json, sys
path, reference = sys.argv[1], sys.argv[2]
data = json.load(open(path))
entry = data["images"]["nvrx-train"]
entry["reference"], entry["digest"] = reference, None
entry["purpose"] = "PyTorch FSDP job with NVRx: images/nvrx/Dockerfile (PyTorch training DLC + NVRx and transformers baked in)"
with open(path, "w") as f:
    json.dump(data, f, indent=2)
    f.write("\n")
PY
trainctl pin --set "nvrx-train=$registry/$repository:$tag@$digest"
echo "pinned nvrx-train=$registry/$repository:$tag@$digest: commit $lock and run make synth"
