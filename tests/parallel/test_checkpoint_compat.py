"""Checkpoints written before the model went into DCP (weights only in `model/`) are refused with a
one-line error: every checkpoint this version writes has the model in `train_state/`."""

from __future__ import annotations

import shutil
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp

from genome_lm.config import MemoryConfig, TrainConfig
from genome_lm.errors import GenomeLMError
from genome_lm.train.checkpoint import load_checkpoint, save_checkpoint, train_state
from genome_lm.train.parallelize import parallelize
from genome_lm.train.schedule import make_optimizer, make_scheduler
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


def test_checkpoint_without_dcp_weights_is_refused(tmp_path):
    model, opt, sched = _setup(0)
    ids = torch.randint(0, 5, (1, 40))
    model(ids, labels=ids).loss.backward()
    opt.step()
    sched.step()
    ckpt = save_checkpoint(tmp_path, 1, model, opt, sched, _Data(7), {}, keep=1)
    old = train_state(model, opt, sched, _Data(7), 1)
    del old["model"]  # the layout of older checkpoints
    shutil.rmtree(ckpt / "train_state")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(old, checkpoint_id=str(ckpt / "train_state"))

    fresh, opt2, sched2 = _setup(1)
    with pytest.raises(GenomeLMError, match="holds no model weights .*older version.*model.init"):
        load_checkpoint(ckpt, fresh, opt2, sched2, _Data())


def test_checkpoint_this_version_writes_has_dcp_weights(tmp_path):
    model, opt, sched = _setup(0)
    ckpt = save_checkpoint(tmp_path, 1, model, opt, sched, _Data(7), {}, keep=1, export_model=False)
    stored = dcp.FileSystemReader(str(ckpt / "train_state")).read_metadata().state_dict_metadata
    assert {f"model.{name}" for name in model.state_dict()} <= set(stored)
