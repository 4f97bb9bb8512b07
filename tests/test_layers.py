"""The import layers of docs/layout.md, enforced: an AST walk over every module (imports inside functions
and `if TYPE_CHECKING:` blocks included) fails on any edge between layers that LAYERS does not allow and
EXCEPTIONS does not list, and docs/layout.md must state the same table and the same exceptions."""

from __future__ import annotations

import ast
import functools
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = (
    "app.py",
    "infra",
    "k8s",
    "training",
    "fabric_controller",
    "capacity_hold",
    "trainctl",
    "rehearse",
    "gates",
    "scripts",
)

# Layer (a dotted prefix; the longest one that matches a module is its layer) -> the layers it may import.
# Only imports of this repository's own packages are checked here; infra/spec's third-party imports below.
LAYERS: dict[str, tuple[str, ...]] = {
    "app": ("infra",),
    "infra.spec": ("infra.spec",),
    "infra": ("infra",),
    "k8s": (
        "k8s",
        "infra.spec",
        "training.emf",
        "training.nvrx_config",
        "training.fabric_gate",
        "training.fabric_verdict",
        "training.deadline",
        "fabric_controller.config",
        "capacity_hold.config",
        "capacity_hold.decide",
    ),
    "training": ("training",),
    "fabric_controller": ("fabric_controller", "training.fabric_verdict", "training.kube_api", "training.rehearsal"),
    "capacity_hold": ("capacity_hold", "training.fabric_verdict", "training.kube_api", "training.rehearsal"),
    "rehearse": ("rehearse", "training", "k8s", "infra.spec", "fabric_controller"),
    "trainctl": ("trainctl", "infra.spec", "k8s", "training", "capacity_hold.config", "capacity_hold.decide"),
    "trainctl.commands": ("trainctl", "infra.spec", "k8s", "training", "rehearse"),
    "gates": ("gates", "infra.spec", "k8s", "app"),
    "scripts": ("scripts", "app", "infra", "k8s", "training", "fabric_controller", "trainctl", "rehearse", "gates"),
}

# (importing module, imported module) -> why the edge is there. Each must still exist (test below).
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("infra.spec.metrics", "training.emf"): "the EMF metric names live where the pods write them (training/ ships "
    "to the pods without infra/); the alarms read them from there",
    ("infra.addons.kueue", "k8s.queueing"): "the Kueue queue objects are built in k8s/queueing.py; moving the pure "
    "builders to infra/spec is another branch's work (issue 21)",
    ("training.fabric_gate", "infra.spec.errors"): "judge mode only (an operator's machine, lazily imported): the "
    "offline judge reads the floors where the platform keeps them; the pods never take that path",
    ("training.fabric_gate", "infra.spec.fabric_floors"): "judge mode only, as above",
    ("infra.images", "k8s.built_images"): "the image build's FROM is the lock's nvrx-train (with its digest), which "
    "k8s/built_images.py reads for every build of images/nvrx (the CodeBuild project and scripts/build_nvrx_image.sh)",
    ("trainctl.commands.plan", "infra.stage"): "trainctl plan synthesizes the app in-process to compare it with the "
    "committed template snapshots",
    ("trainctl.template_plan", "gates.outputs"): "the plan resolves Platform outputs the way the templates gate does",
    ("rehearse.validation", "gates.manifests"): "one schema machinery: the rehearsal validates input with the same "
    "Kubernetes 1.36 schema and CRDs as the manifests gate",
}

# infra/spec is pure data: no construct library.
SPEC_FORBIDDEN = ("aws_cdk", "constructs", "cdk8s", "jsii")

# training/ modules that ship to the pods and are imported without torch: standard library and each other only.
STDLIB_ONLY = (
    "training.emf",
    "training.journal",
    "training.nvrx_config",
    "training.faults",
    "training.rehearsal",
    "training.fabric_gate_config",
    "training.fabric_analyzer",
    "training.fabric_verdict",
    "training.kube_api",
    "training.deadline",
)
# The controllers ship as source to a plain Python image (k8s/charts/small_controller.py): all of them.
STDLIB_ONLY_PACKAGES = ("fabric_controller", "capacity_hold")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> Iterator[tuple[str, Path]]:
    for source in SOURCES:
        path = ROOT / source
        for file in [path] if path.is_file() else sorted(path.rglob("*.py")):
            yield module_name(file), file


def imports(name: str, path: Path) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import statement in the file, wherever it is."""
    return iter(_imports(name, path))


@functools.cache
def _imports(name: str, path: Path) -> tuple[tuple[str, int], ...]:
    """Each file parsed once a session: most tests here walk every file."""
    return tuple(_walk_imports(name, path))


def _walk_imports(name: str, path: Path) -> Iterator[tuple[str, int]]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            yield target, node.lineno
            for alias in node.names:  # `from trainctl import capacity` imports the module trainctl.capacity
                yield f"{target}.{alias.name}", node.lineno


def within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> str | None:
    matches = [layer for layer in LAYERS if within(module, layer)]
    return max(matches, key=len) if matches else None


OWN = {module for module, _ in modules()}


def own(target: str) -> bool:
    return target in OWN


def edges() -> Iterator[tuple[str, str, Path, int]]:
    for name, path in modules():
        for target, line in imports(name, path):
            if own(target):
                yield name, target, path, line


def test_every_edge_between_layers_is_allowed_or_a_listed_exception() -> None:
    wrong = []
    for name, target, path, line in edges():
        layer = layer_of(name)
        assert layer is not None, f"{name} is in no layer of LAYERS"
        if any(within(target, allowed) for allowed in LAYERS[layer]) or (name, target) in EXCEPTIONS:
            continue
        wrong.append(f"{path.relative_to(ROOT)}:{line}: {name} ({layer}) imports {target}")
    assert not wrong, "imports against the layers of docs/layout.md:\n" + "\n".join(wrong)


def test_every_listed_exception_is_still_needed() -> None:
    present = {(name, target) for name, target, _, _ in edges()}
    stale = [edge for edge in EXCEPTIONS if edge not in present]
    assert not stale, f"remove from EXCEPTIONS (and docs/layout.md), the import is gone: {stale}"


def test_infra_spec_imports_no_construct_library() -> None:
    wrong = [
        f"{path.relative_to(ROOT)}:{line}: {target}"
        for name, path in modules()
        if within(name, "infra.spec")
        for target, line in imports(name, path)
        if target.split(".")[0] in SPEC_FORBIDDEN
    ]
    assert not wrong, f"infra/spec is pure data: {wrong}"


def test_the_modules_that_ship_to_pods_without_torch_import_the_standard_library_only() -> None:
    def allowed(target: str) -> bool:
        top = target.split(".")[0]
        # `from training import faults` names the package and then training.faults, which is checked itself.
        shipped = target in (*STDLIB_ONLY, "training") or any(within(target, p) for p in STDLIB_ONLY_PACKAGES)
        return top in sys.stdlib_module_names or top == "__future__" or shipped

    wrong = [
        f"{path.relative_to(ROOT)}:{line}: {target}"
        for name, path in modules()
        if name in STDLIB_ONLY or any(within(name, p) for p in STDLIB_ONLY_PACKAGES)
        for target, line in imports(name, path)
        if not allowed(target) and (own(target) or not target.startswith("training."))
    ]
    assert not wrong, f"standard library only (these ship to the pods and parse flags without torch): {wrong}"


def command_modules() -> set[str]:
    """trainctl modules that register a subcommand (a module-level add_parser)."""
    found = set()
    for name, path in modules():
        if not within(name, "trainctl"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(node, ast.FunctionDef) and node.name == "add_parser" for node in tree.body):
            found.add(name)
    return found


def test_every_trainctl_command_lives_in_trainctl_commands() -> None:
    """A module with add_parser is a command, and commands live under trainctl/commands/ (each one a command),
    so a library module holds no argparse wiring."""
    commands = command_modules()
    package = {name for name, _ in modules() if within(name, "trainctl.commands") and name != "trainctl.commands"}
    assert {"trainctl.commands.preflight", "trainctl.commands.scale", "trainctl.commands.pin"} <= commands
    assert commands == package, (
        f"add_parser outside trainctl/commands/: {sorted(commands - package)}; "
        f"trainctl/commands/ modules without add_parser: {sorted(package - commands)}"
    )


def test_no_trainctl_command_imports_another() -> None:
    commands = command_modules()
    wrong = [
        f"{path.relative_to(ROOT)}:{line}: {name} imports {target}"
        for name, target, path, line in edges()
        if name in commands and target in commands and target != name
    ]
    assert not wrong, f"a command imports another command (share a library module instead): {wrong}"


SHELL = ("trainctl.cli", "trainctl.__main__")
"""The parser that lists every command: the only trainctl modules outside trainctl/commands/ that import it."""


def test_the_trainctl_library_never_imports_the_commands() -> None:
    """trainctl.commands may import the client modules (aws, eks_auth, kube, scale, ...), never the reverse,
    so the client modules read as a library."""
    wrong = [
        f"{path.relative_to(ROOT)}:{line}: {name} imports {target}"
        for name, target, path, line in edges()
        if within(name, "trainctl")
        and not within(name, "trainctl.commands")
        and name not in SHELL
        and within(target, "trainctl.commands")
    ]
    assert not wrong, f"the trainctl library imports a command (trainctl/commands/): {wrong}"


def test_the_parser_imports_only_the_commands() -> None:
    """trainctl/cli.py builds the parser from trainctl/commands/ and maps run's result to an exit code."""
    name, path = "trainctl.cli", ROOT / "trainctl/cli.py"
    wrong = [
        f"{path.relative_to(ROOT)}:{line}: {target}"
        for target, line in imports(name, path)
        if own(target) or target in ("trainctl", "trainctl.commands")
        if not (within(target, "trainctl.commands") or target == "trainctl.exit_codes")
    ]
    assert not wrong, f"trainctl/cli.py imports more than trainctl.commands and trainctl.exit_codes: {wrong}"


# trainctl modules outside the parser and the commands that may import argparse, and why.
ARGPARSE_SHELL: dict[str, str] = {
    "trainctl.flags": "the shared flag groups every command adds (--env, AWS options, output, connection)",
    "trainctl.arguments": "the argparse value types flags.py and the commands use (environment names, seconds, "
    "node counts, regions, [KEY=]URL): an ArgumentTypeError is argparse's exit 2 with the message",
}


def test_the_trainctl_library_does_not_import_argparse() -> None:
    """The client modules are a library: argument handling is the commands' (and flags.py's) job."""
    wrong = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for name, path in modules()
        if within(name, "trainctl") and not within(name, "trainctl.commands") and name not in (*SHELL, *ARGPARSE_SHELL)
        for target, line in imports(name, path)
        if target.split(".")[0] == "argparse"
    ]
    assert not wrong, f"a trainctl library module imports argparse (move the flags to its command): {wrong}"


def test_every_argparse_exception_still_imports_it() -> None:
    stale = [
        name
        for name, path in modules()
        if name in ARGPARSE_SHELL and not any(target == "argparse" for target, _ in imports(name, path))
    ]
    assert not stale, f"remove from ARGPARSE_SHELL (and docs/layout.md): {stale}"


def documented_layers() -> tuple[dict[str, tuple[str, ...]], set[tuple[str, str]]]:
    """The table and the exceptions of docs/layout.md's "Layers" section."""
    text = (ROOT / "docs/layout.md").read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    table = {}
    for row in re.findall(r"^\| `([\w.]+)` \| (.+) \|$", section, re.M):
        table[row[0]] = tuple(re.findall(r"`([\w.]+)`", row[1]))
    exceptions = set(re.findall(r"^- `([\w.]+)` -> `([\w.]+)`", section, re.M))
    return table, exceptions


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_docs_layout_states_the_same_layers(layer: str) -> None:
    table, _ = documented_layers()
    assert set(table) == set(LAYERS)
    assert set(table[layer]) == set(LAYERS[layer]), f"docs/layout.md: {layer} may import {LAYERS[layer]}"


def test_docs_layout_lists_the_same_exceptions() -> None:
    _, exceptions = documented_layers()
    assert exceptions == set(EXCEPTIONS)


MAX_LINES = 600
"""The most lines a trainctl module may have (issue 25: preflight.py had grown to 1,452)."""


def test_no_trainctl_module_is_over_600_lines() -> None:
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines())
        for name, path in modules()
        if within(name, "trainctl")
    }
    assert len(sizes) > 40
    over = {path: lines for path, lines in sizes.items() if lines > MAX_LINES}
    assert not over, f"split these into modules named for what they hold (at most {MAX_LINES} lines): {over}"


def test_the_parser_lists_every_command_of_trainctl_commands_and_nothing_else() -> None:
    from trainctl import cli

    listed = [add_parser.__module__ for add_parser in cli.SUBCOMMANDS]
    assert all(within(module, "trainctl.commands") for module in listed), listed
    assert all(add_parser.__name__ == "add_parser" for add_parser in cli.SUBCOMMANDS)
    assert sorted(listed) == sorted(set(listed)) == sorted(command_modules()), "each command listed once"


def test_every_package_is_installed_and_type_checked() -> None:
    """The editable install maps only the packages pyproject.toml names: a package missing there imports from the
    checkout's root (where pytest runs) but not in the installed `trainctl`."""
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    installed = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    checked = set(pyproject["tool"]["mypy"]["files"])
    for source in SOURCES:
        if (ROOT / source / "__init__.py").is_file():
            assert f"{source}*" in installed, f"pyproject.toml [tool.setuptools.packages.find] include lacks {source}*"
            assert source in checked, f"pyproject.toml [tool.mypy] files lacks {source}"
