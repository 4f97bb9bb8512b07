"""The fabric gate's remediation controller: it acts on the verdicts gated jobs publish (training/fabric_verdict.py).

config.py  what it may do (the gated groups, their queues, the rate bound), from the chart's ConfigMap
facts.py   what the API server says about a claim (the pod, its gang, the node, the group)
decide.py  whether to take a node out, and the quota that follows (pure)
act.py     the writes: the taint, the ClusterQueue quota and its record, the Events
loop.py    the poll loop: answers each verdict Event once, restores the quota of released nodes

Standard library only: it ships as source in a ConfigMap beside training/kube_api.py and training/fabric_verdict.py
(k8s/charts/fabric_gate.py), in a small pinned Python image.
"""
