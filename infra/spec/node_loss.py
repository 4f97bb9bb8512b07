"""What losing a GPU node costs in time before its pods run again elsewhere: the facts behind Kueue's
`recoveryTimeout` (infra/spec/kueue.py); the NVRx Job's failure budget for them is k8s/nvrx_spec.py's.

- A node that stops answering is marked Ready=Unknown and tainted `node.kubernetes.io/unreachable` once its
  kubelet has not reported for `--node-monitor-grace-period` (kube-controller-manager; 40 s in
  pkg/controller/nodelifecycle/config/v1alpha1/defaults.go before Kubernetes 1.32, 50 s since: the larger is used);
  the node lifecycle controller then marks its pods NotReady, which is when Kueue's PodsReady turns False.
- Its pods stay bound until the NoExecute toleration the DefaultTolerationSeconds admission plugin gives every pod
  (`--default-unreachable-toleration-seconds`, 300 s; plugin/pkg/admission/defaulttolerationseconds) runs out;
  the taint-eviction controller then deletes them with DisruptionTarget and the Job creates replacements.
- The replacements need a node: the managed node group's Auto Scaling group launches a new instance once the old
  one is terminated, and it boots and joins the cluster (AL2023 nodeadm) before a pod can bind. NODE_REPLACEMENT_S
  is an estimate, not a measurement (no GPU node loss has been timed on this platform yet): replace it with the
  first measured one.
- On the new node the image is pulled cold, which is what Kueue's `timeout` already budgets for a fresh node.
"""

from __future__ import annotations

NODE_MONITOR_GRACE_S = 50
UNREACHABLE_TOLERATION_S = 300
NODE_REPLACEMENT_S = 300


def lost_node_recovery_s(cold_start_s: int) -> int:
    """Seconds from the loss of a node until a replacement pod on a new node can be ready, given the time a pod on
    a fresh node takes to start (image pull included)."""
    return NODE_MONITOR_GRACE_S + UNREACHABLE_TOLERATION_S + NODE_REPLACEMENT_S + cold_start_s
