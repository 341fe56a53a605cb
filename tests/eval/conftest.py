"""Fixtures of tests/eval: the strata genome (a leakage mask) and its evals with the issue-16 flags
(tests/eval/data.py); the `eval_inputs` / `evaluated` fixtures live in tests/conftest.py."""

import pytest


@pytest.fixture(scope="session")
def strata_inputs(tmp_path_factory):
    from tests.eval import data

    return data.strata_inputs(tmp_path_factory.mktemp("strata_inputs"))


@pytest.fixture(scope="session")
def strata_evaluated(eval_inputs, strata_inputs, tmp_path_factory):
    from tests.eval import data

    return data.strata_evaluated(eval_inputs, strata_inputs, tmp_path_factory.mktemp("strata_evals"))
