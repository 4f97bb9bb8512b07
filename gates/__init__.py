"""Security and validation gates over what `make synth` writes (`make check`).

Each gate returns findings; any finding fails the gate. `python -m gates` runs them all.
"""
