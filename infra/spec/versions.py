"""Every version the platform pins, in one place. Nothing here floats."""

from __future__ import annotations

from types import MappingProxyType

# The control plane and the kubectl layer move together: the layer package
# `aws-cdk-lambda-layer-kubectl-v36` (requirements.txt) must match this minor.
KUBERNETES_VERSION = "1.36"

# EKS managed add-ons, pinned. These are the versions an EKS 1.36 cluster resolved to
# (vpc-cni >= 1.18.4 is also what EFA-only interfaces need). Check a candidate with
#   aws eks describe-addon-versions --kubernetes-version 1.36 --addon-name NAME
MANAGED_ADDONS: MappingProxyType[str, str] = MappingProxyType(
    {
        "vpc-cni": "v1.22.4-eksbuild.3",
        "coredns": "v1.14.3-eksbuild.16",
        "kube-proxy": "v1.36.0-eksbuild.21",
        "eks-pod-identity-agent": "v1.3.10-eksbuild.3",
    }
)

# The Pod Security Standards version the namespace labels pin (matches the cluster).
POD_SECURITY_VERSION = f"v{KUBERNETES_VERSION}"
