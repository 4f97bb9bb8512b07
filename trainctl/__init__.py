"""`trainctl`: the operator CLI of the training platform (`python -m trainctl --help`).

Subcommands live in their own modules and register themselves in `trainctl.cli`:
`pin` (trainctl.pin) resolves the image lock's tags to digests. Exit codes are shared by
every subcommand (trainctl.exit_codes).
"""
