"""The tiers (docs/testing.md): `make test` runs every test, `make test-fast` leaves out exactly the markers
tests/tiers.py names, and the `training` marker follows the fixtures and helpers a test uses."""

from __future__ import annotations

import ast
import itertools
import os
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator

import pytest
from _pytest.mark.expression import Expression

from tests import tiers
from tests.conftest import ROOT

STAMPS = (".venv/.installed", "node_modules/.installed", ".venv-checkov/.installed")


def declared_markers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    return [line.split(":", 1)[0].strip() for line in config["markers"]]


def dry_run(target: str) -> list[list[str]]:
    """The command lines `make TARGET` runs, as make prints them without running anything."""
    assumed = [arg for stamp in STAMPS for arg in ("-o", stamp)]  # treat the toolchain as installed
    # Run inside `make test`, this process inherits the outer make's variables: a variable set on make's command
    # line (BESIDE_REHEARSALS=1) reaches every make below through MAKEFLAGS and every recipe's environment. Ask as a
    # user's shell would.
    inherited = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "BESIDE_REHEARSALS")
    env = {k: v for k, v in os.environ.items() if k not in inherited}
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", *assumed, target],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return [shlex.split(line) for line in done.stdout.splitlines()]


def make_commands(target: str) -> list[list[str]]:
    """dry_run's command lines without the `nice -n N` they may run under."""
    return [without_nice(line) for line in dry_run(target)]


def niceness(line: list[str]) -> int:
    """The `nice -n N` a command line runs under (after its VAR=value assignments), 0 without one."""
    words = [w for w in line if "=" not in w or w.startswith("-")]
    return int(words[2]) if words[:2] == ["nice", "-n"] else 0


def without_nice(line: list[str]) -> list[str]:
    start = next((i for i, w in enumerate(line) if "=" not in w), len(line))
    return line[:start] + line[start + 3 :] if line[start : start + 2] == ["nice", "-n"] else line


def pytest_runs(target: str) -> list[list[str]]:
    """The pytest command lines `make TARGET` runs, each from its first argument."""
    return [argv[argv.index("pytest") + 1 :] for argv in make_commands(target) if "pytest" in argv]


def marker_expression(argv: list[str]) -> str | None:
    return argv[argv.index("-m") + 1] if "-m" in argv else None


def selects(expression: str | None, markers: set[str]) -> bool:
    if expression is None:
        return True
    return Expression.compile(expression).evaluate(lambda name, /, **_: name in markers)


def marker_sets(names: list[str]) -> Iterator[set[str]]:
    for size in range(len(names) + 1):
        for chosen in itertools.combinations(names, size):
            yield set(chosen)


def test_make_test_runs_every_combination_of_markers_on_the_whole_suite() -> None:
    runs = pytest_runs("test")
    assert runs, "make test runs no pytest"
    for argv in runs:
        # No narrowing but by marker: no paths, -k, --deselect or --ignore.
        plugins = {value for flag, value in itertools.pairwise(argv) if flag == "-p"}  # make bench's -p tests.cpu_time
        narrowing = [
            a
            for a in argv
            if a.startswith(("-k", "--deselect", "--ignore")) or (a.startswith("tests") and a not in plugins)
        ]
        assert narrowing == [], f"make test narrows a pytest run by {narrowing}"
    names = declared_markers()
    for markers in marker_sets(names):
        chosen = [argv for argv in runs if selects(marker_expression(argv), markers)]
        reason = [tiers.OUTSIDE_CI[m] for m in markers if m in tiers.OUTSIDE_CI]
        assert chosen or reason, f"a test marked {sorted(markers) or 'with no marker'} runs in no pytest of make test"


def test_make_test_fast_leaves_out_exactly_the_markers_of_tiers() -> None:
    (argv,) = pytest_runs("test-fast")
    expression = marker_expression(argv)
    assert selects(expression, set()), "the fast tier must run the unmarked tests"
    for name in declared_markers():
        assert selects(expression, {name}) is (name not in tiers.OUT_OF_FAST), name


def test_every_module_with_tests_is_collected_by_pytest() -> None:
    """pytest collects test_*.py under tests/ (pyproject testpaths): a test in a file named otherwise never runs."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert config["testpaths"] == ["tests"]
    assert "python_files" not in config
    assert "norecursedirs" not in config
    assert "collect_ignore" not in config
    stray = []
    for path in (ROOT / "tests").rglob("*.py"):
        if path.name.startswith("test_") or "__snapshots__" in path.parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(n, ast.FunctionDef) and n.name.startswith("test_") for n in tree.body):
            stray.append(str(path.relative_to(ROOT)))
    assert stray == [], f"test functions in files pytest does not collect: {stray}"


# The classification of tests/tiers.py on small functions of its own.


@tiers.starts_training_processes
def _launches() -> None:
    """Stands for a helper that starts ranks."""


def _calls_a_launcher() -> None:
    _launches()


def _calls_something_else() -> None:
    len("nothing")


def test_a_function_reaching_a_tagged_helper_is_training() -> None:
    assert tiers.reaches_training_processes(_calls_a_launcher)
    assert tiers.reaches_training_processes(lambda: _calls_a_launcher())
    assert not tiers.reaches_training_processes(_calls_something_else)


def test_the_suites_launchers_are_classified(request: pytest.FixtureRequest) -> None:
    """The NVRx runs' fixtures reach the tagged launcher; a parser test of the same module and this test do not."""
    from tests.training import conftest, test_nvrx_fsdp

    assert tiers.reaches_training_processes(conftest.nvrx_reference)  # through tests/training/nvrx_runs.launch
    assert tiers.reaches_training_processes(conftest.nvrx_sigkill)
    assert not tiers.reaches_training_processes(conftest.tiny_model_dir)
    assert not tiers.reaches_training_processes(test_nvrx_fsdp.test_store_addr_forms)
    assert not tiers.is_training_test(request.node)


@pytest.mark.parametrize(
    ("argv", "training"),
    [
        (["/v/bin/ft_launcher", "--standalone", "-m", "training.nvrx_fsdp"], True),
        ([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"], True),
        ([sys.executable, "-m", "training.fabric_probe", "--device", "cpu"], True),  # joins a process group
        ([sys.executable, "-m", "tests.fabric_gate.gate_worker", "0", "2"], True),
        ([sys.executable, "-m", "training.fabric_analyzer", "-"], False),  # standard library only
        ([sys.executable, "-m", "k8s.check_lock", "out.json"], False),
        # The gate's offline modes join no process group (the in-job gate runs inside the training process).
        ([sys.executable, "-m", "training.fabric_gate", "judge", "--nodes", "2", "x.log"], False),
        ([sys.executable, "-m", "training.fabric_gate", "supervise", "--", "python", "-c", "pass"], False),
        (["bash", "-n", "scripts/gpu_smoke.sh"], False),
        # A program given with -c: one that joins a process group or starts Ray is a training process; one that
        # imports them to check an API (the image's import check, the Ray CLI's parser) is not.
        ([sys.executable, "-c", "import torch.distributed as dist\ndist.init_process_group('gloo')"], True),
        ([sys.executable, "-c", "import ray\nray.init(num_cpus=1)"], True),
        ([sys.executable, "-c", "from nvidia_resiliency_ext.inprocess import Wrapper"], False),
        ([sys.executable, "-c", "pass", "torchrun"], True),  # the launcher's name anywhere still counts
    ],
)
def test_training_commands(argv: list[str], training: bool) -> None:
    assert tiers.training_command(argv) is training


def test_the_guard_sees_a_training_process_that_an_unmarked_test_starts(request: pytest.FixtureRequest) -> None:
    # conftest's guard sees these processes too; the marker this test gets at its end is what lets it pass.
    guard = tiers.TrainingProcessGuard()
    guard.watching = True
    # A real process whose command line names a launcher (it runs `pass`): the audit event is what counts.
    subprocess.run([sys.executable, "-c", "pass", "torchrun"], check=True)
    guard.watching = False
    subprocess.run([sys.executable, "-c", "pass", "torchrun"], check=True)  # not watching: not recorded
    assert len(guard.started) == 1
    assert "torchrun" in guard.started[0]
    problem = guard.verdict(request.node)
    assert problem is not None
    assert "@tests.tiers.starts_training_processes" in problem
    request.node.add_marker(tiers.TRAINING)
    assert guard.verdict(request.node) is None  # a marked test may start them


def test_make_test_runs_every_gate_over_a_fresh_synth() -> None:
    # The whole-synth gate runs live in `make check` only (tests/gates test each gate on small inputs): pytest
    # copies of cdk-nag, cfn-lint, checkov and the manifests gate over the same synth ran them twice per make test.
    from gates.__main__ import GATES

    runs = make_commands("test")
    gate_runs = [argv for argv in runs if argv[:3] == ["python", "-m", "gates"]]
    assert len(gate_runs) == 1, runs
    assert "--only" not in gate_runs[0]
    # One synth, shared: python -m gates.synth writes it (cdk-nag attached), the gates read its nag report, the
    # parallel pytest reads the same assembly (CDK_SYNTH_OUT); no `cdk synth` besides.
    (synth,) = [argv for argv in runs if argv[:3] == ["python", "-m", "gates.synth"]]
    out = synth[3]
    gates = gate_runs[0]
    assert gates[gates.index("--cdk-out") + 1] == out
    assert "--nag-from-cdk-out" in gates
    shared = [argv for argv in runs if "pytest" in argv and "-n" in argv]
    assert shared, runs
    assert all(argv[0] == f"CDK_SYNTH_OUT={ROOT / out}" for argv in shared), shared
    assert not [argv for argv in runs if argv[:2] == ["cdk", "synth"]], runs
    assert set(GATES) == {"templates", "cfn-lint", "manifests", "checkov", "runtime-packages", "cdk-nag"}


def test_make_test_runs_everything_beside_the_ci_rehearsals_at_a_lower_priority() -> None:
    # The rehearsals' processes keep real timers (Ray's 30 s wait for its own raylet took a head down in CI when the
    # synth, mypy and the parallel pytest shared the 2 cores with them at the same priority).
    lines = dry_run("test")
    rehearsals = [line for line in lines if "pytest" in line and "not full_rehearsal" in " ".join(line)]
    rest = [line for line in lines if line not in rehearsals and not line[0].startswith("make")]
    assert len(rehearsals) == 1, lines
    assert niceness(rehearsals[0]) == 0
    assert rest
    assert [line[:4] for line in rest if niceness(line) == 0] == []
    # make test-fast has no rehearsals to yield to: nothing there is niced.
    assert [line[:4] for line in dry_run("test-fast") if niceness(line) != 0] == []


def test_every_ci_rehearsal_names_a_module_or_test_that_exists() -> None:
    """A renamed or deleted rehearsal must leave tiers.CI_REHEARSALS in the same change (no silent gap in CI)."""
    for key, behaviour in tiers.CI_REHEARSALS.items():
        module, _, name = key.partition("::")
        path = ROOT / module
        assert module.startswith("tests/rehearse/"), key
        assert path.is_file(), key
        tests = {n.name for n in ast.parse(path.read_text(encoding="utf-8")).body if isinstance(n, ast.FunctionDef)}
        assert not name or name in tests, f"{key}: no such test in {module}"
        assert behaviour.strip(), f"{key}: say what only it proves"


def test_a_rehearsal_outside_the_ci_list_is_full_and_one_inside_is_not() -> None:
    inside = "tests/rehearse/test_harness.py::test_an_unknown_network_choice_is_refused"
    outside = (
        "tests/rehearse/test_nvrx_faults.py::test_a_rank_exception_is_recovered_from_the_last_committed_checkpoint"
    )
    assert tiers.in_ci_rehearsals(inside)
    assert not tiers.in_ci_rehearsals(outside)
    assert not tiers.in_ci_rehearsals("tests/rehearse/test_harness.py_other::x")
