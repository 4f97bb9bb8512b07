#!/bin/sh
# The FROM of this directory's Dockerfile, pinned by digest where the build runs: the Images stack's CodeBuild project
# (infra/images.py buildspec) and scripts/build_nvrx_image.sh both build FROM what this prints.
#
#   sh resolve_base.sh BASE      prints REPOSITORY@sha256:<digest> on stdout; what it did goes to stderr (the build log)
#
# BASE is the lock's nvrx-train (k8s/built_images.py build_base): REPOSITORY:TAG, with @sha256:<digest> when the lock
# pins one. The tag is pulled and its digest read from what the registry served (docker image inspect RepoDigests:
# the digest of the manifest the tag names, for this repository). When the lock pins a digest the build uses it, and
# only if the tag still names it: a tag that moved is refused until the new image is checked and pinned. A BASE with
# a digest and no tag is used as it is. Whatever cannot be resolved is refused: exit 1, nothing on stdout.
# DOCKER names the docker CLI (the tests pass a fake one).
set -eu

docker=${DOCKER:-docker}
if [ "$#" -ne 1 ]; then
    echo "usage: $0 BASE" >&2
    exit 2
fi
base=$1

refuse() {
    echo "resolve_base.sh: refusing to build FROM $base: $*" >&2
    exit 1
}

is_digest() {
    hex=${1#sha256:}
    [ "$hex" != "$1" ] && [ "${#hex}" -eq 64 ] && case $hex in *[!0-9a-f]*) false ;; esac
}

pinned=
case $base in
    *@*)
        pinned=${base##*@}
        reference=${base%@*}
        is_digest "$pinned" || refuse "$pinned is not a sha256 digest"
        ;;
    *) reference=$base ;;
esac

# The tag follows the last ':' of the last path segment (a registry host may carry a port).
last=${reference##*/}
case $last in
    *:*) repository=${reference%:*} ;;
    *)
        [ -n "$pinned" ] || refuse "it names neither a tag to resolve nor a digest"
        echo "resolve_base.sh: FROM $reference@$pinned (pinned, no tag to resolve)" >&2
        echo "$reference@$pinned"
        exit 0
        ;;
esac

"$docker" pull --quiet "$reference" >&2 || refuse "docker pull $reference failed"
resolved=
for line in $("$docker" image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "$reference"); do
    case $line in "$repository"@*) resolved=${line##*@} ;; esac
done
[ -n "$resolved" ] || refuse "the registry answer for $reference has no digest of $repository"
is_digest "$resolved" || refuse "$resolved, the digest $reference resolved to, is not a sha256 digest"
if [ -n "$pinned" ] && [ "$pinned" != "$resolved" ]; then
    refuse "the lock pins $pinned, but $reference now names $resolved: check that image, then pin it" \
        "(trainctl pin; k8s/images.lock.json) or pin the tag the lock means"
fi
echo "resolve_base.sh: $reference resolves to $resolved${pinned:+ (the digest the lock pins)}: FROM $repository@$resolved" >&2
echo "$repository@$resolved"
