"""The CUDA RNG state is saved for this process's device alone ([16] bytes, not one row per
visible device), so a checkpoint resumes on a machine with another number of GPUs; a checkpoint
whose state has one row per device restores the row of the current device. CUDA is faked:
the suite runs on CPU."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp

from genome_lm.train import checkpoint as ckpt

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # DCP in one process


class FakeCuda:
    def __init__(self, device: int, n_devices: int):
        self.device, self.n = device, n_devices
        self.states = [torch.full((16,), i, dtype=torch.uint8) for i in range(n_devices)]
        self.set_to = None

    def install(self, monkeypatch):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: self.device)
        monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": self.states[self.device].clone())
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [s.clone() for s in self.states])
        monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device="cuda": setattr(self, "set_to", state))


def _save_load(tmp_path, monkeypatch, saved_rng: dict, loader: FakeCuda) -> torch.Tensor:
    """Save `saved_rng` with DCP, load it as `load_checkpoint` does (`_rng_like`), restore it on `loader`'s device."""
    monkeypatch.undo()  # DCP itself runs on the real (CPU) torch
    dcp.save({"rng": saved_rng}, checkpoint_id=str(tmp_path / "state"))
    stored = dcp.FileSystemReader(str(tmp_path / "state")).read_metadata().state_dict_metadata
    template = {"rng": ckpt._rng_like(stored)}
    dcp.load(template, checkpoint_id=str(tmp_path / "state"))
    loader.install(monkeypatch)
    ckpt._restore_rng(template["rng"])
    return loader.set_to


def test_saved_for_this_device_only(tmp_path, monkeypatch):
    eight = FakeCuda(device=3, n_devices=8)
    eight.install(monkeypatch)
    rng = ckpt._rng_state()
    assert rng["cuda"].shape == (16,) and int(rng["cuda"][0]) == 3
    restored = _save_load(tmp_path, monkeypatch, rng, FakeCuda(device=0, n_devices=1))  # resumed on 1 GPU
    assert torch.equal(restored, rng["cuda"])


def test_earlier_per_device_rows_restore_this_devices_row(tmp_path, monkeypatch):
    old = {"torch": torch.get_rng_state(), "cuda": torch.stack([torch.full((16,), i, dtype=torch.uint8)
                                                                for i in range(4)])}  # written on 4 GPUs
    assert int(_save_load(tmp_path / "a", monkeypatch, old, FakeCuda(device=2, n_devices=8))[0]) == 2
    assert int(_save_load(tmp_path / "b", monkeypatch, old, FakeCuda(device=6, n_devices=8))[0]) == 3  # last row
