"""What may be rehearsed, decided before anything runs: the kinds, the API server's name rules of every object
(names.py, skipped kinds too), strict validation (validation.py), the support table (support.py), what only the
image has (host.py) and models or data from a hub (scale.py).

`admit` returns the objects to run and the workloads skipped, or raises InputError listing every
problem (exit 2): nothing starts while one is left.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rehearse import network_policy
from rehearse.host import image_only, substitute_commands
from rehearse.names import bad_names
from rehearse.scale import hub_problems, scale_small, substitute
from rehearse.support import INFRA_KINDS, PENDING_KINDS, WORKLOAD_KINDS, unsupported_fields
from rehearse.validation import invalid


class InputError(Exception):
    """Input the rehearsal refuses (exit 2); `problems` are one line each, naming object, field and fix."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


@dataclass(frozen=True)
class Skipped:
    kind: str
    name: str
    reason: str

    def __str__(self) -> str:
        return f"SKIPPED {self.kind}/{self.name}: {self.reason}"


@dataclass
class Admission:
    objects: list[dict[str, Any]]
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", "?"))


def unsupported_kind(kind: str) -> str | None:
    """Why a kind is not run (None: it is run, or accepted as data)."""
    if kind in WORKLOAD_KINDS or kind in INFRA_KINDS:
        return None
    if kind in PENDING_KINDS:
        return f"kind {kind} is not run by the rehearsal: {PENDING_KINDS[kind]}"
    return (
        f"kind {kind} is not run by the rehearsal (it runs {', '.join(WORKLOAD_KINDS)}; "
        "see the support table in docs/rehearsal-support.md)"
    )


def admit(
    objects: Sequence[dict[str, Any]],
    sources: Sequence[str],
    *,
    skip_unsupported: bool = False,
    command_paths: Mapping[str, str] | None = None,
    substitutes: Mapping[str, str] | None = None,
    small_model: Path | None = None,
) -> Admission:
    """The objects to rehearse; InputError with every problem otherwise. With `skip_unsupported` a kind or a
    workload field the rehearsal does not run is skipped (listed) instead of refused; invalid input never is.
    `small_model` (the tiny model's directory) applies `--scale small` to the project's own workloads;
    `command_paths` and `substitutes` replace image-only commands and hub references (each rewrite is noted)."""
    command_paths, substitutes = command_paths or {}, substitutes or {}
    problems: list[str] = []
    skipped: list[Skipped] = []
    kept: list[tuple[dict[str, Any], str]] = []
    for obj, where in zip(objects, sources, strict=True):
        reason = unsupported_kind(str(obj.get("kind")))
        if reason is None:
            kept.append((obj, where))
        elif skip_unsupported:
            skipped.append(Skipped(str(obj.get("kind")), _name(obj), reason))
        else:
            problems.append(
                f"{where}: {obj.get('kind')}/{_name(obj)}: {reason}; fix: leave it out, or pass "
                "--skip-unsupported to rehearse the rest (exit 3: not everything was judged)"
            )
    problems += [str(b) for b in bad_names(objects, sources)]
    problems += [str(i) for i in invalid([o for o, _ in kept], [w for _, w in kept])]
    admitted: list[dict[str, Any]] = []
    for obj, where in kept:
        fields = unsupported_fields(obj) if obj.get("kind") in WORKLOAD_KINDS else []
        if obj.get("kind") == "NetworkPolicy":
            problems += [
                f"{where}: NetworkPolicy/{_name(obj)}: {why}; fix: leave it out to rehearse without it"
                for why in network_policy.unsupported(obj)
            ]
        if fields and skip_unsupported:
            skipped.append(Skipped(str(obj["kind"]), _name(obj), "; ".join(f"{f.path}: {f.reason}" for f in fields)))
            continue
        problems += [
            f"{where}: {f}; fix: remove the field, or pass --skip-unsupported to rehearse the rest" for f in fields
        ]
        admitted.append(obj)
    notes: list[str] = []
    if not problems:
        for obj in admitted:
            if small_model is not None:
                notes += scale_small(obj, small_model)
            notes += substitute(obj, substitutes)
            notes += substitute_commands(obj, command_paths)
            problems += hub_problems(obj, substitutes)
        problems += image_only(admitted, command_paths)
    if problems:
        raise InputError(list(dict.fromkeys(problems)))  # a flag given twice in one script is one problem
    if not any(o.get("kind") in WORKLOAD_KINDS for o in admitted) and not skipped:
        raise InputError(["nothing to rehearse: no Job, RayJob, RayCluster or Deployment in the files"])
    return Admission(objects=admitted, skipped=skipped, notes=notes)
