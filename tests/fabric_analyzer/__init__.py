"""Tests of training.fabric_analyzer and `trainctl fabric-check` against a corpus of NCCL logs (corpus/)."""
