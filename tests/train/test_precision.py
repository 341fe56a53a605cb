"""Small updates survive bf16 training: `model.dtype: bfloat16` trains float32 master weights
(FSDP2 on a 1-rank mesh in one process) and computes in bf16. From the same bf16 checkpoint, 10
AdamW steps at lr 1e-5 (weights ~0.02, so one step is far below bf16's resolution of ~1e-4 there):
the bf16 run moves the weights the float32 run moves, and ends close to it.

Measured on glm53-tiny (this test's setting): bf16 moves 100% of the weights the float32 run moves
(bf16 master weights moved 15%); the distance to the float32 weights is 0.13 of the float32 run's
path length (bf16 master weights: 0.95; merely rounding the float32 result to bf16: 2.5).
"""

from __future__ import annotations

import warnings

import torch

from genome_lm.config import load_experiment
from genome_lm.model import build, save_pretrained
from genome_lm.train import train
from tests.helpers import tiny_model, write_experiment

TRACK = 0.3  # ||w_bf16 - w_fp32|| / ||w_fp32 - w_0|| after 10 steps


def master_weights(run) -> dict[str, torch.Tensor]:
    """The weights the optimizer holds at the run's last checkpoint (DCP train_state, float32)."""
    import torch.distributed.checkpoint as dcp

    state_dir = run / "checkpoints" / "last" / "train_state"
    stored = dcp.FileSystemReader(str(state_dir)).read_metadata().state_dict_metadata
    state = {"model": {key.removeprefix("model."): torch.empty(tuple(m.size), dtype=m.properties.dtype)
                       for key, m in stored.items() if key.startswith("model.") and hasattr(m, "size")}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=str(state_dir))
    return state["model"]


def test_small_updates_are_not_lost_in_bf16(tiny_shards, tmp_path):
    init = save_pretrained(tiny_model(dtype="bfloat16"), tmp_path / "init")
    exp = write_experiment(tmp_path / "e.yaml", tiny_shards)
    sets = [f"model.init={init}", "train.lr=1e-5", "train.steps=10", "train.schedule=constant",
            "train.checkpoint_every=10", "train.export_model=false"]
    runs = {}
    for dtype in ("float32", "bfloat16"):
        train(load_experiment(exp, [*sets, f"model.dtype={dtype}"]), out=tmp_path / dtype)
        runs[dtype] = master_weights(tmp_path / dtype)
    start = build(str(init)).model.state_dict()
    moved_fp32 = moved_both = 0
    dist2 = path2 = 0.0
    for name, w0 in start.items():
        w0, f, b = w0.float(), runs["float32"][name], runs["bfloat16"][name]
        assert b.dtype == torch.float32, name  # master weights
        m = f != w0
        moved_fp32 += int(m.sum())
        moved_both += int((m & (b != w0)).sum())
        dist2 += float(((b - f) ** 2).sum())
        path2 += float(((f - w0) ** 2).sum())
    assert moved_fp32 > 0.9 * sum(w.numel() for w in start.values())
    assert moved_both / moved_fp32 >= 0.99
    assert (dist2 / path2) ** 0.5 < TRACK
