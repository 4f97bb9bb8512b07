"""Cluster add-ons, one module each: a pinned default (infra/spec/versions.py), typed
overrides, and the dependencies it declares (namespace before chart, nodes before the
DaemonSets and Deployments that need them)."""
