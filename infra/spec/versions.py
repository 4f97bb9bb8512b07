"""Every version the platform pins, in one place. Nothing here floats."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

# The control plane and the kubectl layer move together: the layer package
# `aws-cdk-lambda-layer-kubectl-v36` (requirements.txt) must match this minor.
KUBERNETES_VERSION = "1.36"

# EKS managed add-ons, pinned. The first four are the versions an EKS 1.36 cluster resolved
# to (vpc-cni >= 1.18.5 is also what EFA-only interfaces need); the last two were taken from
# published configurations. Confirm a candidate before bumping it with
#   aws eks describe-addon-versions --kubernetes-version 1.36 --addon-name NAME
MANAGED_ADDONS: MappingProxyType[str, str] = MappingProxyType(
    {
        "vpc-cni": "v1.22.4-eksbuild.3",
        "coredns": "v1.14.3-eksbuild.16",
        "kube-proxy": "v1.36.0-eksbuild.21",
        "eks-pod-identity-agent": "v1.3.10-eksbuild.3",
        "aws-fsx-csi-driver": "v1.9.0-eksbuild.1",
        "eks-node-monitoring-agent": "v1.4.0-eksbuild.2",
        # Container Insights with enhanced observability (GPU metrics need >= v1.3.0, EFA metrics
        # >= v1.5.2, EKS Pod Identity >= v3.1.0). v6.2.0-eksbuild.1 is the version the CloudWatch user
        # guide names ("Install the CloudWatch agent with the Amazon CloudWatch Observability EKS add-on");
        # its Helm chart twin is aws-observability/helm-charts release 6.2.0 (2026-06-10).
        "amazon-cloudwatch-observability": "v6.2.0-eksbuild.1",
    }
)

# Created with the cluster itself (infra/cluster.py); the rest are add-on modules.
CORE_ADDONS = ("vpc-cni", "coredns", "kube-proxy", "eks-pod-identity-agent")


# Ray inside the Ray Train image (k8s/images.lock.json "ray-train"): RayCluster.spec.rayVersion.
RAY_VERSION = "2.58.0"

# KubeRay: the operator chart and the CRDs vendored in k8s/crds/kuberay-v<version>/ that the
# workload charts are typed and validated against must be the same release.
KUBERAY_VERSION = "1.7.0"

# Kueue: the chart (controller image v<version>) and the CRDs vendored in k8s/crds/kueue-v<version>/
# that the queue objects are validated against. 0.19.2 is built against the KubeRay ray-operator
# v1.6.2 Go types (its go.mod); the ray.io/v1 RayJob/RayCluster API is unchanged in 1.7.0: the bump
# on kueue main (commit efa3c9d7, #14669) says "No source changes were needed; the RayJob/RayCluster
# adapters build and their unit tests pass against the new API".
KUEUE_VERSION = "0.19.2"


# Chart versions checked against each chart repository's history. aws-efa-k8s-device-plugin:
# aws/eks-charts gh-pages index.yaml (2026-08-03) and every Chart.yaml on master list v0.5.30
# (appVersion v0.5.20) as the newest stored. Two merged PRs bumped the chart after that snapshot: #1363
# (2026-08-21, image v0.5.21-eksbuild.9, "Incremented the chart version") and #1366 (2026-09-10, image
# v0.5.21-eksbuild.13); the AWS Ray Train sample pins v0.5.32. Neither thread states the chart version it set and no
# index.yaml after 2026-08-03 is stored here, so v0.5.32 is likely published but not proven: the pin stays the
# proven v0.5.30 until an index.yaml lists a newer one (`trainctl preflight` checks every pin against the live index).
# nvidia-device-plugin 0.20.0: in NVIDIA/k8s-device-plugin gh-pages index.yaml (2026-08-20) and tag v0.20.0.
# kuberay-operator 1.7.0: not in the stored ray-project/kuberay-helm snapshot (2025-07-16, newest 1.4.2);
# `trainctl preflight` checks every pin against the live index.yaml before a deploy.
# kueue 0.19.2 (kubernetes-sigs/kueue tag v0.19.2, 2026-08-20): newer 0.19 patches are published, v0.19.3
# (kubernetes/k8s.io PR #9894, 2026-09-03) and v0.19.4 (#9917, 2026-09-10, the newest found: images and the chart
# promoted to registry.k8s.io), but the stored kueue snapshot ends at v0.19.2 (2026-08-22), so neither their release
# notes nor their CRDs (k8s/crds/kueue-v<version>/) can be checked here: bump with a snapshot that has tag v0.19.4.
# 0.19.2 is published only
# as an OCI artifact (charts/kueue/README.md: `helm install kueue oci://registry.k8s.io/kueue/charts/kueue`;
# hack/helm-chart-package.sh pushes it with `helm push` to the staging registry, promoted from there).
# There is no index.yaml repository: preflight resolves the tag through the OCI distribution API.
@dataclass(frozen=True, kw_only=True)
class HelmChartPin:
    repository: str
    chart: str
    version: str


HELM_CHARTS: MappingProxyType[str, HelmChartPin] = MappingProxyType(
    {
        "nvidia-device-plugin": HelmChartPin(
            repository="https://nvidia.github.io/k8s-device-plugin", chart="nvidia-device-plugin", version="0.20.0"
        ),
        "aws-efa-k8s-device-plugin": HelmChartPin(
            repository="https://aws.github.io/eks-charts", chart="aws-efa-k8s-device-plugin", version="v0.5.30"
        ),
        "kuberay-operator": HelmChartPin(
            repository="https://ray-project.github.io/kuberay-helm/", chart="kuberay-operator", version=KUBERAY_VERSION
        ),
        # OCI: `repository` is the chart's full reference; the EKS kubectl handler runs
        # `helm pull <repository> --version <version> --untar` for oci:// repositories
        # (aws-cdk-lib 2.275.0, custom-resource-handlers aws-eks-v2 kubectl-handler/helm get_oci_cmd).
        "kueue": HelmChartPin(
            repository="oci://registry.k8s.io/kueue/charts/kueue", chart="kueue", version=KUEUE_VERSION
        ),
    }
)

# The Pod Security Standards version the namespace labels pin (matches the cluster).
POD_SECURITY_VERSION = f"v{KUBERNETES_VERSION}"
