"""Label and taint matching as the Kubernetes API types define it, shared by the scheduler and the Kueue emulator."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from infra.spec.namespaces import NAMESPACE_NAME_LABEL


class UnknownOperatorError(ValueError):
    """An operator the API does not define (the API server would have refused the object)."""


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """core/v1 Toleration.ToleratesTaint."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if key and key != taint.get("key"):
        return False
    if operator == "Exists":
        return True
    if operator == "Equal":
        return bool(key) and (toleration.get("value") or "") == (taint.get("value") or "")
    return False


def expression_matches(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """One NodeSelectorRequirement (In, NotIn, Exists, DoesNotExist, Gt, Lt) against a node's labels
    (k8s.io/component-helpers scheduling/corev1/nodeaffinity)."""
    key, operator, values = expression["key"], expression["operator"], list(expression.get("values") or ())
    present = key in labels
    if operator == "In":
        return present and labels[key] in values
    if operator == "NotIn":
        return not present or labels[key] not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt"):
        if not present or len(values) != 1:
            return False
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if operator == "Gt" else have < want
    raise UnknownOperatorError(operator)


def label_selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector (apimachinery pkg/apis/meta/v1 LabelSelectorAsSelector): every matchLabels pair and every
    matchExpressions requirement holds; a null selector matches nothing, an empty one everything."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    return all(expression_matches(e, labels) for e in selector.get("matchExpressions") or ())


def namespace_labels(objects: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """The labels of each Namespace among `objects` as namespace selectors see them: its own, and the
    kubernetes.io/metadata.name the API server gives every namespace (GA in 1.22)."""
    return {
        o["metadata"]["name"]: {**(o["metadata"].get("labels") or {}), NAMESPACE_NAME_LABEL: o["metadata"]["name"]}
        for o in objects
        if o.get("kind") == "Namespace"
    }


def labels_of_namespace(known: Mapping[str, dict[str, str]], name: str) -> dict[str, str]:
    """A namespace's labels from `namespace_labels`; one the files do not declare has only its name label."""
    return known.get(name) or {NAMESPACE_NAME_LABEL: name}
