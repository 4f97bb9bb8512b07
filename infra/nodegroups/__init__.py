"""Managed node groups: the system group here, GPU/EFA groups alongside."""
