"""The fabric gate (training/fabric_gate.py): its decision, the node search, the API calls, the in-job run."""
