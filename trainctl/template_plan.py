"""What CloudFormation would replace: the templates of an environment before (the committed snapshot) and
after (the current synth), compared with CloudFormation's rules.

- A resource is replaced when one of its create-only properties changes (`createOnlyProperties` of its
  resource schema; the schemas cfn-lint ships, cfnlint/data/schemas; a custom resource is
  AWS::CloudFormation::CustomResource: ServiceToken), when a create-only property refers (Ref, Fn::GetAtt,
  or a Platform output through Fn::GetStackOutput / Fn::ImportValue) to a replaced resource, or when its
  logical id changes (removed and added).
- A replacement that keeps a literal value in a create-only name property (NodegroupName, GroupName, Name,
  ...) cannot be applied: CloudFormation creates the replacement first and stops with "cannot update a stack
  when a custom-named resource requires replacing".
- Stateful resources (STATEFUL_TYPES) and the PersistentVolumes/Claims in CDK's Kubernetes manifests are
  marked; a stateful replacement fails the plan unless the environment acknowledges it
  (Environment.acknowledged_replacements) with a reason.
- A replaced Platform resource that another stack reads weakly (Fn::GetStackOutput) leaves that stack with
  the old value until its template changes: named as a consumer to redeploy.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from infra.spec import AcknowledgedReplacement
from trainctl.exit_codes import ExitCode

STATEFUL_TYPES: Mapping[str, str] = {
    "AWS::FSx::FileSystem": "the checkpoints",
    "AWS::EKS::Nodegroup": "the nodes and what runs on them",
    "AWS::EKS::Cluster": "the cluster and every object in it",
    "AWS::KMS::Key": "what the key encrypts (the cluster's secrets)",
    "AWS::EC2::VPC": "everything in the network",
}
STATEFUL_KINDS = ("PersistentVolume", "PersistentVolumeClaim")
KUBERNETES_RESOURCE = "Custom::AWSCDK-EKS-KubernetesResource"
_NAME_PROPERTIES = ("Name", "NodegroupName", "GroupName", "ClusterName", "AlarmName", "LaunchTemplateName")
_ASSET_HASH = re.compile(r"[0-9a-f]{64}")


def masked(template: Mapping[str, Any]) -> dict[str, Any]:
    """The template with its asset hashes masked, as the snapshot test stores it (tests/infra/test_stability.py):
    they change with every aws-cdk-lib release; the rest of a template must not."""
    out: dict[str, Any] = json.loads(_ASSET_HASH.sub("<asset-hash>", json.dumps(template, sort_keys=True)))
    return out


@cache
def _schema_index() -> dict[str, str]:
    import importlib.util

    spec = importlib.util.find_spec("cfnlint")
    if spec is None or spec.origin is None:
        raise KeyError("cfn-lint is not installed: its resource schemas say which properties are create-only")
    root = Path(spec.origin).parent / "data" / "schemas"
    index: dict[str, str] = json.loads((root / "providers" / "us-east-1.json").read_text())
    return {name: str(root / "resources" / f"{digest}.json") for name, digest in index.items()}


@cache
def create_only_properties(cfn_type: str) -> tuple[tuple[str, ...], ...]:
    """The create-only property paths of a resource type, e.g. AWS::EKS::Nodegroup -> (("Subnets",), ...)."""
    schema_type = "AWS::CloudFormation::CustomResource" if cfn_type.startswith("Custom::") else cfn_type
    path = _schema_index().get(schema_type)
    if path is None:
        raise KeyError(f"no CloudFormation resource schema for {cfn_type} in cfn-lint's data")
    schema = json.loads(Path(path).read_text())
    return tuple(tuple(p.removeprefix("/properties/").split("/")) for p in schema.get("createOnlyProperties", []))


@dataclass(frozen=True)
class Replacement:
    stack: str
    logical_id: str
    type: str
    properties: tuple[str, ...]
    """The create-only properties that changed, 'logical id' when the resource was renamed (moved)."""
    stateful: bool
    blocked: str | None = None
    """Why CloudFormation cannot apply it (a literal name kept), None when it can."""
    acknowledged: str | None = None
    consumers: tuple[str, ...] = ()
    """Stacks that read this resource weakly and keep the old value until redeployed."""

    def to_json(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "logical_id": self.logical_id,
            "type": self.type,
            "properties": list(self.properties),
            "stateful": self.stateful,
            "blocked": self.blocked,
            "acknowledged": self.acknowledged,
            "weak_consumers": list(self.consumers),
        }


@dataclass(frozen=True)
class ObjectChange:
    """A Kubernetes object CDK applies that appears or disappears (a rename is one of each)."""

    stack: str
    kind: str
    name: str
    namespace: str | None
    action: str  # "add" or "remove"

    def to_json(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "kind": self.kind,
            "name": self.name,
            "namespace": self.namespace,
            "action": self.action,
        }


@dataclass
class Plan:
    replacements: list[Replacement] = field(default_factory=list)
    kubernetes: list[ObjectChange] = field(default_factory=list)
    unused_acknowledgments: list[AcknowledgedReplacement] = field(default_factory=list)

    @property
    def failures(self) -> list[str]:
        out = [f"{r.stack}/{r.logical_id} ({r.type}): {r.blocked}" for r in self.replacements if r.blocked]
        out += [
            f"{r.stack}/{r.logical_id} ({r.type}) is replaced: {STATEFUL_TYPES.get(r.type, 'stateful')} "
            "(acknowledge it in the environment's acknowledged_replacements with a reason)"
            for r in self.replacements
            if r.stateful and not r.blocked and r.acknowledged is None
        ]
        return out

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.CHECK_FAILED if self.failures else ExitCode.OK

    def to_json(self) -> dict[str, Any]:
        return {
            "replacements": [r.to_json() for r in self.replacements],
            "kubernetes": [o.to_json() for o in self.kubernetes],
            "unused_acknowledgments": [
                {"stack": a.stack, "logical_id": a.logical_id, "reason": a.reason} for a in self.unused_acknowledgments
            ],
            "failures": self.failures,
            "exit_code": int(self.exit_code),
        }


def _get(props: Any, path: Sequence[str]) -> Any:
    for key in path:
        if not isinstance(props, dict):
            return None
        props = props.get(key)
    return props


def _refs(value: Any) -> set[tuple[str | None, str]]:
    """(None, logical id) for Ref/GetAtt in the same stack, ("output", name) for a Platform output."""
    found: set[tuple[str | None, str]] = set()
    if isinstance(value, dict):
        for key, inner in value.items():
            if key == "Ref" and isinstance(inner, str) and not inner.startswith("AWS::"):
                found.add((None, inner))
            elif key == "Fn::GetAtt" and isinstance(inner, list) and inner:
                found.add((None, str(inner[0])))
            elif key == "Fn::GetStackOutput" and isinstance(inner, dict):
                found.add(("output", str(inner.get("OutputName"))))
            elif key == "Fn::ImportValue" and isinstance(inner, str):
                found.add(("output", inner.split(":", 1)[-1]))
            else:
                found |= _refs(inner)
    elif isinstance(value, list):
        for inner in value:
            found |= _refs(inner)
    return found


def _weak_outputs(value: Any) -> set[str]:
    """Names of the outputs read with Fn::GetStackOutput (CDK's weak references) anywhere in `value`."""
    if isinstance(value, dict):
        found = {str(value["Fn::GetStackOutput"].get("OutputName"))} if "Fn::GetStackOutput" in value else set()
        for inner in value.values():
            found |= _weak_outputs(inner)
        return found
    if isinstance(value, list):
        return set().union(*(_weak_outputs(v) for v in value)) if value else set()
    return set()


def _resolved(value: Any, outputs: Mapping[str, Any]) -> Any:
    """`value` with each cross-stack read (Fn::GetStackOutput, Fn::ImportValue of `<stack>:<output>`) replaced
    by the producer's output Value: CloudFormation compares resolved values, so switching a read from weak to
    strong (or an output's name) replaces nothing while the value stays."""
    if isinstance(value, dict):
        if isinstance(value.get("Fn::GetStackOutput"), dict):
            name = str(value["Fn::GetStackOutput"].get("OutputName"))
            return {"CrossStack": (outputs.get(name) or {}).get("Value", name)}
        if isinstance(value.get("Fn::ImportValue"), str):
            name = value["Fn::ImportValue"].split(":", 1)[-1]
            return {"CrossStack": (outputs.get(name) or {}).get("Value", name)}
        return {k: _resolved(v, outputs) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolved(v, outputs) for v in value]
    return value


def _output_targets(template: Mapping[str, Any]) -> dict[str, set[str]]:
    """Output name -> the logical ids its value refers to."""
    return {
        name: {logical_id for scope, logical_id in _refs(output.get("Value")) if scope is None}
        for name, output in (template.get("Outputs") or {}).items()
    }


def _blocked(cfn_type: str, before: Mapping[str, Any], after: Mapping[str, Any]) -> str | None:
    for path in create_only_properties(cfn_type):
        if len(path) == 1 and path[0] in _NAME_PROPERTIES:
            old, new = before.get(path[0]), after.get(path[0])
            if isinstance(new, str) and old == new:
                return (
                    f"keeps the literal {path[0]} {new!r} while it must be replaced: CloudFormation cannot "
                    "update a stack when a custom-named resource requires replacing"
                )
    return None


def _objects(resource: Mapping[str, Any]) -> list[dict[str, Any]]:
    from gates.outputs import render_manifest

    rendered: list[dict[str, Any]] = render_manifest(resource.get("Properties", {}).get("Manifest", "[]"))
    return rendered


def _kubernetes_changes(stack: str, before: Mapping[str, Any], after: Mapping[str, Any]) -> list[ObjectChange]:
    def keyed(template: Mapping[str, Any]) -> set[tuple[str, str, str | None]]:
        return {
            (o.get("kind", "?"), o.get("metadata", {}).get("name", "?"), o.get("metadata", {}).get("namespace"))
            for r in (template.get("Resources") or {}).values()
            if r.get("Type") == KUBERNETES_RESOURCE
            for o in _objects(r)
            if isinstance(o, dict)
        }

    old, new = keyed(before), keyed(after)
    changes = [
        ObjectChange(stack, k, n, ns, "remove") for k, n, ns in sorted(old - new, key=str) if k in STATEFUL_KINDS
    ]
    changes += [ObjectChange(stack, k, n, ns, "add") for k, n, ns in sorted(new - old, key=str) if k in STATEFUL_KINDS]
    return changes


def plan_templates(
    before: Mapping[str, Mapping[str, Any]],
    after: Mapping[str, Mapping[str, Any]],
    *,
    acknowledged: Iterable[AcknowledgedReplacement],
    producer: str = "Platform",
) -> Plan:
    """Compare two sets of templates (stack id -> template JSON) of one environment."""
    acks = {(a.stack, a.logical_id): a for a in acknowledged}
    outputs_before = (before.get(producer) or {}).get("Outputs") or {}
    outputs_after = (after.get(producer) or {}).get("Outputs") or {}
    replaced: dict[tuple[str, str], set[str]] = {}
    renamed: set[tuple[str, str]] = set()
    for stack, template in after.items():
        old_resources = (before.get(stack) or {}).get("Resources") or {}
        new_resources = template.get("Resources") or {}
        for logical_id, resource in new_resources.items():
            old = old_resources.get(logical_id)
            if old is None or old.get("Type") != resource.get("Type"):
                continue
            changed = {
                ".".join(path)
                for path in create_only_properties(resource["Type"])
                if json.dumps(_resolved(_get(old.get("Properties"), path), outputs_before), sort_keys=True)
                != json.dumps(_resolved(_get(resource.get("Properties"), path), outputs_after), sort_keys=True)
            }
            if changed:
                replaced[(stack, logical_id)] = changed
        # A stateful resource whose logical id vanished (renamed or moved to another stack) is deleted.
        for logical_id, resource in old_resources.items():
            if logical_id not in new_resources and resource.get("Type") in STATEFUL_TYPES:
                replaced[(stack, logical_id)] = {"logical id"}
                renamed.add((stack, logical_id))

    # Replacements propagate through create-only properties that refer to a replaced resource.
    outputs = _output_targets(after.get(producer) or {})
    changed_any = True
    while changed_any:
        changed_any = False
        for stack, template in after.items():
            for logical_id, resource in (template.get("Resources") or {}).items():
                if (stack, logical_id) in replaced or logical_id not in (
                    (before.get(stack) or {}).get("Resources") or {}
                ):
                    continue
                for path in create_only_properties(resource["Type"]):
                    for scope, target in _refs(_get(resource.get("Properties"), path)):
                        targets = (
                            {(stack, target)} if scope is None else {(producer, t) for t in outputs.get(target, ())}
                        )
                        if targets & replaced.keys():
                            replaced[(stack, logical_id)] = {".".join(path)}
                            changed_any = True

    weak_readers: dict[str, set[str]] = {}
    for stack, template in after.items():
        for name in _weak_outputs(template.get("Resources")):
            for target in outputs.get(name, ()):
                weak_readers.setdefault(target, set()).add(stack)

    plan = Plan()
    for (stack, logical_id), properties in sorted(replaced.items()):
        source = after if (stack, logical_id) not in renamed else before
        resource = source[stack]["Resources"][logical_id]
        cfn_type = resource["Type"]
        old = before.get(stack, {}).get("Resources", {}).get(logical_id, {})
        blocked = (
            None
            if (stack, logical_id) in renamed
            else _blocked(cfn_type, old.get("Properties") or {}, resource.get("Properties") or {})
        )
        ack = acks.pop((stack, logical_id), None)
        plan.replacements.append(
            Replacement(
                stack=stack,
                logical_id=logical_id,
                type=cfn_type,
                properties=tuple(sorted(properties)),
                stateful=cfn_type in STATEFUL_TYPES,
                blocked=blocked,
                acknowledged=ack.reason if ack is not None else None,
                consumers=tuple(sorted(weak_readers.get(logical_id, set()) - {stack})) if stack == producer else (),
            )
        )
    for stack in sorted(set(before) | set(after)):
        plan.kubernetes += _kubernetes_changes(stack, before.get(stack) or {}, after.get(stack) or {})
    plan.unused_acknowledgments = list(acks.values())
    return plan
