"""Thin `trainctl` subcommands: flags and output over a library (the emulator in `rehearse/`, the clients here)."""
