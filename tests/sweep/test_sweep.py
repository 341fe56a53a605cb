"""Every row of the sweep (`cases.py`) as a test: its exit status, its one line naming the file or
field and the fix, no traceback, nothing half-written. Slow (the shared world trains and scores a
tiny model first): `pytest tests/sweep -m slow`."""

from __future__ import annotations

import pytest

from tests.sweep.cases import CASES
from tests.sweep.table import Case, run_case
from tests.sweep.world import World

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    return World.kept(tmp_path_factory.mktemp("sweep"))


@pytest.mark.parametrize("index,case", list(enumerate(CASES)), ids=[c.id for c in CASES])
def test_case(world: World, index: int, case: Case) -> None:
    result = run_case(case, world, index)
    assert not result.problems, f"{case.id}: {result.verdict}\n  exit {result.code}: {result.line}"
