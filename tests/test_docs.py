"""Docs that cannot rot: README.md and docs/*.md are read and what they show is checked.

- every `trainctl ...` and `python -m <module> ...` command (in a code block or inline code) parses
  with the current argparse parser: its subcommand and flags exist. Synopsis notation is tolerated:
  `[optional parts]` are checked for their flags and left out of the parse, `(a | b)` parses the
  first alternative, placeholders (`<env>`, `NAME`, `FILE...`, `...`) stand for a value;
- every `make <target>` shown is a target of the Makefile;
- every repository path shown in backticks exists (generated, git-ignored paths excepted);
- figures quote the run they came from: a table of measured figures (a header with median, mean,
  p50..p99 or runs) has, within two lines above or below it, a line

      Measured: YYYY-MM-DD on <machine>[, anything else]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest import mock

import pytest

from infra.spec.namespaces import KUBERAY, TRAINING_NAMESPACES
from trainctl.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])

MEASURED_LINE = re.compile(r"^Measured: \d{4}-\d{2}-\d{2} on \S")
MEASURED_HEADER = re.compile(r"\b(median|mean|p50|p90|p95|p99|runs)\b", re.IGNORECASE)
PATH_EXTENSIONS = (".py", ".md", ".json", ".yaml", ".yml", ".toml", ".txt", ".dot", ".png", ".sh", ".cfg", ".ini")
PLACEHOLDER = re.compile(r"<[^>]*>|\.\.\.|^[A-Z][A-Z0-9_]*(=.*)?$|^[A-Z][A-Z0-9_]*\.\.\.$")
COMMAND_START = re.compile(r"^(trainctl|python3? -m|make) \S")


@dataclass(frozen=True)
class Shown:
    """A command or path as a document shows it, with where."""

    text: str
    where: str


def _code_spans(text: str) -> list[tuple[str, int]]:
    """(inline code, line number) outside fenced blocks; `\\|` (a pipe in a table cell) unescaped."""
    found: list[tuple[str, int]] = []
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            found += [(m.group(1).replace("\\|", "|"), number) for m in re.finditer(r"`([^`]+)`", line)]
    return found


def _block_lines(text: str) -> list[tuple[str, int]]:
    """(line, line number) inside fenced blocks, continuation lines joined, prompts and comments cut."""
    found: list[tuple[str, int]] = []
    fenced, pending, start = False, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        whole = (pending + line).strip().removeprefix("$ ")
        pending = ""
        whole = re.split(r"\s+#", whole, maxsplit=1)[0].strip()
        found.append((whole, start))
    return found


def _commands(piece: str) -> list[str]:
    """Commands in a shell line: split at &&, ||, ; and pipes (outside brackets), env assignments dropped."""
    parts, depth, current = [], 0, ""
    for token in re.split(r"(\s*(?:&&|\|\||;|\|)\s*|[()\[\]])", piece):
        if token in ("(", "["):
            depth += 1
        elif token in (")", "]"):
            depth -= 1
        if depth == 0 and token.strip() in ("&&", "||", ";", "|"):
            parts.append(current)
            current = ""
        else:
            current += token
    parts.append(current)
    out = []
    for part in parts:
        words = part.strip().split(" ")
        while words and re.match(r"^[A-Z_][A-Z0-9_]*=\S*$", words[0]):
            words.pop(0)
        command = " ".join(words)
        if COMMAND_START.match(command):
            out.append(command)
    return out


def shown_commands(path: Path) -> list[Shown]:
    text = path.read_text()
    name = path.relative_to(ROOT)
    found = []
    for piece, number in [*_code_spans(text), *_block_lines(text)]:
        found += [Shown(command, f"{name}:{number}") for command in _commands(piece)]
    return found


# --- parsing a shown command ------------------------------------------------------------------


def _reduce_synopsis(command: str) -> tuple[str, list[str]]:
    """(the command without optional groups and with the first of each alternative, every flag shown)."""
    flags = re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", command)
    reduced = command
    while True:
        shorter = re.sub(r"\[[^\[\]]*\]", " ", reduced)
        shorter = re.sub(r"\(([^()|]*)\|[^()]*\)", r"\1", shorter)
        if shorter == reduced:
            break
        reduced = shorter
    return re.sub(r"\s+", " ", reduced).strip(), flags


def _is_placeholder(token: str) -> bool:
    return bool(PLACEHOLDER.search(token))


def _argv(words: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """Placeholders replaced by a value the parser takes: an option's first choice, 1 for a typed value,
    else the text itself;
    a bare `...` (more of the same) dropped."""
    actions = {option: action for action in _all_actions(parser) for option in action.option_strings}
    argv: list[str] = []
    for word in words:
        if word in ("...", "…"):
            continue
        action = actions.get(argv[-1]) if argv else None
        if action is not None and _is_placeholder(word):
            if action.choices is not None:
                word = str(next(iter(action.choices)))
            elif action.type is not None:
                word = "1"  # a number stands in for a typed value (int, float, a non-negative number)
        argv.append(word.removesuffix("..."))
    return argv


def _all_actions(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:
        yield action
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _all_actions(sub)


class _StopAfterParseError(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__()
        self.parser = parser


def _main_module(module_name: str) -> ModuleType:
    """What `python -m module_name` runs: the module, or a package's __main__."""
    spec = importlib.util.find_spec(module_name)
    assert spec is not None, f"no module {module_name}"
    return importlib.import_module(f"{module_name}.__main__" if spec.submodule_search_locations else module_name)


def _module_parser(module_name: str, argv: list[str]) -> argparse.ArgumentParser:
    """The parser `python -m module` builds: its main(argv) runs up to parse_args, which parses
    (argparse exits 2 on an unknown flag) and then stops it."""
    module = _main_module(module_name)
    original = argparse.ArgumentParser.parse_args

    def parse(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        original(self, args, namespace)
        raise _StopAfterParseError(self)

    main = getattr(module, "main", None)
    assert callable(main), f"{module_name} has no main(argv) to read its parser from"
    with mock.patch.object(argparse.ArgumentParser, "parse_args", parse):
        try:
            main(argv)
        except _StopAfterParseError as parsed:
            return parsed.parser
    raise AssertionError(f"{module_name}.main({argv}) did not parse its arguments")


def check_command(command: str) -> str | None:
    """None when the command parses; else why not."""
    # A placeholder with spaces (`<GPUs of the group>`) is one word.
    command = re.sub(r"<[^>]*>", lambda m: m.group(0).replace(" ", "_"), command)
    reduced, flags = _reduce_synopsis(command)
    words = shlex.split(reduced)
    if words[0] == "make":
        return None  # checked by test_make_targets_exist
    if words[0] == "trainctl":
        parser, rest = build_parser(), words[1:]
    elif words[0].startswith("python") and words[1] == "-m":
        module, rest = words[2], words[3:]
        if module == "trainctl":
            parser = build_parser()
        else:
            try:
                parser = _module_parser(module, ["--help"])
            except SystemExit:  # --help printed: parse_args never returned
                parser = _help_parser(module)
    else:
        return f"not a command this test knows: {command}"
    flags = _reduce_synopsis(" ".join(shlex.split(command)[len(words) - len(rest) :]))[1]
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if rest and subcommands and _is_placeholder(rest[0]):  # `trainctl COMMAND --help`: any subcommand
        rest = [next(iter(subcommands[0].choices)), *rest[1:]]
    known = {option for action in _all_actions(parser) for option in action.option_strings}
    missing = sorted({f for f in flags if f.split("=")[0] not in known})
    if missing:
        return f"unknown flag(s) {', '.join(missing)}"
    argv = _argv(rest, parser)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            if words[0] == "trainctl" or module == "trainctl":
                parser.parse_args(argv)
            else:
                _module_parser(module, argv)
    except SystemExit as exc:
        if exc.code not in (0, None):
            return stderr.getvalue().strip().splitlines()[-1] if stderr.getvalue().strip() else f"exit {exc.code}"
    return None


def _help_parser(module_name: str) -> argparse.ArgumentParser:
    """For a main that parses `--help` itself (exits 0): catch the parser as it is built."""
    captured: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.parse_args

    def parse(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        captured.append(self)
        return original(self, args, namespace)

    with (
        mock.patch.object(argparse.ArgumentParser, "parse_args", parse),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.suppress(SystemExit),
    ):
        _main_module(module_name).main(["--help"])
    assert captured, f"{module_name} built no parser"
    return captured[0]


# --- the tests --------------------------------------------------------------------------------


def _all_shown() -> list[Shown]:
    return [shown for path in DOCS for shown in shown_commands(path)]


@pytest.mark.parametrize("shown", [s for s in _all_shown() if not s.text.startswith("make")], ids=lambda s: s.where)
def test_commands_parse_with_the_current_cli(shown: Shown) -> None:
    problem = check_command(shown.text)
    assert problem is None, f"{shown.where}: `{shown.text}` does not parse: {problem}"


def make_targets() -> set[str]:
    targets: set[str] = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.%$()/ -]+?)\s*:(?!=)", line)
        if match and not line.startswith("\t"):
            targets.update(match.group(1).split())
    return targets


def test_make_targets_exist() -> None:
    targets = make_targets()
    wrong = []
    for shown in _all_shown():
        words = shown.text.split()
        if words[0] != "make":
            continue
        for word in words[1:]:
            if word.startswith("-") or "=" in word:
                continue
            if word not in targets:
                wrong.append(f"{shown.where}: `{shown.text}`: no target {word!r} in the Makefile")
    assert not wrong, "\n".join(wrong)


def _looks_like_repo_path(span: str, top_level: set[str]) -> bool:
    if " " in span or any(c in span for c in "<>*{}$[]()=,@:") or span.startswith(("/", "http", "~", "-")):
        return False
    first = span.split("/", 1)[0]
    if first in top_level:
        return "/" in span or span.endswith(PATH_EXTENSIONS)
    return "." not in first and "/" in span and span.endswith(PATH_EXTENSIONS)


# `training/checkpoints` is the claim's namespace/name, not a path (training/ is also a directory).
K8S_NAMESPACES = frozenset(ns.name for ns in (*TRAINING_NAMESPACES, KUBERAY))


def _kubernetes_reference(span: str) -> bool:
    namespace, _, name = span.partition("/")
    return namespace in K8S_NAMESPACES and bool(name) and "/" not in name and "." not in name


def _ignored(path: str) -> bool:
    result = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT, check=False)
    return result.returncode == 0


def shown_paths(path: Path) -> list[Shown]:
    top_level = {p.name for p in ROOT.iterdir()}
    name = path.relative_to(ROOT)
    found = []
    for span, number in _code_spans(path.read_text()):
        candidate = re.sub(r"(:\d+(-\d+)?)$", "", span.strip().rstrip(".,;"))
        if _looks_like_repo_path(candidate, top_level):
            found.append(Shown(candidate, f"{name}:{number}"))
    return found


def test_repository_paths_exist() -> None:
    missing = [
        f"{shown.where}: `{shown.text}` does not exist"
        for path in DOCS
        for shown in shown_paths(path)
        if not (ROOT / shown.text).exists() and not _ignored(shown.text) and not _kubernetes_reference(shown.text)
    ]
    assert not missing, "\n".join(missing)


def measured_tables(text: str) -> list[tuple[int, bool]]:
    """(first line number, quotes its run) for each table whose header names measured figures."""
    lines = text.splitlines()
    found = []
    number = 0
    while number < len(lines):
        if lines[number].startswith("|"):
            start = number
            while number < len(lines) and lines[number].startswith("|"):
                number += 1
            if MEASURED_HEADER.search(lines[start]):
                around = [line for line in lines[max(0, start - 3) : start] if line.strip()][-2:]
                around += [line for line in lines[number : number + 3] if line.strip()][:2]
                found.append((start + 1, any(MEASURED_LINE.match(line) for line in around)))
        number += 1
    return found


def test_measured_figures_quote_their_run() -> None:
    unquoted = [
        f"{path.relative_to(ROOT)}:{line}: a table of measured figures without a 'Measured: YYYY-MM-DD on <machine>' "
        "line right above or below it"
        for path in DOCS
        for line, quoted in measured_tables(path.read_text())
        if not quoted
    ]
    assert not unquoted, "\n".join(unquoted)


GUIDE_LIMIT_BYTES = 20_000
README_LIMIT_BYTES = 12_288


def test_guides_stay_short() -> None:
    """A guide is read in minutes: every docs/*.md under 20,000 bytes, README.md under 12 KiB. History belongs in
    commit messages; a guide that grows past its limit is split by topic."""
    limits = {path: README_LIMIT_BYTES if path.name == "README.md" else GUIDE_LIMIT_BYTES for path in DOCS}
    too_long = [
        f"{path.relative_to(ROOT)}: {path.stat().st_size:,} bytes, over {limit:,}"
        for path, limit in limits.items()
        if path.stat().st_size > limit
    ]
    assert not too_long, "\n".join(too_long)


# --- the checks themselves catch what they are for ---------------------------------------------


@pytest.mark.parametrize(
    ("command", "problem"),
    [
        ("trainctl preflight --env prod --regoin R", "unknown flag(s) --regoin"),
        ("trainctl deploy --env dev", "invalid choice: 'deploy'"),
        ("trainctl scale --env prod --group p5", "the following arguments are required: --nodes"),
        ("python -m training.fabric_analyzer --no-such-flag", "unknown flag(s) --no-such-flag"),
    ],
)
def test_a_wrong_command_is_caught(command: str, problem: str) -> None:
    found = check_command(command)
    assert found is not None
    assert problem in found


@pytest.mark.parametrize(
    "command",
    [
        "trainctl pin [--check] [--set NAME=REF@sha256:...] [--profile P]",
        "trainctl logs --env dev (--job ID | --pod NAME | --workers) [--follow] [--fabric]",
        "trainctl scale --env <env> --group GROUP --nodes N",
        "trainctl fabric-check FILE...",
        "python -m training.ray_finetune --help",
    ],
)
def test_synopsis_notation_is_tolerated(command: str) -> None:
    assert check_command(command) is None


def test_measured_table_without_its_run_is_caught() -> None:
    table = "| what | runs | median s |\n|---|---|---|\n| synth | 5 | 7.96 |\n"
    assert measured_tables(f"Some text.\n\n{table}") == [(3, False)]
    assert measured_tables(f"Measured: 2026-11-29 on a 2-core machine.\n\n{table}") == [(3, True)]
    assert measured_tables(f"{table}\nMeasured: 2026-11-29 on a 2-core machine\n") == [(1, True)]
    assert measured_tables("| flag | value |\n|---|---|\n| a | 1 |\n") == []


def test_paths_are_recognized() -> None:
    top = {p.name for p in ROOT.iterdir()}
    assert _looks_like_repo_path("infra/spec/environments.py", top)
    assert _looks_like_repo_path("trainctl/", top)
    assert _looks_like_repo_path("training/nope.py", top)
    assert not _looks_like_repo_path("nvidia.com/gpu", top)
    assert not _looks_like_repo_path("ray-project/kuberay", top)
    assert not _looks_like_repo_path("dist/<env>/", top)
