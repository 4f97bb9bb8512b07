"""The Capacity Block hold: stops Kueue admitting onto a GPU group's Capacity Block once a job admitted there could
no longer reach its first checkpoint before the block's stop point (kubernetes-sigs/kueue issues 10741 and 6587,
open: Kueue itself admits onto a block however little of it is left).

config.py  the block groups: queue, the block's end, the stop margin, the lead (startup and the first checkpoint)
decide.py  whether a group's ClusterQueue should be on Hold now, and whether the controller may change it (pure)
act.py     the writes: the ClusterQueue's spec.stopPolicy with its annotation, and an Event
loop.py    the poll loop

Standard library only: it ships as source in a ConfigMap beside training/kube_api.py (k8s/charts/capacity_hold.py),
in the fabric gate controller's small pinned Python image, with its own ServiceAccount.
"""
