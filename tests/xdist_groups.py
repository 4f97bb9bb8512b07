"""The test groups of `--dist loadgroup`, carried from the workers to the scheduler without touching node ids.

pytest-xdist 3.8.0 passes a test's `xdist_group` to its scheduler by appending "@group" to `item._nodeid`; pytest
9.2 keeps node ids structured (`item._id`) and no longer reads that field, so every test silently became its own
work unit: the CDK synth ran once per worker, module fixtures twice (pytest-xdist issue #1386, open; PR #1388
proposes writing the structured id instead). Rewriting ids would also rename tests for syrupy, which reads
`item.nodeid`. So the workers write each test's group to a file the controller named (`pytest_configure_node`),
and the controller's scheduler reads them once every worker has collected: xdist's LoadScopeScheduling with the
group as the scope.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest

WORKER_INPUT_KEY = "test_groups_file"


def groups_dir(config: pytest.Config) -> Path:
    """The controller's directory for the workers' group files, made once per run."""
    found: Path | None = getattr(config, "_test_groups_dir", None)
    if found is None:
        found = Path(tempfile.mkdtemp(prefix="pytest-groups-"))
        config._test_groups_dir = found  # type: ignore[attr-defined]
    return found


def configure_node(node: Any) -> None:
    node.workerinput[WORKER_INPUT_KEY] = str(groups_dir(node.config) / f"{node.gateway.id}.json")


def record(config: pytest.Config, groups: dict[str, str]) -> None:
    """On a worker: writes nodeid -> group where the controller will look."""
    path = getattr(config, "workerinput", {}).get(WORKER_INPUT_KEY)
    if path:
        Path(path).write_text(json.dumps(groups))


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    directory = groups_dir(config)

    class RecordedGroupScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist is untyped here
        """LoadScopeScheduling whose scope is the group a worker recorded (the module where none is)."""

        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                # Read when scheduling starts: after every worker's collection, so after every file was written.
                self._groups = {}
                for path in sorted(directory.glob("*.json")):
                    self._groups.update(json.loads(path.read_text()))
            return self._groups.get(nodeid) or nodeid.split("::", 1)[0]

    return RecordedGroupScheduling(config, log)
