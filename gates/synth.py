"""`python -m gates.synth OUT`: the app synthesized once, in this process, with cdk-nag's AwsSolutions checks
attached, into OUT: the cloud assembly (every stage's templates and assets), cdk-nag's validation report and the
acknowledgments that matched a construct. `make test` shares it: the gates read it (`python -m gates
--cdk-out OUT --nag-from-cdk-out`) and pytest reads it (CDK_SYNTH_OUT=OUT, tests/conftest.py), so the app is
synthesized once per run (tests/infra/test_stability.py synthesizes once more and compares every template byte
for byte). The validation plugin reads the templates and writes its report; it changes none of them.

This is the in-process synth the tests have always read, not `cdk synth`'s: the CLI also turns on version reporting,
which adds one CDKMetadata resource per stack (9 of the 304 resources `make check` counts). `make synth` and
`make check` run the CLI, and tests/test_app.py runs it in `make test`.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import aws_cdk as cdk

from gates.nag import USED_FILE, attach, synth
from gates.nag_acknowledgments import ACKNOWLEDGMENTS

ROOT = Path(__file__).resolve().parent.parent


def app_factory(outdir: str) -> tuple[cdk.App, Sequence[cdk.Stack]]:
    """The app as `cdk synth` builds it (cdk.json's context), writing into `outdir`, and every stack of it."""
    from app import create_app

    context = json.loads((ROOT / "cdk.json").read_text())["context"]
    app, stages = create_app(context=context, environ={}, outdir=outdir)
    return app, [stack for stage in stages for stack in stage.stacks]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gates.synth", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, metavar="OUT", help="the cloud assembly's directory (emptied first)")
    out: Path = parser.parse_args(argv).out
    shutil.rmtree(out, ignore_errors=True)
    app, stacks = app_factory(str(out))
    used = attach(app, stacks, ACKNOWLEDGMENTS)
    synth(app)
    (out / USED_FILE).write_text(json.dumps({"used": sorted(used)}) + "\n")
    print(f"synthesized {len(stacks)} stacks into {out}, cdk-nag attached")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
