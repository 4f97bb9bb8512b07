"""The files' ValidatingAdmissionPolicies over the pods the rehearsal's controllers create, with or without --env.

Each pod a controller creates (Job, RayCluster, RayJob and its submitter, Deployment: rehearse/loop.py Scheduler
.start) is offered, before anything of it exists, to every bound policy that matches a Pod CREATE in its namespace
(rehearse/cluster/authz.py Policies: resourceRules, namespaceSelector, matchConditions, validations, the same CEL
the API server evaluates), as the object the API server would admit: apiVersion v1, kind Pod, the metadata its
controller sets (name, namespace, labels, annotations, ownerReferences) and the spec it builds, the containers the
rehearsal does not run (KubeRay's autoscaler sidecar) included. The request is the controller's own (the
kube-controller-manager's job-controller or replicaset-controller service account, or KubeRay's operator).

A denied pod is not created: the create fails as the API server answers it (`pods "NAME" is forbidden:
ValidatingAdmissionPolicy 'P' with binding 'B' denied request: MESSAGE`). On a cluster the controller records a
FailedCreate event and retries with the same template, which the policy denies again, so the workload never runs;
the rehearsal ends that workload at the first denial with state FailedCreate and that message (rehearse/loop.py),
and the run goes on with the others.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from infra.spec.namespaces import KUBERAY
from rehearse.cluster.authz import Policies, Policy, User
from rehearse.pods import PodPlan

# Who creates a pod, by its controller's kind: kube-controller-manager's controllers with their own service accounts
# (--use-service-account-credentials, as EKS runs it), KubeRay's operator with the Helm chart's service account.
CREATORS = {
    "Job": User.service_account("kube-system", "job-controller"),
    "ReplicaSet": User.service_account("kube-system", "replicaset-controller"),
    "RayCluster": User.service_account(KUBERAY.name, "kuberay-operator"),
}


class PodDeniedError(Exception):
    """A pod the files' admission policies deny: it was not created."""

    def __init__(self, plan: PodPlan, message: str) -> None:
        self.plan = plan
        self.message = message
        super().__init__(message)


def pod_object(plan: PodPlan) -> dict[str, Any]:
    """The Pod as its controller creates it (what the admission policies see as `object`)."""
    spec = copy.deepcopy(plan.spec)
    spec["containers"] = [*spec.get("containers", []), *copy.deepcopy(plan.unrun_containers)]
    metadata: dict[str, Any] = {"name": plan.name, "namespace": plan.namespace}
    if plan.labels:
        metadata["labels"] = dict(plan.labels)
    if plan.annotations:
        metadata["annotations"] = dict(plan.annotations)
    if plan.owner_references:
        metadata["ownerReferences"] = copy.deepcopy(plan.owner_references)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def creator(plan: PodPlan) -> User:
    owner = next((o for o in plan.owner_references if o.get("controller")), None)
    kind = str((owner or {}).get("kind", ""))
    return CREATORS.get(kind, User.service_account("kube-system", "generic-controller"))


class PodAdmission:
    """The bound policies of the files that judge Pod CREATE (none: every pod is created, as without them)."""

    def __init__(self, objects: Iterable[Mapping[str, Any]]) -> None:
        self.policies = Policies(objects)
        self.judging: list[Policy] = [
            p for p in self.policies.policies if p.matches(operation="CREATE", group="", version="v1", resource="pods")
        ]

    def notes(self) -> list[str]:
        return [
            f"ValidatingAdmissionPolicy/{p.name} (binding {p.binding}) judges every pod the controllers create"
            for p in self.judging
        ]

    def check(self, plan: PodPlan) -> None:
        """Raises PodDeniedError with the API server's answer when a policy denies the pod."""
        if not self.judging:
            return
        denial = self.policies.denied(
            creator(plan),
            operation="CREATE",
            group="",
            version="v1",
            resource="pods",
            obj=pod_object(plan),
            old=None,
            namespace=plan.namespace,
        )
        if denial is not None:
            raise PodDeniedError(plan, f'pods "{plan.name}" is forbidden: {denial}')
