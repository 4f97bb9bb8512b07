"""tests/training/test_goodput_runs.py takes the NVRx runs by name (`request.getfixturevalue` with the name from
@pytest.mark.parametrize): tests/tiers.py classifies such a test by the fixture the name resolves to."""

from __future__ import annotations

import pytest

from tests import tiers


@pytest.mark.parametrize("fixture", ["nvrx_reference", "tiny_model_dir"])
def test_a_fixture_taken_by_name_classifies_the_test(fixture: str, request: pytest.FixtureRequest) -> None:
    # Not calling the fixture: the marker is what collection decided (an NVRx run is a training process tree,
    # the tiny model a file on disk). The first case never runs in `make test-fast`, the second does.
    marked = request.node.get_closest_marker(tiers.TRAINING) is not None
    assert marked is (fixture == "nvrx_reference")
