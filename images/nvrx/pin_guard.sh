#!/bin/sh
# A value the build fetched, checked against what the Dockerfile records, the way resolve_base.sh checks the base's
# digest against the lock: the build log prints what it got; once recorded, anything else stops the build.
#
#   sh pin_guard.sh WHAT GOT RECORDED      exit 0 (GOT printed to stderr), or 1 when RECORDED is set and differs
#
# Used for the EFA installer tarball's sha256 and the commit NVRx's release tag names (images/nvrx/Dockerfile):
# neither is stated anywhere this project could read when it was written, so each is recorded after a first build
# prints it (trust on first use), as the lock's digests are.
set -eu
if [ "$#" -ne 3 ]; then
    echo "usage: $0 WHAT GOT RECORDED" >&2
    exit 2
fi
what=$1
got=$2
recorded=$3
if [ -z "$recorded" ]; then
    echo "pin_guard: $what: $got (not recorded yet: check it, then record it in images/nvrx/Dockerfile)" >&2
    exit 0
fi
if [ "$got" != "$recorded" ]; then
    echo "pin_guard: refusing: $what is $got, images/nvrx/Dockerfile records $recorded" >&2
    exit 1
fi
echo "pin_guard: $what: $got (as recorded)" >&2
