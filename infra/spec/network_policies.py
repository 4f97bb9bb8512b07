"""The NetworkPolicies of the namespaces the platform owns (issue 38: no pod reaches what is not its own), as data.

Ingress only (networking.k8s.io/v1, policyTypes [Ingress]): what may connect to a pod, never where a pod may go.
Every namespace we create denies all ingress by default (`default-deny-ingress`, podSelector {}); each policy below
opens one thing, for one reason, and a pod any of them selects admits the union of their rules (Kubernetes docs,
"Network Policies": policies are additive). One builder serves both sides: the cdk8s charts emit these objects
(k8s/charts/network_policies.py) and CDK applies a namespace's own with the namespace (infra/addons/namespaces.py),
so no apply step creates a namespace without them.

The namespaces (infra/spec/namespaces.py, infra/spec/kueue.py): `ray`, `training`, `fabric-gate-system`, and
`capacity-hold-system` in an environment with a Capacity Block group (the cdk8s namespaces file; `ray` and
`training` also by CDK), `kuberay-system` and `kueue-system` (CDK, before their Helm charts). Not ours: `kube-system`
(the device plugins' and the add-ons'), `amazon-cloudwatch` (created by the amazon-cloudwatch-observability EKS
add-on, whose agent runs on the host network, where NetworkPolicy does not apply).

Facts, with their sources:
- Enforcement: the VPC CNI's network policy agent, switched on by the add-on's enableNetworkPolicy (infra/cluster.py
  ADDON_CONFIGURATION). It always admits the node's own address, so the kubelet's probes pass whatever the policy
  (aws/aws-network-policy-agent pull 65, "Ignore policy restrictions against Node IP"; Kubernetes docs: a pod cannot
  block access from its resident node).
- A gang (an Indexed Job: the NVRx job, the fabric checks): its pods carry `batch.kubernetes.io/job-name: <job>`,
  written by the API server when the Job is created (Kubernetes 1.36 pkg/registry/batch/job/strategy.go
  generateSelector, required by pkg/apis/batch/validation/validation.go validateGeneratedSelector; batch/v1
  JobNameLabel). A policy cannot say "the same value as mine", so each Job gets its own, emitted by its chart: its
  pods admit each other on every port (the c10d rendezvous 29500, the stores 29501-29502, and NCCL's bootstrap and
  socket ports, which NCCL picks at run time), and no other Job's pods.
- A Ray workload (the RayCluster, the RayJob's own cluster): KubeRay v1.7.0 names a RayJob's cluster
  `<rayjob>-<5 random characters>` (ray-operator/controllers/ray/utils/util.go GenerateRayClusterName), so no
  manifest can select it by `ray.io/cluster`; the charts label both groups' pod templates `platform/workload: <name>`,
  which KubeRay keeps on the pods (common/pod.go labelPod: only ray.io/node-type, ray.io/group and ray.io/cluster
  are not overridable), next to `ray.io/node-type: head|worker`. Its pods admit each other on every port (GCS 6379,
  the client 10001, the dashboard and its agents, the object manager and workers' ports).
- The head's dashboard (8265, utils/constant.go DefaultDashboardPort) is also reached by the RayJob's submitter
  (`ray job status|submit|logs --address http://<head service>:8265`, common/job.go BuildJobSubmitCommand), a pod
  labelled `ray.io/originated-from-cr-name: <rayjob>`, `ray.io/originated-from-crd: RayJob` (rayjob_controller.go
  getSubmitterTemplate), and by the operator, which reads job status through the head service's dashboard port
  (rayjob_controller.go FetchHeadServiceURL, utils/util.go GetRayDashboardClientFunc; directly, not through the API
  server's proxy: --use-kubernetes-proxy defaults to false, main.go, and the chart leaves it unset). Its pods are
  labelled by the kuberay-operator chart 1.7.0 (templates/deployment.yaml, _helpers.tpl):
  `app.kubernetes.io/name: kuberay-operator` (values.yaml nameOverride) and `app.kubernetes.io/instance: <release>`.
  KubeRay's own NetworkPolicy controller (networkpolicy_controller.go) admits the submitter the same way; it runs only
  for a RayCluster with spec.networkPolicy, which none of ours has.
- Nothing outside a workload needs GCS (6379) or the client port (10001): the submitter and the operator speak HTTP to
  the dashboard, and trainctl runs `ray job` inside the head through `exec` (trainctl/kube.py).
- Kueue v0.19.2's manager serves the API server: its webhooks (WEBHOOK_PORT) and the visibility API
  (VISIBILITY_PORT, infra/spec/kueue.py). The chart labels its pods (charts/kueue/templates/_helpers.tpl
  kueue.selectorLabels) `app.kubernetes.io/name: kueue`, `app.kubernetes.io/instance: <release>`,
  `control-plane: controller-manager`. Its metrics (8443) and KubeRay's (8080) are scraped by nothing here (neither
  chart's ServiceMonitor is on, no Prometheus runs), so neither is admitted.
- The EKS control plane calls webhooks and aggregated APIs through its cross-account network interfaces, which EKS
  places in the cluster's subnets (EKS user guide, "View Amazon EKS networking requirements for VPC and subnets":
  up to 4 network interfaces in the subnets you specify; "Configuring control plane egress routing": the
  kube-apiserver's traffic to webhooks leaves through a cross-account ENI in your VPC subnet). Their addresses are not
  known before the cluster exists and change on upgrades, so those ports admit the VPC's CIDR. The VPC CNI gives pods
  VPC addresses too: that rule also admits any pod of the VPC on those two ports, which NetworkPolicy cannot tell from
  the control plane by address; every other port of the manager stays closed.
- Namespaces are selected by `kubernetes.io/metadata.name`, which the API server sets on every namespace to its name
  (Kubernetes >= 1.22, NamespaceDefaultLabelName), so no one can label another namespace into a rule.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infra.spec.errors import ConfigError
from infra.spec.kube_names import dns1123_label, dns1123_subdomain
from infra.spec.kueue import KUEUE, VISIBILITY_PORT, WEBHOOK_PORT
from infra.spec.namespaces import KUBERAY, NAMESPACE_NAME_LABEL, NamespaceSpec, namespace_manifest
from infra.spec.versions import HELM_CHARTS, KUEUE_VERSION

API_VERSION = "networking.k8s.io/v1"
DEFAULT_DENY = "default-deny-ingress"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
WORKLOAD_LABEL = "platform/workload"
RAY_NODE_TYPE_LABEL = "ray.io/node-type"
RAY_HEAD = "head"
RAY_ORIGIN_NAME_LABEL = "ray.io/originated-from-cr-name"
RAY_ORIGIN_KIND_LABEL = "ray.io/originated-from-crd"
RAY_JOB_KIND = "RayJob"
RAY_DASHBOARD_PORT = 8265
# The Helm release names: infra/addons/helm.py pinned_chart installs each chart as the release of its HELM_CHARTS key.
KUBERAY_OPERATOR_RELEASE = "kuberay-operator"
KUEUE_RELEASE = "kueue"
KUBERAY_OPERATOR_PODS: Mapping[str, str] = {
    "app.kubernetes.io/name": "kuberay-operator",
    "app.kubernetes.io/instance": KUBERAY_OPERATOR_RELEASE,
}
KUEUE_MANAGER_PODS: Mapping[str, str] = {
    "app.kubernetes.io/name": "kueue",
    "app.kubernetes.io/instance": KUEUE_RELEASE,
    "control-plane": "controller-manager",
}
for _release in (KUBERAY_OPERATOR_RELEASE, KUEUE_RELEASE):
    if _release not in HELM_CHARTS:
        raise ConfigError("network_policies release", _release, HELM_CHARTS.keys(), "name a pinned chart")

# A DNS-1123 subdomain (object names) and label (namespace names); a label value (Kubernetes apimachinery
# pkg/util/validation/validation.go).
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")


def _check_label_values(field: str, labels: Mapping[str, str]) -> None:
    for value in labels.values():
        if not _LABEL_VALUE.match(value):
            raise ConfigError(field, value, "a label value: at most 63 letters, digits, -_.")


@dataclass(frozen=True, kw_only=True)
class Peer:
    """Who may connect: pods with all of `pods`' labels (in `namespace`, else the policy's own), or an address block."""

    pods: Mapping[str, str] | None = None
    namespace: str | None = None
    cidr: str | None = None

    def check(self, where: str) -> None:
        if (self.pods is None) == (self.cidr is None):
            raise ConfigError(f"{where}.from", self, "pods or cidr, not both and not neither")
        if self.pods is not None:
            if not self.pods:
                raise ConfigError(
                    f"{where}.from.pods", dict(self.pods), "at least one label", "{} admits every pod of the namespace"
                )
            _check_label_values(f"{where}.from.pods", self.pods)
        if self.namespace is not None and dns1123_label(self.namespace):
            raise ConfigError(f"{where}.from.namespace", self.namespace, "a namespace name")
        if self.cidr is not None:
            if self.namespace is not None:
                raise ConfigError(f"{where}.from.namespace", self.namespace, "none with a cidr")
            try:
                network = ipaddress.IPv4Network(self.cidr, strict=True)
            except ValueError as exc:
                raise ConfigError(f"{where}.from.cidr", self.cidr, "an IPv4 network such as 10.10.0.0/16") from exc
            if network.prefixlen < 8:
                raise ConfigError(f"{where}.from.cidr", self.cidr, "a /8 or narrower", "name the network that calls")

    def manifest(self) -> dict[str, Any]:
        if self.cidr is not None:
            return {"ipBlock": {"cidr": self.cidr}}
        peer: dict[str, Any] = {}
        if self.namespace is not None:
            peer["namespaceSelector"] = {"matchLabels": {NAMESPACE_NAME_LABEL: self.namespace}}
        peer["podSelector"] = {"matchLabels": dict(self.pods or {})}
        return peer


@dataclass(frozen=True, kw_only=True)
class IngressRule:
    """`peers` may connect on `ports` (TCP), or on every port and protocol where `ports` is empty."""

    peers: tuple[Peer, ...]
    ports: tuple[int, ...] = ()
    why: str

    def check(self, where: str) -> None:
        if not self.peers:
            raise ConfigError(f"{where}.from", self.peers, "at least one peer", "an empty `from` admits every source")
        for peer in self.peers:
            peer.check(where)
        for port in self.ports:
            if not 1 <= port <= 65535:
                raise ConfigError(f"{where}.ports", port, "1 to 65535")
        if len(set(self.ports)) != len(self.ports):
            raise ConfigError(f"{where}.ports", self.ports, "each port once")
        if not self.why:
            raise ConfigError(f"{where}.why", self.why, "the reason this traffic is admitted")

    def manifest(self) -> dict[str, Any]:
        rule: dict[str, Any] = {"from": [peer.manifest() for peer in self.peers]}
        if self.ports:
            rule["ports"] = [{"protocol": "TCP", "port": port} for port in self.ports]
        return rule


@dataclass(frozen=True, kw_only=True)
class PolicySpec:
    """One NetworkPolicy: the pods it selects (all of the namespace's where `pods` is empty) admit `rules` only."""

    name: str
    namespace: str
    pods: Mapping[str, str]
    rules: tuple[IngressRule, ...]
    why: str

    def __post_init__(self) -> None:
        where = f"network_policies[{self.namespace}/{self.name}]"
        if dns1123_subdomain(self.name):
            raise ConfigError(f"{where}.name", self.name, "a DNS-1123 subdomain (lower-case letters, digits, '-', '.')")
        if dns1123_label(self.namespace):
            raise ConfigError(f"{where}.namespace", self.namespace, "a namespace name")
        _check_label_values(f"{where}.pods", self.pods)
        for index, rule in enumerate(self.rules):
            rule.check(f"{where}.ingress[{index}]")
        if not self.why:
            raise ConfigError(f"{where}.why", self.why, "what the policy is for")

    def manifest(self) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "podSelector": {"matchLabels": dict(self.pods)} if self.pods else {},
            "policyTypes": ["Ingress"],
        }
        if self.rules:
            spec["ingress"] = [rule.manifest() for rule in self.rules]
        return {
            "apiVersion": API_VERSION,
            "kind": "NetworkPolicy",
            "metadata": {"name": self.name, "namespace": self.namespace, "annotations": {"platform/purpose": self.why}},
            "spec": spec,
        }


def default_deny(namespace: str) -> PolicySpec:
    return PolicySpec(
        name=DEFAULT_DENY,
        namespace=namespace,
        pods={},
        rules=(),
        why="no pod of this namespace admits a connection that no other policy here names",
    )


@dataclass(frozen=True, kw_only=True)
class ControlPlaneCall:
    """Ports the EKS control plane calls on a controller's pods (webhooks, aggregated APIs), with their source."""

    namespace: str
    name: str
    pods: Mapping[str, str]
    ports: tuple[int, ...]
    source: str

    def policy(self, vpc_cidr: str) -> PolicySpec:
        return PolicySpec(
            name=self.name,
            namespace=self.namespace,
            pods=self.pods,
            rules=(IngressRule(peers=(Peer(cidr=vpc_cidr),), ports=self.ports, why=self.source),),
            why=f"the EKS control plane (its network interfaces in the VPC's subnets) calls {self.source}",
        )


# The KubeRay chart 1.7.0 installs no webhook (helm-chart/kuberay-operator/templates has none): kuberay-system only
# denies. The fabric gate's controller (fabric_controller/) and the Capacity Block hold controller (capacity_hold/)
# serve nothing: fabric-gate-system and capacity-hold-system only deny.
CONTROL_PLANE_CALLS: tuple[ControlPlaneCall, ...] = (
    ControlPlaneCall(
        namespace=KUEUE.name,
        name="kueue-manager-from-control-plane",
        pods=KUEUE_MANAGER_PODS,
        ports=(WEBHOOK_PORT, VISIBILITY_PORT),
        source=f"Kueue's webhooks and its visibility API (kueue chart {KUEUE_VERSION})",
    ),
)


def namespace_policies(spec: NamespaceSpec, *, vpc_cidr: str) -> tuple[PolicySpec, ...]:
    """What a namespace we create carries from its first apply: its default deny and the control plane's calls."""
    calls = tuple(call.policy(vpc_cidr) for call in CONTROL_PLANE_CALLS if call.namespace == spec.name)
    return (default_deny(spec.name), *calls)


def namespace_objects(spec: NamespaceSpec, environment: str, *, vpc_cidr: str) -> list[dict[str, Any]]:
    """The Namespace, then its policies: one list, whether CDK applies it or cdk8s emits it."""
    return [namespace_manifest(spec, environment), *(p.manifest() for p in namespace_policies(spec, vpc_cidr=vpc_cidr))]


def gang(namespace: str, job: str) -> PolicySpec:
    """An Indexed Job's pods admit each other, on every port, and no other pod."""
    own = {JOB_NAME_LABEL: job}
    return PolicySpec(
        name=f"{job}-gang",
        namespace=namespace,
        pods=own,
        rules=(
            IngressRule(
                peers=(Peer(pods=own),),
                why="rendezvous, stores and NCCL's run-time ports, between the Job's own pods",
            ),
        ),
        why=f"the pods of Job {job} reach each other; no other Job's pods reach them",
    )


def ray_workload_labels(name: str) -> dict[str, str]:
    """The labels a Ray workload's charts put on its head and worker pod templates (what its policies select)."""
    return {WORKLOAD_LABEL: name}


def ray_workload(namespace: str, name: str, *, rayjob: bool) -> tuple[PolicySpec, PolicySpec]:
    """A Ray workload's pods admit each other; its head admits the operator (and a RayJob's submitter) on 8265."""
    own = ray_workload_labels(name)
    operator = Peer(pods=KUBERAY_OPERATOR_PODS, namespace=KUBERAY.name)
    submitter = Peer(pods={RAY_ORIGIN_NAME_LABEL: name, RAY_ORIGIN_KIND_LABEL: RAY_JOB_KIND})
    dashboard: list[IngressRule] = []
    if rayjob:
        dashboard.append(
            IngressRule(
                peers=(submitter,),
                ports=(RAY_DASHBOARD_PORT,),
                why="the RayJob's submitter submits and follows the job through the dashboard's job API",
            )
        )
    dashboard.append(
        IngressRule(
            peers=(operator,),
            ports=(RAY_DASHBOARD_PORT,),
            why="the KubeRay operator reads job status from the dashboard",
        )
    )
    return (
        PolicySpec(
            name=f"{name}-ray-cluster",
            namespace=namespace,
            pods=own,
            rules=(IngressRule(peers=(Peer(pods=own),), why="GCS, the client port, the object manager, workers"),),
            why=f"the pods of Ray workload {name} reach each other; no other workload's pods reach them",
        ),
        PolicySpec(
            name=f"{name}-ray-dashboard",
            namespace=namespace,
            pods={**own, RAY_NODE_TYPE_LABEL: RAY_HEAD},
            rules=tuple(dashboard),
            why=f"the head of Ray workload {name} serves its dashboard ({RAY_DASHBOARD_PORT}) to KubeRay only",
        ),
    )
