"""Every checkpoint holds the model's weights in `train_state/` (DCP), also without `model/`: what
`--resume` and `genome-lm export` read."""

from __future__ import annotations

import pytest
import torch.distributed.checkpoint as dcp

from genome_lm.config import MemoryConfig, TrainConfig
from genome_lm.parallel.mesh import ParallelContext
from genome_lm.train.checkpoint import CheckpointManager
from genome_lm.train.optim import make_optimizer, make_scheduler
from genome_lm.train.parallelize import parallelize
from tests.helpers import tiny_model


class _Data:
    def __init__(self, index=0):
        self.index = index

    def state_dict(self):
        return {"index": self.index}

    def load_state_dict(self, state):
        self.index = state["index"]


def _setup(seed: int):
    model = parallelize(tiny_model(seed), MemoryConfig())
    cfg = TrainConfig(steps=4, lr=1e-2)
    opt = make_optimizer(model, cfg)
    return model, opt, make_scheduler(opt, cfg)


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_every_checkpoint_has_dcp_weights(tmp_path, mode):
    model, opt, sched = _setup(0)
    manager = CheckpointManager(tmp_path, ParallelContext(), mode=mode, keep=1)
    done = manager.save(1, model, opt, sched, _Data(7), {}, export_model=False, export_dtype=None, wait=True)
    manager.close()
    assert done["checkpoint_written_step"] == 1
    ckpt = tmp_path / "step_00000001"
    stored = dcp.FileSystemReader(str(ckpt / "train_state")).read_metadata().state_dict_metadata
    assert {f"model.{name}" for name in model.state_dict()} <= set(stored)
