"""The suite runs on CPU: CUDA is hidden before torch is imported, so the trainer, meshes and eval
pick the CPU and gloo on a GPU machine as they do here. The `gpu` tier (`make test-gpu`:
GENOME_LM_TEST_GPU=1, `-m gpu`) keeps CUDA visible; its tests skip without a GPU.

Session-scoped fixtures shared by several folders: `tiny_shards` (trainer and distributed tests) and
the eval inputs and outputs of tests/eval and tests/report, with and without the leakage and
annotation strata, the context ablation and both strands (see tests/eval/data.py). `step_callbacks`
installs fault injectors (tests/faults.py) as training and eval step callbacks for one test.
`one_thread` (and `one_thread_everywhere`) is the one place a test sets torch's thread count: for
that test only, restored after it (a module takes it with `pytestmark = pytest.mark.usefixtures`)."""

import os

if os.environ.get("GENOME_LM_TEST_GPU") != "1":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_shards(tmp_path_factory):
    """The synthetic genome at scale 0.05: chr1, chr2 train (with reverse complements), chr22 eval, 4k windows."""
    from tests.helpers import make_shards

    return make_shards(tmp_path_factory.mktemp("tiny_genome"), reverse_complement=True)


@pytest.fixture(scope="session")
def full_shards(tmp_path_factory):
    """The synthetic genome at scale 2, chr1 in 1M-token windows (two full ones, tails of 256k and more):
    shards whose windows a full-size experiment's data.seq_len fits, for its dry run."""
    from tests.helpers import make_shards

    return make_shards(tmp_path_factory.mktemp("full_genome"), scale=2.0, seq_len="1M", min_len="256k",
                       train_chroms="chr1")


@pytest.fixture(scope="session")
def eval_inputs(tmp_path_factory):
    from tests.eval import data

    return data.eval_inputs(tmp_path_factory.mktemp("eval_inputs"))


@pytest.fixture(scope="session")
def evaluated(eval_inputs, tmp_path_factory):
    from tests.eval import data

    return data.evaluated(eval_inputs, tmp_path_factory.mktemp("evals"))


@pytest.fixture(scope="session")
def strata_inputs(tmp_path_factory):
    """The strata genome: segmental duplications, a leakage mask, two BED files (tests/eval/data.py)."""
    from tests.eval import data

    return data.strata_inputs(tmp_path_factory.mktemp("strata_inputs"))


@pytest.fixture(scope="session")
def strata_evaluated(eval_inputs, strata_inputs, tmp_path_factory):
    """Both checkpoints evaluated with every optional analysis (strata, ablation, strands), and their comparison."""
    from tests.eval import data

    return data.strata_evaluated(eval_inputs, strata_inputs, tmp_path_factory.mktemp("strata_evals"))


@pytest.fixture
def one_thread():
    """One torch thread in this process for the test, the count before it restored afterwards: tiny
    matmuls run fastest on one thread and do not fight other processes for cores, and a sum takes
    one order whatever the machine."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture
def one_thread_everywhere(one_thread, monkeypatch):
    """`one_thread`, and one thread in the processes the test launches (OMP_NUM_THREADS=1): a run split
    between a launched worker and this process sums in the same order as one run here."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.fixture
def step_callbacks():
    """`install(*callbacks)` for this test: the training and eval loops (and the workers of a launch
    started from this process) call them after every step; removed afterwards."""
    from genome_lm.parallel import callbacks

    callbacks.clear()
    yield callbacks.install
    callbacks.clear()
