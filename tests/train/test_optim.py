"""`train/optim.AdamW`: torch's AdamW bit for bit with float32 moments; bf16 moments close to it,
small updates kept; betas a bf16 moment cannot hold are refused; a bf16-moment run resumes exactly."""

from __future__ import annotations

import copy
import os

import pytest
import torch

from genome_lm.cli import main
from genome_lm.errors import GenomeLMError
from genome_lm.train.optim import AdamW
from tests.helpers import write_experiment
from tests.parallel.test_train_parallel import assert_same_curve, records, truncate_to


def _params():
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(33, 17)), torch.nn.Parameter(torch.randn(5))]


def _groups(ps):
    return [{"params": [ps[0]], "weight_decay": 0.1}, {"params": [ps[1]], "weight_decay": 0.0}]


def _steps(opt, ps, n=6, scale=1.0):
    g = torch.Generator().manual_seed(1)
    for _ in range(n):
        for p in ps:
            p.grad = scale * torch.randn(p.shape, generator=g)
        opt.step()
    return [p.detach().clone() for p in ps]


def test_float32_moments_are_torch_adamw_bit_for_bit():
    a, b = _params(), _params()
    ours = _steps(AdamW(_groups(a), lr=3e-3, betas=(0.9, 0.95), eps=1e-8), a)
    ref = _steps(torch.optim.AdamW(_groups(b), lr=3e-3, betas=(0.9, 0.95), eps=1e-8), b)
    for x, y in zip(ours, ref):
        assert torch.equal(x, y)


def test_bf16_moments_follow_float32_and_keep_small_updates():
    a, b, start = _params(), _params(), [p.detach().clone() for p in _params()]
    opt = AdamW(_groups(a), lr=1e-5, betas=(0.9, 0.95), state_dtype=torch.bfloat16)
    ours = _steps(opt, a, n=10)
    ref = _steps(torch.optim.AdamW(_groups(b), lr=1e-5, betas=(0.9, 0.95)), b, n=10)
    assert {s["exp_avg"].dtype for s in opt.state.values()} == {torch.bfloat16}
    for x, y, x0 in zip(ours, ref, start):
        moved, want = x - x0, y - x0  # updates of ~1e-5: far below bf16's spacing, kept in float32
        assert (moved != 0).float().mean() >= (want != 0).float().mean() - 0.01
        assert (moved - want).norm() <= 2e-2 * want.norm()


def test_bf16_moments_refuse_betas_they_cannot_hold():
    with pytest.raises(GenomeLMError, match="optimizer_state_dtype"):
        AdamW(_params(), betas=(0.9, 0.999), state_dtype=torch.bfloat16)


def test_bf16_moment_state_round_trips_through_state_dict():
    a = _params()
    opt = AdamW(_groups(a), lr=3e-3, betas=(0.9, 0.95), state_dtype=torch.bfloat16)
    _steps(opt, a, n=2)
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    opt2 = AdamW(_groups(b), lr=3e-3, betas=(0.9, 0.95), state_dtype=torch.bfloat16)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))
    for x, y in zip(_steps(opt, a, n=2), _steps(opt2, b, n=2)):
        assert torch.equal(x, y)


def test_bf16_model_with_bf16_moments_trains_and_resumes_exactly(tiny_shards, tmp_path):
    """glm53-tiny in bf16 (float32 master weights under FSDP2, DTensor shards) with bf16 moments:
    it learns, and a resume from step 2 reproduces steps 3-4."""
    exp = write_experiment(tmp_path / "e.yaml", tiny_shards, micro_batch=2, model={"dtype": "bfloat16"},
                           train={"optimizer_state_dtype": "bfloat16"})
    os.environ.setdefault("TQDM_DISABLE", "1")
    run = tmp_path / "run"
    assert main(["train", exp, "--out", str(run)]) == 0
    got = records(run)
    assert got[4]["loss"] < got[1]["loss"]
    resumed = truncate_to(run, tmp_path / "resumed", 2)
    assert main(["train", exp, "--out", str(resumed), "--resume"]) == 0
    assert_same_curve(records(resumed), got, range(1, 5))
