"""cdk8s side: charts that emit the training namespaces and workloads into dist/."""
