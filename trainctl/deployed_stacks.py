"""The templates an environment has deployed, for `trainctl plan`: per stack of the synth, CloudFormation's
DescribeStacks and GetTemplate (TemplateStage Original: the template as `cdk deploy` submitted it), masked as the
snapshot comparison masks (trainctl.template_plan.masked).

A stack that does not exist is new: the deploy creates it. So is one that holds no deployed template:
REVIEW_IN_PROGRESS (created for a change set never executed; CloudFormation User Guide, "Stack status codes") and a
failed first create (ROLLBACK_COMPLETE, ROLLBACK_FAILED), which `cdk deploy` deletes before creating the stack again
(aws-cdk 2.1148.1 lib/index.js: StackStatus.isCreationFailure, "Deleting it before attempting to re-create it").
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainctl.aws import Aws, AwsError, ErrorKind
from trainctl.template_plan import masked

NEW = "new"
"""The status of a stack the deploy creates."""
IAM_ACTIONS = ("cloudformation:DescribeStacks", "cloudformation:GetTemplate")
"""What the caller must be allowed, on the environment's stacks."""
_NO_TEMPLATE = frozenset({"REVIEW_IN_PROGRESS", "ROLLBACK_COMPLETE", "ROLLBACK_FAILED"})


class StackReads(Aws):
    """The CloudFormation reads of `trainctl plan`, beside trainctl.aws (which is at its size limit)."""

    def stack(self, name: str) -> dict[str, Any] | None:
        """The stack's description (DescribeStacks); None if no stack of that name exists."""
        try:
            pages = self._invoke("cloudformation", "describe_stacks", "cloudformation:DescribeStacks", StackName=name)
        except AwsError as exc:
            if exc.kind is ErrorKind.NOT_FOUND:
                return None
            raise
        return next((dict(s) for page in pages for s in page.get("Stacks", [])), None)

    def template(self, name: str) -> dict[str, Any] | None:
        """The template the stack was last deployed with (GetTemplate, Original); None if the stack is gone."""
        api = "cloudformation:GetTemplate"
        try:
            (page,) = self._invoke("cloudformation", "get_template", api, StackName=name, TemplateStage="Original")
        except AwsError as exc:
            if exc.kind is ErrorKind.NOT_FOUND:
                return None
            raise
        body = page.get("TemplateBody")
        # botocore decodes a JSON TemplateBody into a dict (botocore 1.44.8 handlers.py json_decode_template_body);
        # a body it could not decode stays text.
        if isinstance(body, Mapping):
            return dict(body)
        try:
            return dict(json.loads(str(body)))
        except ValueError:
            raise AwsError(
                ErrorKind.API_ERROR, api, f"the template of {name} is not JSON (cdk deploy submits JSON)"
            ) from None


@dataclass(frozen=True)
class DeployedStack:
    id: str
    """The stack's id in the stage (Platform, Storage, Gpu-<group>, Images)."""
    name: str
    """Its CloudFormation name."""
    status: str | None
    """StackStatus; None when no stack of that name exists."""
    template: dict[str, Any] | None
    """The deployed template, masked; None when the deploy creates the stack."""
    arn: str | None = None

    @property
    def new(self) -> bool:
        return self.template is None

    @property
    def account(self) -> str | None:
        """From the stack's ARN (arn:aws:cloudformation:REGION:ACCOUNT:stack/NAME/ID)."""
        parts = (self.arn or "").split(":")
        return parts[4] if len(parts) > 5 else None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": NEW if self.new else self.status, "stack_status": self.status}


def deployed_stacks(reads: StackReads, names: Mapping[str, str]) -> dict[str, DeployedStack]:
    """Stack id -> what CloudFormation holds under `names` (stack id -> name), in the order of `names`."""
    found: dict[str, DeployedStack] = {}
    for stack_id, name in names.items():
        described = reads.stack(name)
        if described is None:
            found[stack_id] = DeployedStack(stack_id, name, None, None)
            continue
        status = str(described.get("StackStatus"))
        template = None if status in _NO_TEMPLATE else reads.template(name)
        arn = str(described.get("StackId") or "") or None
        found[stack_id] = DeployedStack(stack_id, name, status, None if template is None else masked(template), arn)
    return found


def templates(stacks: Mapping[str, DeployedStack]) -> dict[str, dict[str, Any]]:
    """Stack id -> deployed template, for trainctl.template_plan.plan_templates (a new stack has none)."""
    return {stack_id: s.template for stack_id, s in stacks.items() if s.template is not None}
