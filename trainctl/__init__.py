"""`trainctl`: the operator CLI of the training platform (`python -m trainctl --help`).

Subcommands are listed in `trainctl.cli` (SUBCOMMANDS): pin, fabric-check, preflight (trainctl/preflight/),
submit, status, logs, capacity, goodput, and under trainctl/commands/ scale, rehearse, plan and drain. They
share one shell: flags (trainctl.flags), output (trainctl.output.emit), progress (trainctl.progress), the
AWS client (trainctl.aws) and the EKS connection (trainctl.eks_auth); exit codes in trainctl.exit_codes.
"""
