"""Which tier a test belongs to, decided from what it uses, never from a list of tests (docs/testing.md, Tiers).

A test gets the `training` marker (out of `make test-fast`, in `make test`) when it starts real torch.distributed,
Ray or NVRx processes: when a fixture it uses (directly or through other fixtures), or a function of tests/ that
it or those fixtures call, is tagged `@starts_training_processes`. The tag sits on the few helpers and fixtures
that start such processes, so a new test that uses one is classified without anyone listing it.

The classification is checked while the tests run: `TrainingProcessGuard` sees every process a test starts
(an audit hook on `subprocess.Popen`) and fails a test that the fast tier would run and that started a training
process anyway, naming the command and the fix. So a miss cannot make the fast tier slow without being seen.
"""

from __future__ import annotations

import itertools
import os
import re
import sys
import types
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"

# The markers that take a test out of the fast tier; `make test-fast` deselects each (Makefile FAST).
TRAINING = "training"
REHEARSAL = "rehearsal"
FULL_REHEARSAL = "full_rehearsal"
OUT_OF_FAST = (REHEARSAL, "slow", TRAINING, "image_env", FULL_REHEARSAL, "gpu_bundle")
# Markers whose tests `make test` (CI) does not run, each with the reason (tests/test_tiers.py).
OUTSIDE_CI: dict[str, str] = {
    "image_env": "needs the per-image virtualenvs (make image-envs: about 5.7 GB to download and 12.5 GB of disk, "
    "44 min to build on this machine; docs/testing.md), which CI's 90 minutes cannot afford; run by make test-image",
    "gpu_bundle": "needs .gpu-bundle/, the wheels make gpu-bundle downloads for the lent GPU machine (about 50 MiB "
    "from the package index); make gpu-bundle runs it after the download",
    FULL_REHEARSAL: "a process-level rehearsal whose behaviour a cheaper test proves (docs/testing.md names it); CI "
    "runs CI_REHEARSALS only, to keep make test inside its 12 minutes; run by make test-rehearsal",
}

# The process-level rehearsals `make test` (CI) runs: a module of tests/rehearse (all its `rehearsal` tests) or one
# test, each with what only it proves. Every other `rehearsal` test is marked `full_rehearsal` at collection and runs
# in `make test-rehearsal` only. A rehearsal costs CI seconds to minutes on 2 cores: add one here only for a behaviour
# that no fake-runtime, unit or training-process test can show, and say which (docs/testing.md, the budgets).
CI_REHEARSALS: dict[str, str] = {
    "tests/rehearse/test_harness.py": "namespaces: private emptyDir and /tmp, a shared claim, ConfigMap files, "
    "headless-Service DNS, hostnames and JOB_COMPLETION_INDEX, real exit codes through backoffLimit and "
    "podFailurePolicy, --kill as a DisruptionTarget, the loopback fallback, NetworkPolicy enforced in the pods' "
    "network namespaces",
    "tests/rehearse/test_container_restarts.py": "the kubelet's restarts of real processes per restartPolicy, init "
    "containers and native sidecars, with the back-off",
    "tests/rehearse/test_pod_api.py": "native sidecars around a real main container, start errors (128), termination "
    "messages from the file and the log",
    "tests/rehearse/test_reaping.py": "many sub-second pods reaped without a lost exit",
    "tests/rehearse/test_image_python.py": "an image's containers run its own Python first on PATH",
    "tests/rehearse/test_input_runs.py": "trainctl rehearse as a user runs it: a directory and generateName, "
    "--skip-unsupported's exit 3, Ctrl-C stopping every pod, and the README's command, which is the NVRx chart's "
    "pod-loss rehearsal: pod 1 lost uncounted, then pod 0 (the rendezvous host) costing one counted failure, the job "
    "resuming from the claim both times",
    "tests/rehearse/cluster/test_cluster_rehearsal.py": "real pods on the cluster model's nodes: placement, a pod "
    "Pending with kube-scheduler's reason, node loss in scaled cluster time, the CLI's options",
    "tests/rehearse/test_nvrx_faults.py::test_a_sigkilled_rank_is_restarted_by_ft_launcher_from_the_last_committed_"
    "checkpoint": "a SIGKILLed rank inside the chart's pods: ft_launcher's any-failed restart on both pods, the "
    "resume from the last committed checkpoint on the claim",
    "tests/rehearse/cluster/test_fabric_gate_rehearsal.py::test_a_node_the_gate_fails_under_the_ray_job_is_tainted_"
    "and_the_retried_cluster_completes_elsewhere": "the fabric gate in a real Ray job: the worker posts its verdict "
    "with the pod's token, the remediation controller runs as its Deployment's pod and, through the API server (RBAC "
    "and admission policy deciding), taints the node and lowers the ClusterQueue; the driver exits 75, KubeRay "
    "retries on a new cluster placed off the taint, Kueue keeps the admission; a stranger pod is refused the head's "
    "ports by the emitted NetworkPolicies",
    "tests/rehearse/test_rayjob.py::test_a_minimal_ray_is_refused_before_any_pod_starts": "the refusal of a Ray "
    "without the dashboard's dependencies, before any pod starts",
}


def in_ci_rehearsals(nodeid: str) -> bool:
    return any(nodeid == key or nodeid.startswith(key + "::") for key in CI_REHEARSALS)


def mark_full_rehearsals(items: Sequence[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker(REHEARSAL) and not in_ci_rehearsals(item.nodeid.split("[", 1)[0]):
            item.add_marker(FULL_REHEARSAL)


F = TypeVar("F", bound=Callable[..., Any])
_TAG = "__starts_training_processes__"


def starts_training_processes(func: F) -> F:
    """Tags a fixture or helper that starts torch.distributed, Ray or NVRx processes (put it under @pytest.fixture)."""
    setattr(func, _TAG, True)
    return func


def _tagged(obj: object) -> bool:
    return bool(getattr(obj, _TAG, False)) or bool(getattr(getattr(obj, "__wrapped__", None), _TAG, False))


def _in_tests(func: types.FunctionType) -> bool:
    return _file_in_tests(func.__code__.co_filename)


@cache
def _file_in_tests(filename: str) -> bool:  # cached: a path resolves in 0.1 ms, asked ~15,000 times a collection
    try:
        return Path(filename).resolve().is_relative_to(TESTS)
    except (OSError, ValueError):
        return False


def _names(code: types.CodeType) -> Iterable[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):  # nested functions, lambdas, comprehensions
            yield from _names(const)


def reaches_training_processes(func: object, seen: set[int] | None = None) -> bool:
    """Whether `func` is tagged or calls, through functions defined under tests/, one that is."""
    if _tagged(func):
        return True
    func = getattr(func, "__wrapped__", func)
    if not isinstance(func, types.FunctionType) or not _in_tests(func):
        return False
    seen = set() if seen is None else seen
    if id(func) in seen:
        return False
    seen.add(id(func))
    scope = func.__globals__
    return any(reaches_training_processes(scope[name], seen) for name in _names(func.__code__) if name in scope)


def _fixture_functions(item: pytest.Item) -> Iterable[object]:
    """The functions of the fixtures a test uses, and of those it takes by a parameter's name
    (`request.getfixturevalue(name)` with the name from @pytest.mark.parametrize)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return
    for name in getattr(item, "fixturenames", ()):
        for fixturedef in info.name2fixturedefs.get(name, ()):
            yield fixturedef.func
    callspec = getattr(item, "callspec", None)
    manager = item.session._fixturemanager
    for value in callspec.params.values() if callspec else ():
        if isinstance(value, str) and value.isidentifier():
            for fixturedef in manager.getfixturedefs(value, item) or ():
                yield fixturedef.func


def is_training_test(item: pytest.Item) -> bool:
    if item.get_closest_marker(TRAINING):
        return True
    function = getattr(item, "function", None)
    if function is not None and reaches_training_processes(function):
        return True
    return any(reaches_training_processes(func) for func in _fixture_functions(item))


def classify(items: Sequence[pytest.Item]) -> None:
    for item in items:
        if not item.get_closest_marker(TRAINING) and is_training_test(item):
            item.add_marker(TRAINING)


def in_fast_tier(item: pytest.Item) -> bool:
    return not any(item.get_closest_marker(name) for name in OUT_OF_FAST)


# What a training process is, as the guard sees a command line.
LAUNCHERS = frozenset({"ft_launcher", "torchrun", "gcs_server", "raylet"})
LAUNCHER_MODULES = frozenset({"torch.distributed.run", "nvidia_resiliency_ext.fault_tolerance.launcher"})
_USES_DISTRIBUTED = re.compile(
    r"^\s*(?:from|import)\s+(?:torch\.distributed|ray|nvidia_resiliency_ext)\b|init_process_group\(", re.MULTILINE
)


# A program given with -c may import them only to check an API; it is a training process if it joins a group.
_JOINS = re.compile(r"init_process_group\(|\bray\.init\(")


@cache
def _module_starts_training(module: str) -> bool:
    """A module of this repository that imports torch.distributed, Ray or NVRx or joins a process group."""
    path = ROOT.joinpath(*module.split("."))
    source = path.with_suffix(".py") if path.with_suffix(".py").is_file() else path / "__main__.py"
    return source.is_file() and bool(_USES_DISTRIBUTED.search(source.read_text(encoding="utf-8")))


# Subcommands of such a module that join no process group: the gate's offline judge and its supervisor (which only
# waits on the command it is given; that command is the guarded one).
OFFLINE_SUBCOMMANDS = {"training.fabric_gate": frozenset({"judge", "supervise"})}


def training_command(argv: Sequence[str]) -> bool:
    if any(os.path.basename(arg) in LAUNCHERS for arg in argv):
        return True
    for i, (flag, module) in enumerate(itertools.pairwise(argv)):
        if flag == "-c":
            return bool(_JOINS.search(module))
        if flag == "-m":
            subcommand = argv[i + 2] if i + 2 < len(argv) else ""
            if subcommand in OFFLINE_SUBCOMMANDS.get(module, frozenset()):
                return False
            return module in LAUNCHER_MODULES or _module_starts_training(module)
    return False


class TrainingProcessGuard:
    """Records the training processes each test starts; installed once per pytest process (tests/conftest.py)."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.watching = False
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.watching or event != "subprocess.Popen":
            return
        argv = args[1]
        if isinstance(argv, (str, bytes, os.PathLike)):
            argv = [argv]
        words = [os.fsdecode(a) for a in argv]
        if training_command(words):
            self.started.append(" ".join(words)[:300])

    def verdict(self, item: pytest.Item) -> str | None:
        """Why a fast-tier test failed the classification, or None."""
        if not self.started or not in_fast_tier(item):
            return None
        return (
            f"{item.nodeid} is in the fast tier but started a training process: {self.started[0]}\n"
            "Tag the fixture or helper that starts it with @tests.tiers.starts_training_processes "
            f"(or mark the test @pytest.mark.{TRAINING}) so `make test-fast` leaves it to `make test`."
        )
