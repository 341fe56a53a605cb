import pytest

from tests.eval import data


@pytest.fixture(scope="session")
def eval_inputs(tmp_path_factory):
    return data.eval_inputs(tmp_path_factory)


@pytest.fixture(scope="session")
def evaluated(tmp_path_factory):
    return data.evaluated(tmp_path_factory)
