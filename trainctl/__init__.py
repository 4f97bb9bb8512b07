"""`trainctl`: the operator CLI of the training platform (`python -m trainctl --help`).

Subcommands live in their own modules and are listed in `trainctl.cli` (SUBCOMMANDS): pin,
fabric-check, preflight (trainctl/preflight/), submit, status, logs, capacity, scale, rehearse
(trainctl/commands/) and goodput. Exit codes are shared by every subcommand (trainctl.exit_codes).
"""
