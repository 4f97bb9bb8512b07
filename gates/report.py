"""Findings and gate results."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Finding:
    gate: str
    where: str
    message: str

    def __str__(self) -> str:
        return f"[{self.gate}] {self.where}: {self.message}"


class GateError(RuntimeError):
    """A gate could not run at all (missing tool, missing input): distinct from findings."""


@dataclass
class GateResult:
    gate: str
    checked: int
    findings: list[Finding] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.findings
