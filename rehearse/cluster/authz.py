"""Who may do what on the rehearsal's API server (rehearse/cluster/apiserver.py): the RBAC objects and the
ValidatingAdmissionPolicies of the files, evaluated as the Kubernetes 1.36 API server does for the requests it
serves.

- RBAC (plugin/pkg/auth/authorizer/rbac/rbac.go, pkg/apis/rbac/v1/evaluation_helpers.go): a request is allowed when
  a rule of a role bound to the user allows it: a ClusterRoleBinding's ClusterRole anywhere, a RoleBinding's Role
  or ClusterRole in the binding's namespace; a rule matches on apiGroups, resources, verbs ("*" matches all) and,
  when it has them, resourceNames. Subjects: ServiceAccount (name and namespace), User (the username), Group
  (system:serviceaccounts, system:serviceaccounts:NS, system:authenticated). There is no default allow: the
  cluster's bootstrap roles grant a service account nothing on nodes or events. aggregationRule is refused.
- ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1): a policy bound by a binding matches an operation on a
  resource (matchConstraints.resourceRules) in a namespace whose labels match the policy's and the binding's
  namespaceSelector (matchConstraints.namespaceSelector, matchResources.namespaceSelector: matchLabels and
  matchExpressions In, NotIn, Exists, DoesNotExist over the Namespace objects of the files, each with the
  kubernetes.io/metadata.name label the API server gives every namespace; a cluster-scoped resource is never skipped
  by a namespaceSelector) when its matchConditions hold (CEL over `request`); then every validation's CEL over
  `object` and `oldObject` must hold, else the request is denied with the validation's message (validationActions
  Deny; failurePolicy Fail also denies when an expression cannot be evaluated). Only these fields are emulated; any
  other field of a policy or binding refuses the run (exit 2, naming it). CEL is evaluated with cel-python (the same
  implementation tests/k8s/test_fabric_gate_rbac.py uses). The API server judges node updates here; the pods the
  controllers create are judged by rehearse/pod_admission.py with the same code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rehearse.cluster.matching import label_selector_matches, labels_of_namespace, namespace_labels
from rehearse.errors import RehearsalError

RBAC_KINDS = ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
_POLICY_SPEC = {"failurePolicy", "matchConstraints", "matchConditions", "validations"}
_BINDING_SPEC = {"policyName", "validationActions", "matchResources"}
_RULE = {"apiGroups", "apiVersions", "operations", "resources"}
_SELECTOR = {"matchLabels", "matchExpressions"}
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...]

    @classmethod
    def service_account(cls, namespace: str, name: str) -> User:
        return cls(
            f"system:serviceaccount:{namespace}:{name}",
            ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
        )


def _matches(values: Sequence[str] | None, value: str) -> bool:
    return any(v in ("*", value) for v in values or ())


def _rule_allows(rule: Mapping[str, Any], verb: str, group: str, resource: str, name: str) -> bool:
    if rule.get("nonResourceURLs"):
        return False
    names = rule.get("resourceNames")
    return (
        _matches(rule.get("apiGroups"), group)
        and _matches(rule.get("resources"), resource)
        and _matches(rule.get("verbs"), verb)
        and (not names or name in names)
    )


def _subject_is(subject: Mapping[str, Any], user: User, binding_namespace: str) -> bool:
    kind = subject.get("kind")
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return user.name == f"system:serviceaccount:{namespace}:{subject.get('name')}"
    if kind == "User":
        return user.name == subject.get("name")
    if kind == "Group":
        return subject.get("name") in user.groups
    return False


class Rbac:
    def __init__(self, objects: Iterable[Mapping[str, Any]]) -> None:
        self.roles: dict[tuple[str, str, str], Mapping[str, Any]] = {}
        self.bindings: list[Mapping[str, Any]] = []
        for obj in objects:
            kind = obj.get("kind")
            meta = obj.get("metadata") or {}
            if kind in ("Role", "ClusterRole"):
                if obj.get("aggregationRule"):
                    raise RehearsalError(
                        f"ClusterRole/{meta.get('name')}: aggregationRule is not emulated by the rehearsal's API server"
                    )
                namespace = meta.get("namespace", "default") if kind == "Role" else ""
                self.roles[(kind, namespace, meta["name"])] = obj
            elif kind in ("RoleBinding", "ClusterRoleBinding"):
                self.bindings.append(obj)

    def allowed(self, user: User, verb: str, group: str, resource: str, *, namespace: str, name: str = "") -> bool:
        for binding in self.bindings:
            meta = binding.get("metadata") or {}
            cluster_wide = binding["kind"] == "ClusterRoleBinding"
            binding_namespace = "" if cluster_wide else meta.get("namespace", "default")
            if not cluster_wide and binding_namespace != namespace:
                continue
            if not any(_subject_is(s, user, binding_namespace) for s in binding.get("subjects") or []):
                continue
            ref = binding.get("roleRef") or {}
            role_namespace = binding_namespace if ref.get("kind") == "Role" else ""
            role = self.roles.get((str(ref.get("kind")), role_namespace, str(ref.get("name"))))
            if role is not None and any(_rule_allows(r, verb, group, resource, name) for r in role.get("rules") or []):
                return True
        return False


def forbidden_message(user: User, verb: str, group: str, resource: str, *, namespace: str, name: str) -> str:
    """The API server's Forbidden text (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/responsewriters)."""
    what = f'{resource} "{name}"' if name else resource
    scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
    return f'{what} is forbidden: User "{user.name}" cannot {verb} resource "{resource}" in API group "{group}" {scope}'


def _refuse_unknown(where: str, found: Iterable[str], allowed: set[str]) -> None:
    extra = sorted(set(found) - allowed)
    if extra:
        raise RehearsalError(
            f"{where}: {', '.join(extra)} is not emulated by the rehearsal's API server "
            f"(it evaluates {', '.join(sorted(allowed))})"
        )


def _selector(where: str, selector: Any) -> Mapping[str, Any]:
    """A label selector the rehearsal evaluates, or RehearsalError naming what it does not."""
    selector = selector or {}
    _refuse_unknown(where, selector, _SELECTOR)
    for expression in selector.get("matchExpressions") or []:
        _refuse_unknown(f"{where} matchExpressions", expression, {"key", "operator", "values"})
        if expression.get("operator") not in _OPERATORS:
            raise RehearsalError(
                f"{where}: operator {expression.get('operator')!r} is not a label selector operator "
                f"({', '.join(_OPERATORS)})"
            )
    return dict(selector)


@dataclass(frozen=True)
class Policy:
    name: str
    binding: str
    rules: tuple[Mapping[str, Any], ...]
    conditions: tuple[str, ...]
    validations: tuple[tuple[str, str], ...]
    fail_closed: bool
    # The policy's and the binding's namespaceSelector (both must select the request's namespace).
    namespace_selectors: tuple[Mapping[str, Any], ...] = ()

    def matches(self, *, operation: str, group: str, version: str, resource: str) -> bool:
        return any(
            _matches(r.get("apiGroups"), group)
            and _matches(r.get("apiVersions"), version)
            and _matches(r.get("operations"), operation)
            and _matches(r.get("resources"), resource)
            for r in self.rules
        )


class Policies:
    def __init__(self, objects: Iterable[Mapping[str, Any]]) -> None:
        objects = list(objects)
        specs = {o["metadata"]["name"]: o for o in objects if o.get("kind") == "ValidatingAdmissionPolicy"}
        self.namespace_labels = namespace_labels(objects)
        self.policies: list[Policy] = []
        for binding in (o for o in objects if o.get("kind") == "ValidatingAdmissionPolicyBinding"):
            where = f"ValidatingAdmissionPolicyBinding/{binding['metadata']['name']}"
            spec = binding.get("spec") or {}
            _refuse_unknown(f"{where} spec", spec, _BINDING_SPEC)
            actions = spec.get("validationActions") or []
            _refuse_unknown(f"{where} validationActions", actions, {"Deny"})
            match = spec.get("matchResources") or {}
            _refuse_unknown(f"{where} spec.matchResources", match, {"namespaceSelector"})
            selector = _selector(f"{where} spec.matchResources.namespaceSelector", match.get("namespaceSelector"))
            policy = specs.get(spec.get("policyName", ""))
            if policy is None:
                raise RehearsalError(f"{where}: policy {spec.get('policyName')!r} is not in the files")
            found = self._policy(policy, binding["metadata"]["name"])
            self.policies.append(dataclasses.replace(found, namespace_selectors=(*found.namespace_selectors, selector)))
        self._cel: Any = None
        self._programs: dict[str, Any] = {}
        if self.policies:
            try:
                import celpy
            except ImportError as exc:
                raise RehearsalError(
                    "the files hold a ValidatingAdmissionPolicy and its CEL needs cel-python (requirements.txt), "
                    f"which is not importable here: {exc}"
                ) from exc
            self._cel = celpy

    @staticmethod
    def _policy(obj: Mapping[str, Any], binding: str) -> Policy:
        where = f"ValidatingAdmissionPolicy/{obj['metadata']['name']}"
        spec = obj.get("spec") or {}
        _refuse_unknown(f"{where} spec", spec, _POLICY_SPEC)
        constraints = spec.get("matchConstraints") or {}
        _refuse_unknown(f"{where} spec.matchConstraints", constraints, {"resourceRules", "namespaceSelector"})
        selector = _selector(f"{where} spec.matchConstraints.namespaceSelector", constraints.get("namespaceSelector"))
        rules = tuple(constraints.get("resourceRules") or ())
        for rule in rules:
            _refuse_unknown(f"{where} resourceRules", rule, _RULE)
        for validation in spec.get("validations") or []:
            _refuse_unknown(f"{where} validations", validation, {"expression", "message"})
        for condition in spec.get("matchConditions") or []:
            _refuse_unknown(f"{where} matchConditions", condition, {"name", "expression"})
        return Policy(
            name=obj["metadata"]["name"],
            binding=binding,
            rules=rules,
            conditions=tuple(c["expression"] for c in spec.get("matchConditions") or []),
            validations=tuple((v["expression"], v.get("message", "")) for v in spec.get("validations") or []),
            fail_closed=spec.get("failurePolicy", "Fail") == "Fail",
            namespace_selectors=(selector,),
        )

    def _evaluate(self, expression: str, activation: Mapping[str, Any]) -> bool:
        celpy = self._cel
        program = self._programs.get(expression)
        if program is None:  # compiled once, as the API server does when it loads the policy (~0.2 s each here)
            env = celpy.Environment()
            program = self._programs[expression] = env.program(env.compile(expression))
        values = {k: celpy.adapter.json_to_cel(v) for k, v in activation.items()}
        result = program.evaluate(values)
        if not isinstance(result, celpy.celtypes.BoolType):
            raise TypeError(f"{expression!r} gave {result!r}, not a bool")
        return bool(result)

    def denied(
        self,
        user: User,
        *,
        operation: str,
        group: str,
        version: str,
        resource: str,
        obj: Mapping[str, Any],
        old: Mapping[str, Any] | None,
        namespace: str = "",
    ) -> str | None:
        """The denial text of the first policy that denies the request, or None. `namespace`: the object's (empty
        for a cluster-scoped resource)."""
        request = {
            "userInfo": {"username": user.name, "groups": list(user.groups)},
            "operation": operation,
            "namespace": namespace,
            "subResource": "",
        }
        labels = labels_of_namespace(self.namespace_labels, namespace) if namespace else {}
        for policy in self.policies:
            if not policy.matches(operation=operation, group=group, version=version, resource=resource):
                continue
            if namespace and not all(label_selector_matches(s, labels) for s in policy.namespace_selectors):
                continue
            head = f"ValidatingAdmissionPolicy '{policy.name}' with binding '{policy.binding}' denied request"
            try:
                if not all(self._evaluate(c, {"request": request}) for c in policy.conditions):
                    continue
                activation = {"object": obj, "oldObject": old, "request": request}
                for expression, message in policy.validations:
                    if not self._evaluate(expression, activation):
                        return f"{head}: {message or f'failed expression: {expression}'}"
            except Exception as exc:  # a CEL error: failurePolicy decides
                if policy.fail_closed:
                    return f"{head}: expression could not be evaluated: {exc}"
        return None
