"""The API server's DNS name rules, one home for whoever checks a Kubernetes name: the network-policy spec here and
the rehearsal's per-kind name check (rehearse/names.py). Each function returns upstream's messages, empty when the
value passes.

Kubernetes 1.36, staging/src/k8s.io/apimachinery/pkg/util/validation/validation.go: IsDNS1123Subdomain (at most 253
characters), IsDNS1123Label and IsDNS1035Label (at most 63); their messages are kept, less the "(e.g. ..., regex
used for validation is ...)" tail RegexError appends. Lengths are Go's len(): bytes.
"""

from __future__ import annotations

import re

SUBDOMAIN_MAX = 253
LABEL_MAX = 63

_LABEL = re.compile("[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile("[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS1035 = re.compile("[a-z]([-a-z0-9]*[a-z0-9])?")

_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character"
)
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and "
    "end with an alphanumeric character"
)
_DNS1035_MSG = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic "
    "character, and end with an alphanumeric character"
)


def name_length(value: str) -> int:
    return len(value.encode())  # Go's len(): bytes


def _max_len(value: str, limit: int) -> list[str]:
    return [f"must be no more than {limit} characters"] if name_length(value) > limit else []


def dns1123_subdomain(value: str) -> list[str]:
    errors = _max_len(value, SUBDOMAIN_MAX)
    if not _SUBDOMAIN.fullmatch(value):
        errors.append(_SUBDOMAIN_MSG)
    return errors


def dns1123_label(value: str) -> list[str]:
    errors = _max_len(value, LABEL_MAX)
    if not _LABEL.fullmatch(value):
        if _SUBDOMAIN.fullmatch(value):
            errors.append("must not contain dots")
        else:
            errors.append(_LABEL_MSG)
    return errors


def dns1035_label(value: str) -> list[str]:
    errors = _max_len(value, LABEL_MAX)
    if not _DNS1035.fullmatch(value):
        errors.append(_DNS1035_MSG)
    return errors
