"""Shared fixtures of the planner tests: synthetic shards with windows long enough for 16k steps."""

from __future__ import annotations

import pytest

from tests.helpers import make_shards


@pytest.fixture(scope="session")
def long_shards(tmp_path_factory):
    return make_shards(tmp_path_factory.mktemp("plan_genome"), scale=0.1, seq_len="16k", min_len="16k")
